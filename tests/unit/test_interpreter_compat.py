"""The test suite's check of Triton's interpreter against NumPy (tests/interpreter_compat.py):
the broken pair gets a reason naming both versions and the way out; working pairs none."""

import subprocess
import sys
from pathlib import Path

from interpreter_compat import interpreter_problem


def test_triton_36_with_numpy_24_is_refused_with_the_way_out():
    problem = interpreter_problem(triton="3.6.0", numpy="2.4.6")
    assert problem is not None
    assert "3.6.0" in problem and "2.4.6" in problem
    assert "numpy<2.4" in problem and "triton>=3.7" in problem


def test_working_pairs_pass():
    assert interpreter_problem(triton="3.6.0", numpy="2.3.5") is None
    assert interpreter_problem(triton="3.7.0", numpy="2.4.6") is None
    assert interpreter_problem(triton="3.9.0", numpy="2.4.6") is None
    assert interpreter_problem(triton="3.6.0+git1234", numpy="2.4.0rc1") is not None


def test_conftest_stops_an_interpreted_run_with_the_reason(tmp_path):
    """A CPU run (TRITON_INTERPRET=1) on the broken pair ends at start-up with the reason
    (pytest's usage error, exit code 4), not with failures from inside Triton."""
    tests = Path(__file__).resolve().parents[1]
    shim = tmp_path / "sitecustomize.py"  # reports the broken versions to the check
    shim.write_text(
        "import importlib.metadata as m\n"
        "_v = m.version\n"
        "m.version = lambda n: {'triton': '3.6.0', 'numpy': '2.4.6'}.get(n) or _v(n)\n")
    env = {"PYTHONPATH": f"{tmp_path}:{tests}", "TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tests / "unit" / "test_interpreter_compat.py"), "-k", "working"],
                          capture_output=True, text=True, env=env, cwd=tests.parent, timeout=120)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "numpy<2.4" in proc.stdout + proc.stderr
