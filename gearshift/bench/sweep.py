"""`gearshift bench sweep`: output throughput and time per output token against
concurrency (1, 2, 4, ... 256) for each speculation policy, on one target + draft pair:

    off | always K=2 | always K=4 | tree | threshold (SGLang-like: off at >= 64)
        | threshold-vllm (K=3 <= 64, K=1 <= 128, off above) | goodput (default)

Concurrency c = at most c requests running: a pass is a closed loop over c * rounds requests
(each of the c slots serves `rounds` (2) requests in turn; at least min_requests / passes),
and a point runs `passes` (2) of them. Every policy runs on one
engine (max K = 4; tree width --tree-topk, --tree-tokens nodes): chain policies plan
chains, `tree` plans the tree, goodput picks among both. Policies are interleaved: for
each c, pass 1 runs every policy in turn, pass 2 runs them in reverse order on the next
prompts, so drift over the run (clocks, heap) falls on every policy alike; the first
policy rotates from one c to the next. A point sums its passes, and `pass_tok_per_s`
shows their spread. Prompts are held-out corpus windows (real acceptance) or
synthetic ids. Prints a table, writes JSON and a PNG plot,
and reports the measured acceptance and the garbage collections inside each point.

Data flow: args -> LLM engines -> per (policy, c): Engine.step loop -> metrics -> JSON/PNG.
"""

from __future__ import annotations

import json
import logging
import statistics
import time

import torch
from tqdm.auto import tqdm

from gearshift.engine.gc_control import GcPauses, freeze_heap
from gearshift.request import SamplingParams
from gearshift.runner.jit_log import triton_compiles

log = logging.getLogger("gearshift.bench")

SLOWEST = 5  # longest steps kept per run

CHAIN_POLICIES = ("goodput", "off", "always-2", "always-4", "threshold", "threshold-vllm")


def make_prompts(tokenizer, vocab: int, n: int, input_len: int, seed: int) -> list[list[int]]:
    if tokenizer is not None:
        try:
            from gearshift.train.corpus import load_texts

            texts = load_texts("heldout")
            docs = [tokenizer.encode(t) for t in texts if len(t) > 4 * input_len]
            # distinct prompts: window w of every document, then window w + 1, ... (the
            # held-out split has few documents long enough; repeating them would correlate
            # the requests of a point)
            windows = [d[w * input_len:(w + 1) * input_len] for w in range(64) for d in docs
                       if len(d) >= (w + 1) * input_len]
            if windows:
                return [windows[i % len(windows)] for i in range(n)]
        except Exception as e:  # noqa: BLE001 (any corpus problem: fall back to synthetic prompts)
            log.warning("held-out corpus prompts unavailable (%s): using random token ids", e)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n, input_len), generator=g).tolist()


def policy_object(name: str, engine, k_max: int):
    """Chain policies plan chains (topk 1) on a tree-capable engine too; `tree` plans the
    engine's tree; goodput chooses."""
    from gearshift.policy.goodput import GoodputPolicy
    from gearshift.policy.profile import build_cost_model
    from gearshift.policy.static import AlwaysPolicy, OffPolicy
    from gearshift.policy.threshold import SGLANG_LIKE, VLLM_LIKE, ThresholdPolicy

    if name == "off":
        return OffPolicy()
    if name.startswith("always-"):
        return AlwaysPolicy(int(name.split("-")[1]), topk=1)
    if name == "tree":
        return AlwaysPolicy(k_max)
    if name == "threshold":
        return ThresholdPolicy(SGLANG_LIKE, k_max, topk=1)
    if name == "threshold-vllm":
        return ThresholdPolicy(VLLM_LIKE, k_max, topk=1)
    from gearshift.speculative.warmup import apply_measured

    cost = build_cost_model(engine.runner, k_max, engine.config.max_num_seqs,
                            engine.spec.draft_frac, engine.spec.tree_nodes)
    policy = GoodputPolicy(cost, k_max, pad=engine.runner.decode_pad)
    apply_measured(policy, engine.spec.measured_costs)
    return policy


