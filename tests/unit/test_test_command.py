"""The README's test command is what CI runs (.ci/run), and its output says why each
skipped test was skipped (pytest's -rs summary, from pyproject's addopts).

Data flow (tests only): README.md / .ci/run / pyproject.toml -> text checks; a throwaway
test file -> pytest in a subprocess under the repository's configuration -> its summary.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _test_command(text: str) -> str:
    return next(line.strip() for line in text.splitlines()
                if line.strip().startswith("pip install") and "pytest" in line)


def test_ci_runs_the_readmes_test_command():
    assert _test_command((ROOT / "README.md").read_text()) == \
        _test_command((ROOT / ".ci" / "run").read_text())


def test_a_skipped_test_says_why(tmp_path):
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.skip(reason='needs a machine this one is not')\n"
        "def test_elsewhere():\n    pass\n")
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:]
    assert "SKIPPED [1]" in res.stdout and "needs a machine this one is not" in res.stdout
