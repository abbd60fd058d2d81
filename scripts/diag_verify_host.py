"""Where a VERIFY step's wall time goes on the GPU: host phases and the device's idle time.

The sweeps show VERIFY steps of ~7.5 ms wall against ~4.7 ms of target-forward device time
at batch 1 (8B bench pair), and their median wall period varying by 10% from pass to pass
while device time does not. This script runs closed loops of c requests per (policy, c) on
the bench pair (the sweep's engine: one tree-capable engine, every policy on it) and
reports per VERIFY step:

* inclusive host time of each phase (perf_counter around the methods below; nested phases
  are inside their parents: `stage` inside `chain_batch`, `forward_all` launches graphs);
* `sync_wait`: time inside Tensor.tolist (the step's one sync: the device still running);
* with --trace: from torch.profiler over a few steps, the device's busy time (union of
  kernel and memcpy intervals) against the wall, and the longest idle gaps.

    python scripts/diag_verify_host.py --model /tmp/big --draft-model /tmp/bighead \
        --points always-4:1,goodput:1,always-4:8,goodput:8 --out diag.json [--trace]
        [--rounds 3]   (JSON: per point, one result per round, `run` = its place in the run)
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

PHASES = defaultdict(float)  # phase -> seconds in the current step
CALLS = defaultdict(int)


def timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            with torch.profiler.record_function(name):  # a range in --trace's timeline
                return fn(*a, **k)
        finally:
            PHASES[name] += time.perf_counter() - t0
            CALLS[name] += 1
    return wrapper


def install(eng) -> None:
    from gearshift.runner.batch import Stager

    spec = eng.spec
    for obj, names in ((eng.scheduler, ["schedule", "commit_spec", "prepare_next"]),
                       (eng, ["step", "_resolve_pending", "_account", "_observe"]),
                       (spec, ["verify_step", "_chain_verify_batch", "_tree_verify_batch",
                               "_verify_greedy", "_account"]),
                       (spec.follow, ["catch_up", "extend", "store"]),
                       (spec.proposer, ["propose"]), (eng.runner, ["forward_all"]),
                       *([(eng.runner.shape_graphs, ["run"])] if eng.runner.shape_graphs else [])):
        for n in names:
            label = f"{type(obj).__name__}.{n}"
            setattr(obj, n, timed(label, getattr(obj, n)))
    Stager.to_device = timed("Stager.to_device", Stager.to_device)
    torch.Tensor.tolist = timed("Tensor.tolist (sync)", torch.Tensor.tolist)


def run_point(eng, policy, prompts, c: int, steps_cap: int) -> dict:
    from gearshift import SamplingParams

    eng.scheduler.policy = policy
    eng.scheduler.max_num_seqs = c
    for i, p in enumerate(prompts[: 2 * c]):
        eng.add_request(f"d{time.monotonic_ns()}-{i}", p,
                        SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True))
    per_step, walls, devs = defaultdict(list), [], []
    by_gear = defaultdict(lambda: defaultdict(list))  # gear -> phase -> ms per step
    n = 0
    while eng.has_unfinished_requests():
        PHASES.clear()
        t0 = time.perf_counter()
        eng.step()
        dt = time.perf_counter() - t0
        if eng.last_step.get("mode") != "verify" or n >= steps_cap:
            continue
        n += 1
        walls.append(dt * 1e3)
        devs.append(eng.last_step.get("device_ms") or 0.0)
        gear = str(eng.last_step.get("gear"))
        by_gear[gear]["wall"].append(dt * 1e3)
        for k, v in PHASES.items():
            per_step[k].append(v * 1e3)
            by_gear[gear][k].append(v * 1e3)
    if not walls:
        return {}
    gears = {g: {"steps": len(ph["wall"]), **{k: round(statistics.median(v), 3)
                                              for k, v in sorted(ph.items())}}
             for g, ph in by_gear.items()}
    med = {k: round(statistics.median(v + [0.0] * (len(walls) - len(v))), 3)
           for k, v in per_step.items()}
    return {"verify_steps": len(walls), "wall_ms_median": statistics.median(walls),
            "target_device_ms_median": statistics.median(devs),
            "phase_ms_median": dict(sorted(med.items(), key=lambda kv: -kv[1])),
            "by_gear": gears}


def trace_point(eng, policy, prompts, c: int, steps: int, path: str) -> dict:
    """torch.profiler over `steps` VERIFY-heavy engine steps: device busy vs wall."""
    from torch.profiler import ProfilerActivity, profile

    from gearshift import SamplingParams

    eng.scheduler.policy = policy
    eng.scheduler.max_num_seqs = c
    for i, p in enumerate(prompts[:c]):
        eng.add_request(f"t{time.monotonic_ns()}-{i}", p,
                        SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
    for _ in range(20):  # past the prefill
        eng.step()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    acts = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])]
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.step()
        sync()
        wall = time.perf_counter() - t0
    while eng.has_unfinished_requests():
        eng.step()
    prof.export_chrome_trace(path)
    ev = json.load(open(path))["traceEvents"]
    dev = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev
                 if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)
    busy, gaps, end = 0.0, [], None
    for s, e in dev:
        if end is None or s > end:
            if end is not None:
                gaps.append(s - end)
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    span = (dev[-1][1] - dev[0][0]) if dev else 0.0
    ranges = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in ev
              if e.get("cat") == "user_annotation" and "dur" in e]
    exposed = _attribute(_gap_intervals(dev), ranges)
    return {"steps": steps, "wall_ms_per_step": wall * 1e3 / steps,
            "device_busy_ms_per_step": busy / 1e3 / steps,
            "device_span_ms_per_step": span / 1e3 / steps,
            "idle_gaps_us_top": sorted((round(g, 1) for g in gaps), reverse=True)[:20],
            "idle_gaps_over_50us": sum(1 for g in gaps if g > 50) / steps,
            "idle_ms_per_step": sum(gaps) / 1e3 / steps,
            # idle device time by the host phase running then (the innermost range)
            "idle_us_per_step_by_phase": {k: round(v / steps, 1) for k, v in sorted(
                exposed.items(), key=lambda kv: -kv[1])}}


def _gap_intervals(dev: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, end = [], None
    for s, e in dev:
        if end is not None and s > end:
            out.append((end, s))
        end = e if end is None else max(end, e)
    return out


def _attribute(gaps, ranges) -> dict[str, float]:
    """µs of each gap under each host range, to the innermost (shortest) covering range."""
    out: dict[str, float] = defaultdict(float)
    for g0, g1 in gaps:
        inside = [r for r in ranges if r[0] < g1 and r[1] > g0]
        cuts = sorted({g0, g1, *(x for r in inside for x in r[:2] if g0 < x < g1)})
        for a, b in zip(cuts, cuts[1:]):
            cover = [r for r in inside if r[0] <= a and r[1] >= b]
            name = min(cover, key=lambda r: r[1] - r[0])[2] if cover else "(outside a step)"
            out[name] += b - a
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--draft-model", required=True)
    p.add_argument("--points", default="always-4:1,goodput:1,tree:1,always-4:8,goodput:8")
    p.add_argument("--steps", type=int, default=200, help="VERIFY steps timed per point")
    p.add_argument("--trace", action="store_true")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the points this many times, every other round in reverse order "
                        "(separates a policy's cost from its place in the run)")
    p.add_argument("--out", default="diag_verify_host.json")
    args = p.parse_args()
    from gearshift import LLM
    from gearshift.bench.sweep import _warm_up, make_prompts, policy_object

    llm = LLM(args.model, draft_model=args.draft_model, speculative_algorithm="eagle3",
              num_draft_tokens=4, draft_topk=4, num_verify_tokens=16, spec_policy="off",
              max_num_seqs=32)
    eng = llm.engine
    warm_s = _warm_up(eng)
    points = [(x.split(":")[0], int(x.split(":")[1])) for x in args.points.split(",")]
    prompts = make_prompts(llm.tokenizer, eng.model_config.vocab_size, 64, 128, 0)
    policies = {name: policy_object(name, eng, 4) for name in {n for n, _ in points}}
    out = {"warmup_s": warm_s, "points": {}}
    for name, c in points:  # once untimed each (graphs, compiles)
        run_point(eng, policies[name], prompts, c, 0)
    install_once(eng)
    order = [pt for rnd in range(args.rounds) for pt in (points if rnd % 2 == 0 else points[::-1])]
    for i, (name, c) in enumerate(order):
        r = dict(run_point(eng, policies[name], prompts, c, args.steps), run=i)
        out["points"].setdefault(f"{name}:{c}", []).append(r)
        print(name, c, json.dumps(r), flush=True)
        if args.trace:
            with tempfile.TemporaryDirectory() as tmp:
                r["trace"] = trace_point(eng, policies[name], prompts, c, 30,
                                         str(Path(tmp) / "trace.json"))
            print("  trace", json.dumps(r["trace"]), flush=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


_INSTALLED = []


def install_once(eng) -> None:
    if not _INSTALLED:
        install(eng)
        _INSTALLED.append(True)


if __name__ == "__main__":
    raise SystemExit(main())
