"""The `gearshift` logger: INFO to stderr by default, so that start-up phases (loading
weights, capturing CUDA graphs, the speculation warm-up) report their progress and time
in the Python API as on the command line, as vLLM users expect of their engine.

Configured once, when `gearshift` is imported, unless the application gave the logger a
handler first. Its records do not propagate to the root logger (a root handler would print
them twice); `logging.getLogger("gearshift").setLevel(logging.WARNING)` quiets it, and the
CLI's --log-level sets it.

Data flow: import gearshift -> configure_default(); cli.main -> set_log_level(--log-level).
"""

from __future__ import annotations

import logging
import sys

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMAT = "%(levelname)s %(asctime)s [%(name)s] %(message)s"
DATE_FORMAT = "%m-%d %H:%M:%S"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (notebooks and pytest replace it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_default() -> None:
    """INFO to stderr for the `gearshift` logger, unless it has a handler already."""
    logger = logging.getLogger("gearshift")
    if logger.handlers:
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def set_log_level(level: str) -> None:
    """`level` for gearshift's messages; other libraries' messages from WARNING (or `level`,
    when higher) through the root logger."""
    value = logging.getLevelName(level.upper())
    if not isinstance(value, int):
        raise ValueError(f"unknown log level {level!r} (one of {', '.join(LEVELS)})")
    logging.getLogger("gearshift").setLevel(value)
    logging.basicConfig(level=max(value, logging.WARNING), format=FORMAT, datefmt=DATE_FORMAT)
