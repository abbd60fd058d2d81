"""`gearshift bench sweep`: output throughput and time per output token against
concurrency (1, 2, 4, ... 256) for each speculation policy, on one target + draft pair:

    off | always K=2 | always K=4 | tree | threshold (SGLang-like: off at >= 64)
        | threshold-vllm (K=3 <= 64, K=1 <= 128, off above) | goodput (default: one K
        per step) | goodput-request (a K per request; only when --policies names it)

Concurrency c = at most c requests running: a pass is a closed loop over c * rounds requests
(each of the c slots serves `rounds` (2) requests in turn; at least min_requests / passes),
and a point runs `passes` (2) of them. Every policy runs on one engine (max K = 4 unless raised, below; trees
--tree-width (4) wide of --tree-budget (16) nodes; --tree-width 1: chains only, no `tree`):
chain policies plan chains, `tree` plans the tree, goodput picks among both. Policies are
interleaved: for each c, pass 1 runs every policy in turn, pass 2 runs them in reverse order
on the next prompts, so drift over the run (clocks, heap) falls on every policy alike; the
first policy rotates from one c to the next. A point sums its passes, and `pass_tok_per_s`
shows their spread. Prompts are held-out corpus windows (real acceptance) or synthetic ids;
`--workload mixed` makes half of them greedy and half sampled at temperature 1.2 (acceptance
differs per request); `agentic` prompts are multi-turn edit loops whose answers copy their
input, `mixed-agentic` half of those and half corpus windows (agentic.py).
`--num-draft-tokens` raises the engine's max K above 4, and `always-N` policies ask for any
N, raising it to N (suffix decoding drafts long copied spans). `hybrid`, `model-only` and
`suffix-only` compare eagle3+suffix with each proposer alone on one engine (hybrid.py).
Prints a table, the markdown table with the criteria verdicts (sweep_report.py), writes
JSON and a PNG plot.

Data flow: args -> LLM engine -> per (c, pass, policy): Engine.set_policy, run_point
(sweep_point.py) -> merge_passes -> JSON/PNG, verdicts.
"""

from __future__ import annotations

import json
import logging
import re
import time

from tqdm.auto import tqdm

from gearshift.bench import require_extras
from gearshift.bench.hybrid import HYBRID_POLICIES, hybrid_policy, ratio_lines
from gearshift.bench.sweep_point import merge_passes, mixed_temperatures, run_point
from gearshift.bench.sweep_report import markdown_table, plot, print_table, verdict_lines, verdicts
from gearshift.engine.gc_control import freeze_heap

log = logging.getLogger("gearshift.bench")

CHAIN_POLICIES = ("goodput", "off", "always-2", "always-4", "threshold", "threshold-vllm")
VLLM_LIKE = ((64, 3), (128, 1), (10**9, 0))  # threshold-vllm: vLLM's documented K table
# beside the default set: goodput with a K per request, against goodput's one K per step
OPTIONAL_POLICIES = ("goodput-request",)


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
    import torch  # here: `gearshift --help` builds this bench's parser without torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n, input_len), generator=g).tolist()


def policy_object(name: str, engine, k_max: int):
    """Chain policies plan chains (topk 1) on a tree-capable engine too; `tree` plans the
    engine's tree; goodput chooses."""
    from gearshift.engine.cost_profile import build_cost_model
    from gearshift.policy.goodput import GoodputPolicy
    from gearshift.policy.static import AlwaysPolicy, OffPolicy
    from gearshift.policy.threshold import SGLANG_LIKE, ThresholdPolicy

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
    from gearshift.engine.warmup import apply_measured

    cost = build_cost_model(engine.runner, k_max, engine.config.max_num_seqs,
                            engine.spec.draft_frac, engine.spec.tree_nodes)
    policy = GoodputPolicy(cost, k_max, pad=engine.runner.decode_pad,
                           per_request=name == "goodput-request",
                           verify_tokens=engine.spec.verified_tokens)
    apply_measured(policy, engine.measured_costs)
    if name in HYBRID_POLICIES:  # a proposer per request, or one of them alone (hybrid.py)
        return hybrid_policy(name, engine, policy)
    return policy


