"""CUDA events around a VERIFY step's device work, for the step trace (`--step-trace`):
the draft's catch-up, its proposal, and the step's span from the catch-up to the end of
verification (the target pass and greedy verification between), and the host time that
planned the step (schedule(), the policy's K included). The trace's `ms` less
`span_ms` is the step's host time not hidden behind its device work; the host's clock at
mark 0, mark 3 and the sync says where that time goes (before the catch-up is launched,
launching the step, or between verification and the sync, which includes waiting for the
device).

Data flow: StepTrace(path, spec) turns it on (CUDA only); SpecRunner.run marks 0..3 and
reads after its one sync; StepTrace.record adds `last` to the VERIFY step's line.
"""

from __future__ import annotations

import time

import torch


class VerifyTiming:
    def __init__(self) -> None:
        self._events: list[torch.cuda.Event] | None = None
        self._host: list[float] = []  # perf_counter at marks 0..3
        self._planning_ms = 0.0
        self.last: dict = {}  # catch_up_ms, draft_ms, span_ms, host of the latest step

    def mark(self, i: int, planning_s: float = 0.0) -> None:
        """0: before the catch-up (`planning_s`: the host time that planned the step), 1:
        before the proposal, 2: after it, 3: after verification."""
        if i == 0:
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            self._host = []
            self._planning_ms = planning_s * 1e3
        self._events[i].record()
        self._host.append(time.perf_counter())

    def read(self) -> None:
        """After the step's sync (every event has completed). `host`: perf_counter at mark 0,
        mark 3 and now (StepTrace makes them relative to the step's start); `draft_host_ms`:
        the host's time from mark 1 to mark 2 (the proposal and the target's layout), against
        the device's `draft_ms`: where it is as long, the device waited on the host."""
        e, self._events, h = self._events, None, self._host
        self.last = {} if e is None else {
            "catch_up_ms": round(e[0].elapsed_time(e[1]), 3),
            "draft_ms": round(e[1].elapsed_time(e[2]), 3),
            "draft_host_ms": round((h[2] - h[1]) * 1e3, 3),
            "span_ms": round(e[0].elapsed_time(e[3]), 3),
            "plan_ms": round(self._planning_ms, 3),
            "host": [h[0], h[3], time.perf_counter()]}
