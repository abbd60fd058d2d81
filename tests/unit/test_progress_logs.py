"""gearshift's logger reports at INFO out of the box (Python API and CLI alike), leaves an
application's own logging set-up alone, and start-up bars show only where INFO shows and
stderr is a terminal.

Data flow (tests only): import gearshift (subprocess) -> logger state; progress() ->
tqdm on a fake terminal.
"""

from __future__ import annotations

import io
import logging
import subprocess
import sys

from gearshift.logs import set_log_level
from gearshift.progress import progress


def _python(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip() + "|" + res.stderr.strip()


def test_info_by_default_to_stderr():
    out = _python("import logging, gearshift\n"
                  "log = logging.getLogger('gearshift')\n"
                  "print(log.level, len(log.handlers), log.propagate)\n"
                  "logging.getLogger('gearshift.runner').info('loaded in 1.0 s')")
    stdout, stderr = out.split("|")
    assert stdout == f"{logging.INFO} 1 False"
    assert stderr.startswith("INFO ") and stderr.endswith("[gearshift.runner] loaded in 1.0 s")


def test_an_application_set_up_is_kept():
    out = _python("import logging\n"
                  "log = logging.getLogger('gearshift')\n"
                  "log.addHandler(logging.NullHandler())\n"
                  "import gearshift\n"
                  "print(log.level, len(log.handlers), log.propagate)")
    assert out.split("|")[0] == f"{logging.NOTSET} 1 True"


def test_set_log_level():
    set_log_level("debug")
    assert logging.getLogger("gearshift").level == logging.DEBUG


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_follow_the_log_level_and_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Terminal())
    logging.getLogger("gearshift").setLevel(logging.WARNING)
    assert progress(range(3), desc="quiet").disable
    logging.getLogger("gearshift").setLevel(logging.INFO)
    bar = progress(desc="loading weights", total=3, unit="tensor")
    assert not bar.disable
    bar.update(3)
    bar.close()
    assert "loading weights" in sys.stderr.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file: no bar
    assert progress(range(3), desc="to a file").disable