def per_pass(c: int, args) -> int:
    """Requests of one pass at concurrency c: c * rounds (at least min_requests over the
    passes). Every pass reaches c running requests and refills their slots as they finish
    (a pass of fewer than c requests would measure the drain of one wave, not c running)."""
    return max(c * max(args.rounds, 1), -(-args.min_requests // args.passes))


def sweep(engine, policies: dict, prompts: list[list[int]], args, bar, done=None) -> dict:
    """-> {policy name: [point per concurrency]}; `policies` maps names to policy objects,
    which keep their state (goodput's learned costs) from point to point, as when serving."""
    names = list(policies)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for j, c in enumerate(args.concurrency):
        n = per_pass(c, args)
        parts: dict[str, list[dict]] = {name: [] for name in names}
        # the policy that starts a concurrency meets its one-off costs first (a kernel
        # specialised for a new shape, an allocation): rotate which one that is, by log2(c),
        # so a sweep split over several processes rotates as one does
        r = (c.bit_length() - 1) % len(names)
        first = names[r:] + names[:r]
        if j == 0:
            settle(engine, policies, first, prompts[:n], c, args)
        for i in range(args.passes):
            order = first if i % 2 == 0 else first[::-1]
            for name in order:
                engine.set_policy(policies[name])
                before = dict(getattr(policies[name], "picks", {}))
                part = run_point(engine, prompts[i * n:(i + 1) * n], c, args.output_len,
                                 temperatures(args))
                if before:  # a hybrid's request-steps per proposer (the proposer mix)
                    part["proposer_steps"] = {p: v - before[p]
                                              for p, v in policies[name].picks.items()}
                parts[name].append(part)
                bar.update(1 / args.passes)
        for name in names:
            point = merge_passes(parts[name])
            if "proposer_steps" in parts[name][0]:
                point["proposer_steps"] = {p: sum(x["proposer_steps"][p] for x in parts[name])
                                           for p in parts[name][0]["proposer_steps"]}
            results[name].append(point)
        if done is not None:
            done(results)  # partial results survive a time limit
    return results


def temperatures(args):
    """--workload uniform: every request at --temperature; mixed: --greedy-fraction of them
    greedy, the others sampled at --sampled-temperature (per prompt index)."""
    if getattr(args, "workload", "uniform") == "mixed":
        return mixed_temperatures(args.greedy_fraction, args.sampled_temperature)
    return args.temperature


def settle(engine, policies: dict, names: list[str], prompts: list[list[int]], c: int,
           args) -> None:
    """Untimed: `args.settle` passes of every policy at the sweep's first concurrency, before
    any timed one. A fresh process's first closed loop runs slower than the same loop later:
    without this, whichever policy came first would pay for the process's start."""
    for _ in range(args.settle):
        for name in names:
            engine.set_policy(policies[name])
            run_point(engine, prompts, c, args.output_len, temperatures(args))


def run(args) -> int:
    from gearshift.engine_args import engine_kwargs

    require_extras("rich", "matplotlib")
    if args.tree_width == 1:
        args.tree_budget = None  # chains only: no tree to budget
    kw = engine_kwargs(args)  # checked before torch loads
    from gearshift import LLM
    from gearshift.bench.environment import environment

    kw.update(max_num_seqs=max(args.concurrency), spec_policy="off")
    hybrid = any(n in HYBRID_POLICIES for n in args.policies)
    kw.setdefault("speculative_algorithm", "eagle3+suffix" if hybrid else "eagle3")
    k_max = max(4, kw.pop("num_draft_tokens", None) or 4,
                *(int(n.split("-")[1]) for n in args.policies if n.startswith("always-")))
    llm = LLM(**kw, num_draft_tokens=k_max)
    eng = llm.engine
    extra = {"warmup_s": _warm_up(eng), "warmup_costs_ms": eng.measured_costs}
    names = [n for n in args.policies if n != "tree" or args.tree_width > 1]
    label = {"tree": f"tree-{args.tree_width}x{k_max}-{args.tree_budget}"}
    bar = tqdm(total=len(names) * len(args.concurrency), desc="sweep")
    most = args.passes * max(per_pass(c, args) for c in args.concurrency)
    prompts = make_prompts(llm.tokenizer, eng.model_config.vocab_size, most, args.input_len,
                           args.seed)
    if args.workload in ("agentic", "mixed-agentic"):
        from gearshift.bench.agentic import source_texts, workload_prompts

        prompts = workload_prompts(args.workload, llm.tokenizer, source_texts(), prompts, most,
                                   args.input_len, args.seed)
    env = environment(llm) | extra

    def save(results: dict) -> None:  # after every concurrency: a cut sweep keeps its points
        _save(args, results, env)
        if args.workload == "transition":
            from gearshift.bench.transition import plot as plot_phases

            plot_phases(results, args.output_png)
        else:
            plot(results, args.output_png)

    policies = {label.get(n, n): policy_object(n, eng, k_max) for n in names}
    judged = judge_criteria(args, eng)
    if args.workload == "transition":
        from gearshift.bench import transition

        words = transition.word_prompts(llm.tokenizer, most, args.input_len, args.seed)
        code = make_prompts(llm.tokenizer, eng.model_config.vocab_size, 2 * most,
                            args.input_len, args.seed)
        results = transition.transition_sweep(eng, policies, code, words,
                                              lambda c: per_pass(c, args), args, bar, done=save)
        bar.close()
        print(transition.markdown_table(results))
        v = transition.verdicts(results)
        lines, failed = transition.verdict_lines(v, judged), judged and not v["pass"]
    else:
        results = sweep(eng, policies, prompts, args, bar, done=save)
        bar.close()
        print_table(results)
        print(markdown_table(results))
        v = verdicts(results)
        lines = verdict_lines(v, judged)
        failed = judged and False in (v["goodput_within_best"], v["goodput_beats_off_c1"])
        lines += ratio_lines(results)
    for line in lines:
        print(line)
    if failed and args.criteria != "off":
        print("a criterion failed (--criteria off: report it and exit 0)")
        return 1
    return 0


def judge_criteria(args, engine) -> bool:
    """Are the sweep's criteria judged here? They were set for the bench pair on a GPU:
    `auto` judges them on CUDA only; elsewhere the ratios print without a verdict."""
    if args.criteria == "auto":
        return engine.runner.device.type == "cuda"
    return True


def _warm_up(engine) -> float | None:
    """The start-up speculation warm-up, which spec_policy "off" (the engine's policy until
    each point sets its own) skipped; -> seconds, None where it measured nothing."""
    from gearshift.engine.warmup import warm_up_engine

    t0 = time.perf_counter()
    if not warm_up_engine(engine, priced=True):
        return None
    if engine.runner.shape_graphs is not None:
        freeze_heap()  # as the engine does after its own start-up warm-up
    return time.perf_counter() - t0


def _save(args, results: dict, env: dict) -> None:
    if args.workload == "transition":
        from gearshift.bench.transition import verdicts as transition_verdicts

        criteria = transition_verdicts(results)
    else:
        criteria = verdicts(results)
    with open(args.output_json, "w") as f:
        json.dump({"results": results, "criteria": criteria, "env": env,
                   "args": vars(args) | {"func": None}}, f, indent=1, default=str)


def _policy_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = (*CHAIN_POLICIES, *OPTIONAL_POLICIES, "tree", *HYBRID_POLICIES)
    unknown = [n for n in names if n not in known and not re.fullmatch(r"always-[1-9][0-9]?", n)]
    if unknown or not names:
        import argparse

        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown) or '(none)'}; choose from "
            + ", ".join(known) + ", always-N")
    return names


