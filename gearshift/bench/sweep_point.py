"""One point of `gearshift bench sweep`: a closed loop at concurrency c on one engine and its
metrics (output tok/s, time per output token, acceptance, where the time went by step mode
and gear, one-off costs inside the timed run), and a point merged from its passes.

Closed loop: the bench keeps c requests in the engine and adds the next prompt as soon as
one finishes (as c clients of a server would); the engine's queue stays empty.

Data flow: sweep.py -> run_point(engine, prompts, c) -> Engine.step loop -> point dict
-> merge_passes -> sweep JSON.
"""

from __future__ import annotations

import itertools
import statistics
import time

from gearshift.engine.gc_control import GcPauses
from gearshift.policy.static import OffPolicy
from gearshift.request import SamplingParams
from gearshift.runner.jit_log import triton_compiles

SLOWEST = 5  # longest steps kept per run
_ids = itertools.count()


def closed_loop(engine, prompts: list[list[int]], concurrency: int, params_of, on_step=None) -> None:
    """Run every prompt with at most `concurrency` in the engine: a finished request's place
    goes to the next prompt at once. `params_of(i)` gives prompt i's SamplingParams;
    `on_step(outputs)` sees each step's outputs (after the refill)."""
    todo = iter(enumerate(prompts))
    live = 0

    def refill() -> None:
        nonlocal live
        while live < concurrency:
            nxt = next(todo, None)
            if nxt is None:
                return
            engine.add_request(f"p{next(_ids)}", nxt[1], params_of(nxt[0]))
            live += 1

    refill()
    while engine.has_unfinished_requests():
        outs = engine.step()
        live -= sum(o.finished for o in outs)
        refill()
        if on_step is not None:
            on_step(outs)


def temperature_of(temperature, i: int) -> float:
    """Prompt i's temperature: one for all (a number), or per prompt (a callable)."""
    return temperature(i) if callable(temperature) else temperature


def mixed_temperatures(greedy_fraction: float, sampled: float):
    """The mixed workload: prompt i is greedy or sampled at `sampled`, interleaved so that
    every stretch of the closed loop holds `greedy_fraction` greedy requests."""
    def of(i: int) -> float:
        greedy = int((i + 1) * greedy_fraction) > int(i * greedy_fraction)
        return 0.0 if greedy else sampled
    return of


