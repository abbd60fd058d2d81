"""CUDA events around a VERIFY step's device work, for the step trace (`--step-trace`):
the draft's catch-up, its proposal, and the step's span from the catch-up to the end of
verification (the target pass and greedy verification between). The trace's `ms` less
`span_ms` is the step's host time not hidden behind its device work.

Data flow: StepTrace(path, spec) turns it on (CUDA only); SpecRunner.run marks 0..3 and
reads after its one sync; StepTrace.record adds `last` to the VERIFY step's line.
"""

from __future__ import annotations

import torch


class VerifyTiming:
    def __init__(self) -> None:
        self._events: list[torch.cuda.Event] | None = None
        self.last: dict[str, float] = {}  # catch_up_ms, draft_ms, span_ms of the latest step

    def mark(self, i: int) -> None:
        """0: before the catch-up, 1: before the proposal, 2: after it, 3: after
        verification."""
        if i == 0:
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        self._events[i].record()

    def read(self) -> None:
        """After the step's sync (every event has completed)."""
        e, self._events = self._events, None
        self.last = {} if e is None else {
            "catch_up_ms": round(e[0].elapsed_time(e[1]), 3),
            "draft_ms": round(e[1].elapsed_time(e[2]), 3),
            "span_ms": round(e[0].elapsed_time(e[3]), 3)}