def _non_negative(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, not {text!r}")
    return value


def _fraction(text: str) -> float:
    import argparse

    value = _non_negative(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], not {text!r}")
    return value


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
    from gearshift.engine_args import RenamedFlag, add_engine_args

    add_engine_args(p)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    # one point of a single short pass varies by several percent between two identical
    # policies: two rounds, two passes in alternating order are the least that compare
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
    p.add_argument("--temperature", type=_non_negative, default=0.0,
                   help="sampling temperature of every request (0: greedy)")
    p.add_argument("--workload", choices=["uniform", "mixed", "transition", "agentic",
                                          "mixed-agentic"], default="uniform",
                   help="uniform: every request at --temperature; mixed: --greedy-fraction "
                        "greedy, the rest sampled at --sampled-temperature (acceptance then "
                        "differs per request); transition: code, then random words "
                        "sampled at --sampled-temperature, then code "
                        "(gearshift/bench/transition.py); agentic: multi-turn edit loops that "
                        "copy their input; mixed-agentic: half agentic, half corpus windows "
                        "(gearshift/bench/agentic.py)")
    p.add_argument("--criteria", choices=["auto", "on", "off"], default="auto",
                   help="judge the criteria (PASS / FAIL, exit 1 on a FAIL): auto = on a GPU "
                        "only, where they were set; off = print the verdicts, exit 0")
    p.add_argument("--greedy-fraction", type=_fraction, default=0.5,
                   help="mixed workload: share of greedy requests")
    p.add_argument("--sampled-temperature", type=_non_negative, default=1.2,
                   help="mixed workload: temperature of the sampled requests; transition: "
                        "of the random-words phase")
    p.add_argument("--policies", type=_policy_list, default=[*CHAIN_POLICIES, "tree"],
                   help="comma-separated, of: " + ", ".join([*CHAIN_POLICIES, "tree"])
                   + " (the default), " + ", ".join(OPTIONAL_POLICIES)
                   + ", always-N (K = N; the engine's max K follows); on a hybrid engine "
                   "(eagle3+suffix, the default when one is named): "
                   + ", ".join(HYBRID_POLICIES) + " (gearshift/bench/hybrid.py)")
    # the engine's tree (--tree-width, --tree-budget): 4 wide, 16 nodes (depth 4) unless given
    p.set_defaults(tree_width=4, tree_budget=16)
    p.add_argument("--tree-topk", action=RenamedFlag, new="--tree-width", type=int)
    p.add_argument("--tree-tokens", action=RenamedFlag, new="--tree-budget", type=int)
    p.add_argument("--output-json", default="bench_sweep.json")
    p.add_argument("--output-png", default="bench_sweep.png")
