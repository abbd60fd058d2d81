"""A per-step trace of a run (`--step-trace PATH`): one JSON line per engine step, so a
served run and the engine's closed loop can be compared step by step
(benchmarks/trace_report.py):

    t_ms        the step's start, from the trace's start; ts: the same as Unix time (s),
                to cut a run's window out of a long trace (trace_report.py PATH@START:END)
    gap_ms      host time between the previous step's return and this step's start (the
                caller's work: a server's arrivals, detokenisation and streaming)
    ms          the step's wall time inside Engine.step (planning, launch, commit)
    device_ms   CUDA-event time where known (an overlapped plain step: the step read then;
                a VERIFY step: the target pass)
    catch_up_ms, draft_ms, span_ms    a VERIFY step's draft catch-up, draft proposal, and
                device span from the catch-up to verification's end (CUDA only);
                draft_host_ms: the host's time over the proposal (and the target's layout)
    host_ms     a VERIFY step's host clock (CUDA only), ms from its start: the catch-up's
                launch, verification launched, the sync returned (then commit and outputs);
                plan_ms: how much of it went to planning (the rest before the catch-up's
                launch: committing the step before, laying out the batch)
    mode, batch, tokens, gear    as Engine.last_step
    ks          a VERIFY step's requests by K ({K: requests}), tree width `topk`
    prefill     requests with a prefill chunk in the step, and their tokens; `waits_ms`:
                how long each request whose first chunk this is waited from its arrival at
                the engine to this step's start (behind the step in flight, or a queue)
    generated   tokens the step returned to the caller
    late        graphs the step captured, Triton kernels it compiled and few-row GEMM shapes
                it timed after the warm-up ({"captures": n, "compiles": n, "choices": n};
                only on such steps: runner/serving_watch.py)

Opened after the start-up warm-up; a disabled trace costs one attribute test per step.
Lines reach the file every FLUSH_EVERY steps, whenever the engine runs out of requests
and at exit.
Data flow: Engine.__init__ -> StepTrace(path, spec); StepStats.account -> record(...).
"""

from __future__ import annotations

import atexit
import json
import time
from collections import Counter

from gearshift.forward_batch import ForwardMode
from gearshift.scheduler.plan import StepPlan

FLUSH_EVERY = 256  # lines buffered between writes


class StepTrace:
    def __init__(self, path: str, spec=None, watch=None) -> None:
        self.path = path
        self.watch = watch  # the engine's ServingWatch: what each step captured or compiled
        self._late = watch.counts() if watch is not None else (0, 0, 0)
        # VERIFY steps' draft and span device times (CUDA events; speculative/timing.py)
        self.spec = spec if spec is not None and spec.runner.device.type == "cuda" else None
        if self.spec is not None:
            self.spec.time_verify_steps()
        self._file = open(path, "w")  # noqa: SIM115 - open for the engine's life
        self._lines: list[str] = []
        self._t0 = time.perf_counter()
        self._epoch = time.time() - self._t0  # perf_counter -> Unix time
        self._prev_end: float | None = None
        atexit.register(self.close)

    def record(self, plan: StepPlan, last: dict, generated: int) -> None:
        """`last`: the step's Engine.last_step (time_s, device_ms, gear, ...)."""
        end = time.perf_counter()
        start = end - last["time_s"]
        gap = 0.0 if self._prev_end is None else max(start - self._prev_end, 0.0)
        self._prev_end = end
        rec = {"t_ms": round((start - self._t0) * 1e3, 3), "ts": round(self._epoch + start, 4),
               "gap_ms": round(gap * 1e3, 3),
               "ms": round(last["time_s"] * 1e3, 3), "device_ms": last.get("device_ms"),
               "mode": last["mode"], "batch": plan.batch_size, "tokens": plan.num_tokens,
               "gear": last.get("gear", 0), "generated": generated}
        if plan.mode is ForwardMode.VERIFY:
            rec["ks"] = dict(Counter(plan.draft_lens))
            rec["topk"] = plan.draft_topk
            if self.spec is not None:
                last = dict(self.spec.timing.last)
                if "host" in last:
                    last["host_ms"] = [round((t - start) * 1e3, 3) for t in last.pop("host")]
                rec.update(last)
        chunks = [n for n, dec in zip(plan.extend_lens, plan.decoding) if not dec]
        if chunks:
            rec["prefill"] = {"requests": len(chunks), "tokens": sum(chunks)}
            waits = [round((start - r.arrival_time) * 1e3, 3) for r, p, dec in
                     zip(plan.reqs, plan.prefix_lens, plan.decoding)
                     if not dec and p == r.num_cached_tokens and r.arrival_time
                     and len(r.output_token_ids) == r.num_pending]  # none committed yet
            if waits:
                rec["prefill"]["waits_ms"] = waits
        if self.watch is not None and self.watch.counts() != self._late:
            now = self.watch.counts()
            rec["late"] = {k: b - a for k, a, b in
                           zip(("captures", "compiles", "choices"), self._late, now)}
            self._late = now
        self._lines.append(json.dumps(rec))
        if len(self._lines) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._lines and not self._file.closed:
            self._file.write("\n".join(self._lines) + "\n")
            self._file.flush()
        self._lines = []

    def close(self) -> None:
        self.flush()
        if not self._file.closed:
            self._file.close()