def warm_up(engine, prompts: list[list[int]], concurrency: int, steps: int = 12,
            temperature=0.0) -> None:
    """Untimed: a short closed loop like the timed run's, so what this policy meets at this
    concurrency first (VERIFY / DRAFT graphs captured on first use, kernels specialised for
    new sizes) happens before the timed run, for every policy: c requests and a quarter
    more, of staggered lengths, so later ones are admitted into mixed steps beside
    decoding ones, as in the timed run."""
    n = min(len(prompts), concurrency + max(1, concurrency // 4))
    closed_loop(engine, prompts[:n], concurrency,
                lambda i: SamplingParams(max_tokens=steps - 4 + i % 8,
                                         temperature=temperature_of(temperature, i),
                                         ignore_eos=True))


def run_point(engine, prompts: list[list[int]], concurrency: int, output_len: int,
              temperature=0.0, warm: bool = True) -> dict:
    """`temperature`: of every request, or per prompt index (mixed_temperatures); `warm`:
    run the untimed warm-up loop first."""
    if warm:
        warm_up(engine, prompts, concurrency, temperature=temperature)
    # its prompts are the run's first ones: every point, every policy, starts cold, as a
    # served run after reset_prefix_cache does; so does a proposer that learns from outputs
    # (suffix decoding: it would draft the warm-up's, or another policy's, outputs of the
    # same prompts)
    engine.reset_prefix_cache()
    if engine.spec is not None:
        engine.spec.proposer.reset_cache()
    hits_before = engine.prefix_cache_stats().get("hit_tokens", 0)
    # sampled runs: the sampler (and a VERIFY step's acceptance) as a sampling user meets it
    params = [SamplingParams(max_tokens=output_len, temperature=temperature_of(temperature, i),
                             ignore_eos=True) for i in range(len(prompts))]
    policy = engine.policy or OffPolicy()  # no draft: a policy's counters, never moving
    before = dict(engine.spec.stats) if engine.spec else {}
    keys_before = set(graph_keys(engine))
    switches = policy.switches  # goodput's gear changes
    reused = policy.reused  # and its unscored plans
    predicted = {m: list(v) for m, v in policy.prediction_log.items()}
    steps_before = engine.stats()
    first, last, count = {}, {}, {}
    periods: dict[str, list[float]] = {}  # step mode -> ms from the previous step's return
    device: dict[str, list[float]] = {}  # step mode -> device ms (CUDA events; none on CPU)
    by_gear: dict[str, list] = {}  # VERIFY steps: gear -> [seconds, steps]
    slowest: list[list] = []  # [ms, mode, batch size, tokens] of the longest steps
    most_running = 0
    prev = 0.0
    # steps that ran with all c requests in flight: output tokens, seconds. A finite loop
    # ends below c (no prompt left to admit); requests finishing at different speeds (mixed
    # acceptance, K per request) make that tail longer than a lockstep policy's
    at_c = [0, 0.0]
    full = len(prompts) >= concurrency

    def on_step(outs) -> None:
        nonlocal prev, slowest, most_running, full
        now = time.perf_counter()
        step, ms = engine.last_step, (now - prev) * 1e3
        if full:
            at_c[0] += sum(len(o.new_token_ids) for o in outs)
            at_c[1] += ms / 1e3
        full = engine.num_running() + engine.num_waiting() == concurrency  # the next step's
        most_running = max(most_running, step.get("batch_size") or 0)
        periods.setdefault(step.get("mode", "none"), []).append(ms)
        if step.get("mode") == "verify":  # where VERIFY time goes, by gear (K, tree)
            g = by_gear.setdefault(str(step.get("gear")), [0.0, 0])
            g[0] += ms / 1e3
            g[1] += 1
        if step.get("device_ms"):  # VERIFY: the target forward's; plain: one step late
            device.setdefault(step.get("mode", "none"), []).append(step["device_ms"])
        slowest = sorted([*slowest, [round(ms, 2), step.get("mode"), step.get("batch_size"),
                                     step.get("num_tokens")]], reverse=True)[:SLOWEST]
        prev = now
        for o in outs:
            first.setdefault(o.request_id, now)
            last[o.request_id] = now
            count[o.request_id] = count.get(o.request_id, 0) + len(o.new_token_ids)

    with GcPauses() as pauses, triton_compiles() as compiles:
        started = time.time()  # Unix time: the point's window in a --step-trace file
        t0 = prev = time.perf_counter()
        closed_loop(engine, prompts, concurrency, params.__getitem__, on_step)
        elapsed = time.perf_counter() - t0
    tpot = [(last[r] - first[r]) / (count[r] - 1) * 1e3 for r in count if count[r] > 1]
    new_keys = [k for k in graph_keys(engine) if k not in keys_before]
    stats = engine.spec.stats if engine.spec else {}

    def gained(key: str) -> int:
        return stats.get(key, 0) - before.get(key, 0)

    steps_by_k = {int(k.split(".")[1]): v - before.get(k, 0) for k, v in stats.items()
                  if k.startswith("steps_by_k.") and v > before.get(k, 0)}  # request-steps
    proposed, accepted = gained("proposed"), gained("accepted")
    return {"concurrency": concurrency, "requests": len(prompts),
            "output_tokens": sum(count.values()),
            "output_tok_per_s": sum(count.values()) / elapsed,
            "tpot_ms_median": statistics.median(tpot) if tpot else None, "tpot_ms": tpot,
            "acceptance_rate": accepted / proposed if proposed else None,
            "proposed": proposed, "accepted": accepted, "elapsed_s": elapsed,
            # prompt tokens the prefix cache served (prompts sharing a prefix)
            "prefix_hit_tokens": engine.prefix_cache_stats().get("hit_tokens", 0) - hits_before,
            "window": [round(started, 4), round(started + elapsed, 4)],
            # the loop at concurrency c (its tail apart): tokens and seconds of those steps
            "at_c_tokens": at_c[0], "at_c_s": at_c[1],
            "at_c_tok_per_s": at_c[0] / at_c[1] if at_c[1] else None,
            "max_running": most_running,  # the largest step: c once the loop filled up
            "request_steps_by_k": dict(sorted(steps_by_k.items())),
            "request_steps_tree": gained("tree_steps"),  # of which verified trees
            # on tree request-steps: drafts accepted, and what their top-1 chains alone
            # accepted (tokens per step 1 + x / request_steps_tree: the trees' real gain)
            "tree_accepted": gained("tree_accepted"), "tree_top1_accepted": gained("tree_top1_accepted"),
            # the draft's catch-ups over rows committed at K = 0: rows and ms (inside the
            # VERIFY steps' time, not charged to their gears)
            "catch_up_rows": gained("catch_up_rows"), "catch_up_ms": gained("catch_up_ms"),
            "gear_switches": policy.switches - switches,
            "unscored_plans": policy.reused - reused,
            # where the point's time went, by step mode (host work included): total seconds
            # and median step period, e.g. goodput's VERIFY steps against always-4's
            "step_s_by_mode": {m: sum(v) / 1e3 for m, v in periods.items()},
            # goodput: measured / predicted step time of the steps it observed, by mode
            "cost_model_ratio": _prediction_ratio(policy, predicted),
            "step_ms_median_by_mode": {m: statistics.median(v) for m, v in periods.items()},
            "verify_s_by_gear": by_gear,  # e.g. goodput's tree probes at batch 64
            # the same steps' device time: wall varying where this does not is host time
            "device_ms_median_by_mode": {m: statistics.median(v) for m, v in device.items()},
            "graphs_captured": len(new_keys),
            # one-off costs inside the timed run: Triton compiles (None: not observable), and
            # the longest steps (a stall shows as a step far above its mode's median)
            "triton_compiles": list(compiles) if compiles.available else None,
            "slowest_steps": slowest,
            # which shapes a timed run captured (none, once the warm-ups cover what it meets)
            "graph_keys_captured": [[str(x) for x in k] for k in new_keys],
            **pauses.as_dict(),
            # target VERIFY passes that ran without a graph (none, once warmed up)
            "verify_eager_passes": (engine.stats()["graphs"].get("verify_eager", 0)
                                    - steps_before["graphs"].get("verify_eager", 0)),
            **{f"{m}_steps": engine.stats()[f"{m}_steps"] - steps_before[f"{m}_steps"]
               for m in ("decode", "verify", "extend")}}


def graph_keys(engine) -> list:
    return list(getattr(engine.runner.shape_graphs, "entries", ()))


def _prediction_ratio(policy, before: dict) -> dict:
    """{mode: [measured / predicted ms, steps]} over the steps a cost-modelling policy
    observed since `before` (its prediction_log then); {} for other policies."""
    out = {}
    for mode, (ms, pred, n) in policy.prediction_log.items():
        ms0, pred0, n0 = before.get(mode, (0.0, 0.0, 0))
        if n > n0 and pred > pred0:
            out[mode] = [round((ms - ms0) / (pred - pred0), 4), n - n0]
    return out


def merge_passes(parts: list[dict]) -> dict:
    """One point from its passes: sums (tokens, time, steps, drafts, collections), tok/s
    over the summed time, the median time per output token over every request."""
    out = {"concurrency": parts[0]["concurrency"]}
    for key in ("requests", "output_tokens", "elapsed_s", "proposed", "accepted", "gc_ms",
                "graphs_captured", "decode_steps", "verify_steps", "extend_steps",
                "request_steps_tree", "tree_accepted", "tree_top1_accepted", "gear_switches",
                "unscored_plans", "catch_up_rows", "catch_up_ms", "verify_eager_passes"):
        out[key] = sum(p[key] for p in parts)
    out["prefix_hit_tokens"] = sum(p.get("prefix_hit_tokens", 0) for p in parts)
    out["output_tok_per_s"] = out["output_tokens"] / out["elapsed_s"]
    if all("at_c_s" in p for p in parts):
        out["at_c_tokens"], out["at_c_s"] = (sum(p[k] for p in parts) for k in ("at_c_tokens", "at_c_s"))
        out["at_c_tok_per_s"] = out["at_c_tokens"] / out["at_c_s"] if out["at_c_s"] else None
    out["pass_tok_per_s"] = [round(p["output_tok_per_s"], 1) for p in parts]
    out["windows"] = [p["window"] for p in parts if "window" in p]  # Unix time, per pass
    out["max_running"] = max(p.get("max_running", 0) for p in parts)
    tpot = [t for p in parts for t in p["tpot_ms"]]
    out["tpot_ms_median"] = statistics.median(tpot) if tpot else None
    out["acceptance_rate"] = out["accepted"] / out["proposed"] if out["proposed"] else None
    steps: dict[int, int] = {}
    for p in parts:
        for k, v in p["request_steps_by_k"].items():
            steps[k] = steps.get(k, 0) + v
    out["request_steps_by_k"] = dict(sorted(steps.items()))
    modes = {m for p in parts for m in p.get("step_s_by_mode", {})}
    out["step_s_by_mode"] = {m: sum(p["step_s_by_mode"].get(m, 0.0) for p in parts)
                             for m in sorted(modes)}
    out["cost_model_ratio"] = [p.get("cost_model_ratio", {}) for p in parts]  # one per pass
    gears: dict[str, list] = {}
    for p in parts:
        for g, (sec, n) in p.get("verify_s_by_gear", {}).items():
            acc = gears.setdefault(g, [0.0, 0])
            acc[0] += sec
            acc[1] += n
    out["verify_s_by_gear"] = dict(sorted(gears.items()))
    out["graph_keys_captured"] = [k for p in parts for k in p.get("graph_keys_captured", [])]
    out["triton_compiles"] = [p.get("triton_compiles") for p in parts]  # one list per pass
    out["slowest_steps"] = [p.get("slowest_steps", []) for p in parts]
    for key in ("step_ms_median_by_mode", "device_ms_median_by_mode"):  # a median per pass
        out[key] = {m: [p[key][m] for p in parts if m in p.get(key, {})]
                    for m in sorted({m for p in parts for m in p.get(key, {})})}
    out["gc_collections"] = [sum(g) for g in zip(*(p["gc_collections"] for p in parts))]
    return out