def warm_up(engine, prompts: list[list[int]], concurrency: int, steps: int = 12) -> None:
    """Untimed: a short closed loop like the timed run's, so what this policy meets at this
    concurrency first (VERIFY / DRAFT graphs captured on first use, kernels specialised for
    new sizes) happens before the timed run, for every policy: c requests and a quarter
    more, of staggered lengths, so later ones are admitted into mixed steps beside
    decoding ones, as in the timed run."""
    engine.scheduler.max_num_seqs = concurrency
    n = min(len(prompts), concurrency + max(1, concurrency // 4))
    for i, p in enumerate(prompts[:n]):
        params = SamplingParams(max_tokens=steps - 4 + i % 8, temperature=0.0, ignore_eos=True)
        engine.add_request(f"w{i}", p, params)
    while engine.has_unfinished_requests():
        engine.step()


def run_point(engine, prompts: list[list[int]], concurrency: int, output_len: int) -> dict:
    warm_up(engine, prompts, concurrency)
    engine.scheduler.max_num_seqs = concurrency
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    before = dict(engine.spec.stats) if engine.spec else {}
    keys_before = set(_graph_keys(engine))
    switches = getattr(engine.scheduler.policy, "switches", 0)  # goodput's gear changes
    reused = getattr(engine.scheduler.policy, "reused", 0)  # and its unscored plans
    predicted = {m: list(v) for m, v in getattr(engine.scheduler.policy, "prediction_log",
                                                  {}).items()}
    steps_before = engine.stats()
    first, last, count = {}, {}, {}
    for i, p in enumerate(prompts):
        engine.add_request(f"s{i}", p, params)
    periods: dict[str, list[float]] = {}  # step mode -> ms from the previous step's return
    device: dict[str, list[float]] = {}  # step mode -> device ms (CUDA events; none on CPU)
    by_gear: dict[str, list] = {}  # VERIFY steps: gear -> [seconds, steps]
    slowest: list[list] = []  # [ms, mode, batch size, tokens] of the longest steps
    with GcPauses() as pauses, triton_compiles() as compiles:
        t0 = prev = time.perf_counter()
        while engine.has_unfinished_requests():
            outs = engine.step()
            now = time.perf_counter()
            step, ms = engine.last_step, (now - prev) * 1e3
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
        elapsed = time.perf_counter() - t0
    tpot = [(last[r] - first[r]) / (count[r] - 1) * 1e3 for r in count if count[r] > 1]
    new_keys = [k for k in _graph_keys(engine) if k not in keys_before]
    stats = engine.spec.stats if engine.spec else {}
    proposed = stats.get("proposed", 0) - before.get("proposed", 0)
    accepted = stats.get("accepted", 0) - before.get("accepted", 0)
    steps_by_k = {int(k.split(".")[1]): v - before.get(k, 0) for k, v in stats.items()
                  if k.startswith("steps_by_k.") and v > before.get(k, 0)}  # request-steps
    tree_steps = stats.get("tree_steps", 0) - before.get("tree_steps", 0)  # of which trees
    tree_acc, top1_acc, catch_rows, catch_ms = (
        stats.get(k, 0) - before.get(k, 0)
        for k in ("tree_accepted", "tree_top1_accepted", "catch_up_rows", "catch_up_ms"))
    return {"concurrency": concurrency, "requests": len(prompts),
            "output_tokens": sum(count.values()),
            "output_tok_per_s": sum(count.values()) / elapsed,
            "tpot_ms_median": statistics.median(tpot) if tpot else None, "tpot_ms": tpot,
            "acceptance_rate": accepted / proposed if proposed else None,
            "proposed": proposed, "accepted": accepted, "elapsed_s": elapsed,
            "request_steps_by_k": dict(sorted(steps_by_k.items())),
            "request_steps_tree": tree_steps,
            # on tree request-steps: drafts accepted, and what their top-1 chains alone
            # accepted (tokens per step 1 + x / request_steps_tree: the trees' real gain)
            "tree_accepted": tree_acc, "tree_top1_accepted": top1_acc,
            # the draft's catch-ups over rows committed at K = 0: rows and ms (inside the
            # VERIFY steps' time, not charged to their gears)
            "catch_up_rows": catch_rows, "catch_up_ms": catch_ms,
            "gear_switches": getattr(engine.scheduler.policy, "switches", 0) - switches,
            "unscored_plans": getattr(engine.scheduler.policy, "reused", 0) - reused,
            # where the point's time went, by step mode (host work included): total seconds
            # and median step period, e.g. goodput's VERIFY steps against always-4's
            "step_s_by_mode": {m: sum(v) / 1e3 for m, v in periods.items()},
            # goodput: measured / predicted step time of the steps it observed, by mode
            "cost_model_ratio": _prediction_ratio(engine.scheduler.policy, predicted),
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
            **{f"{m}_steps": engine.stats()[f"{m}_steps"] - steps_before[f"{m}_steps"]
               for m in ("decode", "verify", "extend")}}


def _graph_keys(engine) -> list:
    return list(getattr(engine.runner.shape_graphs, "entries", ()))


def _prediction_ratio(policy, before: dict) -> dict:
    """{mode: [measured / predicted ms, steps]} over the steps a cost-modelling policy
    observed since `before` (its prediction_log then); {} for other policies."""
    out = {}
    for mode, (ms, pred, n) in getattr(policy, "prediction_log", {}).items():
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
                "unscored_plans", "catch_up_rows", "catch_up_ms"):
        out[key] = sum(p[key] for p in parts)
    out["output_tok_per_s"] = out["output_tokens"] / out["elapsed_s"]
    out["pass_tok_per_s"] = [round(p["output_tok_per_s"], 1) for p in parts]
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


def per_pass(c: int, args) -> int:
    """Requests of one pass at concurrency c: c * rounds (at least min_requests over the
    passes). Every pass reaches c running requests and refills their slots as they finish.
    (Until session 9 a point's c * rounds requests were split over its passes: with 5 rounds
    and 8 passes a pass at "c = 128" was one wave of 80 requests, and the drain of its
    slowest requests, not c running requests, decided the point.)"""
    return max(c * max(args.rounds, 1), -(-args.min_requests // args.passes))


def sweep(engine, policies: dict, prompts: list[list[int]], args, bar, done=None,
          subsets: dict[int, list[str]] | None = None) -> dict:
    """-> {policy name: [point per concurrency it ran]}; `policies` maps names to policy
    objects, which keep their state (goodput's learned costs) from point to point, as when
    serving. `subsets`: the policies to run at each c (--focus; default: all)."""
    results: dict[str, list[dict]] = {name: [] for name in policies}
    for j, c in enumerate(args.concurrency):
        names = subsets[c] if subsets else list(policies)
        n = per_pass(c, args)
        parts: dict[str, list[dict]] = {name: [] for name in names}
        # the policy that starts a concurrency meets its one-off costs first (a kernel
        # specialised for a new shape, an allocation): rotate which one that is, by log2(c),
        # so a sweep split over two processes rotates as one does (with the index in the
        # list, goodput started c = 32 in both halves' second process: H200, sessions 9-10)
        r = (c.bit_length() - 1) % len(names)
        first = names[r:] + names[:r]
        if j == 0:
            settle(engine, policies, first, prompts[:n], c, args)
        for i in range(args.passes):
            order = first if i % 2 == 0 else first[::-1]
            for name in order:
                engine.scheduler.policy = policies[name]
                parts[name].append(run_point(engine, prompts[i * n:(i + 1) * n], c,
                                             args.output_len))
                bar.update(1 / args.passes)
        for name in names:
            results[name].append(merge_passes(parts[name]))
        if done is not None:
            done(results)  # partial results survive a time limit
    return results


def settle(engine, policies: dict, names: list[str], prompts: list[list[int]], c: int,
           args) -> None:
    """Untimed: `args.settle` passes of every policy at the sweep's first concurrency, before
    any timed one. A fresh process's first closed loop ran slower than the same loop later
    (H200: goodput's first pass at c = 32, the first point of its process, gave 6,578 and
    6,575 tok/s in sessions 9 and 10, its second pass 6,984 and 7,883): whichever policy
    came first paid for the process's start, not for its choices."""
    for _ in range(args.settle):
        for name in names:
            engine.scheduler.policy = policies[name]
            run_point(engine, prompts, c, args.output_len)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, pts in results.items():
        xs = [p["concurrency"] for p in pts]
        a.plot(xs, [p["output_tok_per_s"] for p in pts], marker="o", label=name)
        b.plot(xs, [p["tpot_ms_median"] for p in pts], marker="o", label=name)
    for ax, title in ((a, "output tokens/s"), (b, "time per output token (ms, median)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(args) -> int:
    from gearshift import LLM
    from gearshift.bench.offline import environment
    from gearshift.bench.sweep_focus import focus_subsets
    from gearshift.engine_args import engine_kwargs

    kw = engine_kwargs(args)
    kw.update(max_num_seqs=max(args.concurrency), spec_policy="off")
    kw.setdefault("speculative_algorithm", "eagle3")
    kw.pop("num_draft_tokens", None)
    concs = args.concurrency
    tree_kw = dict(draft_topk=args.tree_topk, num_verify_tokens=args.tree_tokens) \
        if args.tree_topk > 1 else {}
    llm = LLM(**kw, num_draft_tokens=4, **tree_kw)
    eng = llm.engine
    extra = {"warmup_s": _warm_up(eng), "warmup_costs_ms": eng.spec.measured_costs}
    names = [n for n in args.policies if n != "tree" or tree_kw]
    label = {"tree": f"tree-{args.tree_topk}x4-{args.tree_tokens}"}
    labels = [label.get(n, n) for n in names]
    subsets = focus_subsets(args.focus, args.focus_top, concs, labels) if args.focus else None
    bar = tqdm(total=sum(len(subsets[c]) for c in concs) if subsets else len(names) * len(concs),
               desc="sweep")
    most = args.passes * max(per_pass(c, args) for c in concs)
    prompts = make_prompts(llm.tokenizer, eng.model_config.vocab_size, most, args.input_len,
                           args.seed)
    env = environment(llm) | extra | ({"focus": subsets} if subsets else {})
    results = sweep(eng, {label.get(n, n): policy_object(n, eng, 4) for n in names}, prompts,
                    args, bar, done=lambda r: _save(args, r, env), subsets=subsets)
    bar.close()
    for pts in results.values():
        for p in pts:
            p.pop("tpot_ms", None)
    _print(results)
    _save(args, results, env)
    plot(results, args.output_png)
    return 0


def _warm_up(engine) -> float | None:
    """The start-up speculation warm-up, which spec_policy "off" (the engines' policy until
    each point sets its own) skipped; -> seconds, None without CUDA graphs."""
    if engine.runner.shape_graphs is None:
        return None
    from gearshift.speculative.warmup import warm_up_speculation

    t0 = time.perf_counter()
    warm_up_speculation(engine)
    freeze_heap()  # as the engine does after its own start-up warm-up
    return time.perf_counter() - t0


def _save(args, results: dict, env: dict) -> None:
    with open(args.output_json, "w") as f:
        json.dump({"results": results, "env": env, "args": vars(args) | {"func": None}}, f,
                  indent=1, default=str)


def _print(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="output tok/s by concurrency (acceptance)")
    t.add_column("policy")
    concs = sorted({p["concurrency"] for pts in results.values() for p in pts})
    for c in concs:
        t.add_column(str(c), justify="right")
    for name, pts in results.items():
        at = {p["concurrency"]: p for p in pts}  # --focus: not every policy at every c
        t.add_row(name, *[f"{at[c]['output_tok_per_s']:.0f}" + (
            f" ({at[c]['acceptance_rate']:.2f})" if at[c]["acceptance_rate"] is not None
            else "") if c in at else "-" for c in concs])
    Console().print(t)


def _policy_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in (*CHAIN_POLICIES, "tree")]
    if unknown or not names:
        import argparse

        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown) or '(none)'}; choose from "
            + ", ".join([*CHAIN_POLICIES, "tree"]))
    return names


def _sweep_files(text: str) -> list[str]:
    """--focus: comma-separated sweep JSONs, each readable with a "results" object."""
    import argparse

    paths = [x for x in text.split(",") if x]
    for path in paths:
        try:
            with open(path) as f:
                ok = isinstance(json.load(f).get("results"), dict)
        except (OSError, ValueError, AttributeError) as e:
            raise argparse.ArgumentTypeError(f"cannot read sweep JSON {path}: {e}") from None
        if not ok:
            raise argparse.ArgumentTypeError(f"{path} is not a sweep JSON (no \"results\")")
    if not paths:
        raise argparse.ArgumentTypeError("expected at least one sweep JSON")
    return paths


def _at_least_one(text: str) -> int:
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return n


def add_args(p) -> None:
    from gearshift.engine_args import add_engine_args

    add_engine_args(p)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    # a point of 2 rounds in all / 8 requests (one pass) took ~1 s, and its throughput varied
    # up to 9% between two identical policies on the H200 (2026-11-29-h200-session3.md)
    p.add_argument("--rounds", type=_at_least_one, default=2,
                   help="requests per pass = c * rounds (closed loop: each slot serves `rounds`)")
    p.add_argument("--min-requests", type=int, default=16,
                   help="at least this many requests per point (short points are noisy)")
    p.add_argument("--passes", type=_at_least_one, default=2,
                   help="runs per point, policies interleaved, alternate passes in reverse order")
    p.add_argument("--settle", type=int, default=1,
                   help="untimed passes of every policy at the first concurrency, first")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--policies", type=_policy_list, default=[*CHAIN_POLICIES, "tree"],
                   help="comma-separated subset of: " + ", ".join([*CHAIN_POLICIES, "tree"]))
    p.add_argument("--tree-topk", type=int, default=4,
                   help="tree width of the engine (depth 4); 1 = chains only (no `tree` policy)")
    p.add_argument("--tree-tokens", type=int, default=16, help="nodes per draft tree")
    p.add_argument("--focus", type=_sweep_files, default=None,
                   help="earlier sweep JSON(s): at each c run goodput and only the "
                        "--focus-top policies closest to the best there (a confirmation run)")
    p.add_argument("--focus-top", type=_at_least_one, default=2,
                   help="other policies kept per concurrency with --focus")
    p.add_argument("--output-json", default="bench_sweep.json")
    p.add_argument("--output-png", default="bench_sweep.png")
