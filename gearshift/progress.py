"""Start-up progress: a bar while a slow phase runs (loading weights, capturing CUDA
graphs, the speculation warm-up); the phase then logs one INFO line with its time, which
replaces the bar.

Bars follow the `gearshift` logger (gearshift/logs.py): shown when it shows INFO (its
default) and stderr is a terminal, so a log file or a quiet logger gets no bar.

Data flow: ModelRunner (weights, graphs), engine/warmup.py -> progress(...) -> tqdm on stderr.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from tqdm.auto import tqdm

_log = logging.getLogger("gearshift")


def progress(iterable: Iterable | None = None, *, desc: str, total: int | None = None,
             unit: str = "it") -> tqdm:
    """A tqdm bar over `iterable` (or of `total` steps, advanced with .update) that clears
    itself when done; disabled unless gearshift logs INFO and stderr is a terminal."""
    shown = _log.isEnabledFor(logging.INFO)
    return tqdm(iterable, desc=desc, total=total, unit=unit, leave=False,
                disable=None if shown else True, dynamic_ncols=True)
