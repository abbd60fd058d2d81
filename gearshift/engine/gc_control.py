"""Python garbage collection around the step loop.

A full (generation 2) collection traverses every tracked object in the process: after
start-up that is the model, the imported libraries and the captured CUDA graphs, ~350k
objects and 60-160 ms per collection, taken at a random step. That is a stall a user sees
and, for the goodput policy, a step time that was not the gear's cost. So:

  * `freeze_heap()` at the end of start-up moves what exists then to the permanent
    generation (`gc.freeze`): later collections only traverse what serving allocates.
    vLLM and SGLang do the same after CUDA-graph capture.
  * `thaw_heap()` at the start of the next engine's start-up, in the same process (tests, a
    notebook, a sweep over configurations): what the first engine froze goes back to the
    collector and is collected, so an engine dropped in a reference cycle frees its device
    memory before the new one measures what is free.
  * `gc_paused()` holds automatic collection off while the start-up warm-up times steps.
  * `GcPauses` (benchmarks) counts the collections and their time inside a timed region.

Data flow: Engine.__init__ -> thaw_heap() -> warm-up (paused) -> freeze_heap(); bench points
-> GcPauses.
"""

from __future__ import annotations

import contextlib
import gc
import time


def freeze_heap() -> int:
    """Collect once, then freeze every surviving object; -> objects frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw_heap() -> bool:
    """Unfreeze and collect, if anything is frozen; -> whether it was."""
    if not gc.get_freeze_count():
        return False
    gc.unfreeze()
    gc.collect()
    return True


@contextlib.contextmanager
def gc_paused():
    """No automatic collection inside the block (restores the previous state after)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class GcPauses:
    """Counts garbage collections (per generation) and their total time while open:

        with GcPauses() as pauses:
            ...
        pauses.as_dict() -> {"gc_collections": [g0, g1, g2], "gc_ms": total}
    """

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.ms = 0.0
        self._t0: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.ms += (time.perf_counter() - self._t0) * 1e3
            self.collections[info["generation"]] += 1
            self._t0 = None

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def as_dict(self) -> dict:
        return {"gc_collections": list(self.collections), "gc_ms": round(self.ms, 3)}
