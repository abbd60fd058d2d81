"""One-off costs met while serving: a CUDA graph the start-up warm-up did not capture, a
Triton kernel compiled for a specialisation it did not meet, or a few-row GEMM shape the
chooser had not timed (kernels/skinny_select.py). Each stalls the step that meets it for
tens to hundreds of milliseconds, and every request in flight waits. After the warm-up each
one is logged (WARNING, naming the shape or kernel) and counted: Engine.stats()["late"]
(and so /metrics), and the step trace marks the step. The stats also count the device
memory segments the caching allocator took since (cudaMalloc: a larger batch than any
before, say) and its retries (the device full: every cached block freed, then the
allocation again), read when asked, not per step.

Triton has one post-compile hook per process: the watch chains one in and it reports to the
engine that started watching last (one engine a process when serving; tensor-parallel ranks
are processes).

Data flow: Engine.__init__ (after the warm-up) -> ServingWatch.start(runner);
GraphCache.run -> captured(key, ms); Triton's jit_post_compile_hook -> compiled(name);
SkinnyChooser.choose -> chose(key, ms).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

log = logging.getLogger("gearshift.runner")

_ACTIVE: ServingWatch | None = None  # the watch Triton's compiles are reported to
_HOOK = None  # our hook, while it is Triton's
_IN_HOOK = False  # inside our hook: a copy of it further down the chain does not count again


class ServingWatch:
    def __init__(self) -> None:
        self.graph_captures = 0
        self.capture_ms = 0.0
        self.triton_compiles = 0
        self.gemm_choices = 0
        self.choice_ms = 0.0
        self.watching = False
        self._device = None  # CUDA: the allocator's segments are counted from start()
        self._allocator = (0, 0)  # (segments taken, retries) when watching started

    def start(self, runner=None) -> ServingWatch:
        """From now on (the warm-up is over), count and log what a step captures or
        compiles; `runner`: its lazily captured graphs report here."""
        global _ACTIVE
        self.watching = True
        if runner is not None and runner.shape_graphs is not None:
            runner.shape_graphs.watch = self
        if runner is not None and runner.device.type == "cuda":
            from gearshift.kernels.skinny_select import CHOOSER

            CHOOSER.watch = self
            self._device = runner.device
            self._allocator = allocator_counts(self._device)
        _ACTIVE = self
        _hook_triton()
        return self

    @contextmanager
    def paused(self):
        """Count nothing inside (a warm-up run after start(), as a bench's sweep runs one);
        the allocator's counts start again from its end."""
        was, self.watching = self.watching, False
        try:
            yield self
        finally:
            self.watching = was
            if self._device is not None:
                self._allocator = allocator_counts(self._device)

    def captured(self, key: tuple, ms: float) -> None:
        if self.watching:
            self.graph_captures += 1
            self.capture_ms += ms
            log.warning("captured a CUDA graph while serving (%.0f ms; the warm-up did not "
                        "capture this shape): %s", ms, key)

    def compiled(self, name: str) -> None:
        if self.watching:
            self.triton_compiles += 1
            log.warning("compiled Triton kernel %s while serving (the warm-up did not meet "
                        "this specialisation)", name)

    def chose(self, key: tuple, ms: float) -> None:
        """The GEMM chooser timed a (row bucket, N, K, dtype, bias, kind) it had not met."""
        if self.watching:
            self.gemm_choices += 1
            self.choice_ms += ms
            log.warning("timed GEMM candidates while serving (%.0f ms; the warm-up did not "
                        "run this few-row shape): rows %s, N %s, K %s, %s", ms, *key[:3], key[-1])

    def stats(self) -> dict:
        out = {"graph_captures": self.graph_captures, "capture_ms": round(self.capture_ms, 1),
               "triton_compiles": self.triton_compiles, "gemm_choices": self.gemm_choices,
               "gemm_choice_ms": round(self.choice_ms, 1)}
        if self._device is not None:
            segments, retries = allocator_counts(self._device)
            out["device_mallocs"] = segments - self._allocator[0]
            out["alloc_retries"] = retries - self._allocator[1]
        return out

    def counts(self) -> tuple[int, int, int]:
        """(graph captures, Triton compiles, GEMM choices) so far: the step trace's
        per-step deltas."""
        return self.graph_captures, self.triton_compiles, self.gemm_choices


def allocator_counts(device) -> tuple[int, int]:
    """The caching allocator's counts so far: segments taken from the device (cudaMalloc
    calls), and allocations retried after freeing every cached block (the device was full:
    each retry synchronises and frees, a stall of its own)."""
    import torch

    stats = torch.cuda.memory_stats(device)
    return int(stats.get("segment.all.allocated", 0)), int(stats.get("num_alloc_retries", 0))


def _hook_triton() -> None:
    """Chain a post-compile hook into Triton's unless ours is in place (nothing without
    Triton). A bench's triton_compiles() block restores the hook it found on exit: a watch
    started inside one puts ours back at its next start."""
    global _HOOK
    try:
        import triton.knobs as knobs
        runtime = knobs.runtime
        prev = runtime.jit_post_compile_hook
    except (ImportError, AttributeError):
        return
    if prev is not None and prev is _HOOK:
        return

    def hook(**kw):
        global _IN_HOOK
        if _ACTIVE is not None and not _IN_HOOK:
            _ACTIVE.compiled(getattr(kw.get("fn"), "name", "?"))
        outer, _IN_HOOK = _IN_HOOK, True
        try:
            return prev(**kw) if prev is not None else None
        finally:
            _IN_HOOK = outer

    runtime.jit_post_compile_hook = _HOOK = hook
