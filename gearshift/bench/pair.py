"""`gearshift bench pair`: does the widened bench pair (`gearshift make-bench-model ... --head`)
keep the small pair's behaviour at the big model's cost? Three checks:

  1. cost: the big target's decode step (batch 1, --context tokens of context) against the
     dummy-weight preset of the same shape (device ms from CUDA events, wall ms per step);
     criterion: the ratio big / preset within 5%.
  2. greedy: the big target's greedy tokens equal the small target's, prompt by prompt.
  3. acceptance: speculative greedy runs (EAGLE-3, K-token chain, policy `always`) of both
     pairs accept the same drafts (accepted / proposed, accepted-length histogram), and
     each pair's speculative tokens equal its plain tokens.

Data flow: args -> held-out prompts (the small target's tokenizer, sweep.make_prompts)
  -> per pair, one engine at a time: LLM(target, eagle3 head, always K) -> spec run
     (tokens, LLM.spec_stats()) -> policy off on the same engine -> plain greedy run -> freed
  -> cost: LLM(big, cost dtype) then LLM(preset, dummy) -> offline.run_offline at batch 1
  -> compare -> rich tables + JSON (with an `env` block).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import torch

from gearshift.request import SamplingParams

COST_TOLERANCE = 0.05  # |big / preset - 1| allowed for the cost criterion
_COST_KEYS = ("decode_device_ms_median", "decode_step_ms_median", "decode_step_ms_p90",
              "decode_steps", "elapsed_s")


def release() -> None:
    """After `del llm` in the caller: collect the engine (and its CUDA graphs) and return its
    memory, so the next model does not coexist with it."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def pair_prompts(small_target: str | Path, n: int, prompt_len: int, seed: int = 0
                 ) -> tuple[list[list[int]], dict]:
    """n prompts of prompt_len tokens: held-out corpus files through the small target's
    tokenizer (random ids when it has none). Returns (prompts, a description for the report)."""
    from gearshift.bench.sweep import make_prompts
    from gearshift.config import ModelConfig
    from gearshift.engine.engine import load_tokenizer

    tok = load_tokenizer(Path(small_target))
    vocab = ModelConfig.from_dir(small_target).vocab_size
    prompts = make_prompts(tok, vocab, n, prompt_len, seed)
    info = {"num_prompts": n, "prompt_len": prompt_len,
            "source": "heldout corpus" if tok is not None else "synthetic ids",
            "first_prompt": tok.decode(prompts[0])[:120] if tok is not None else None}
    return prompts, info


def run_pair(target: str | Path, head: str | Path, prompts: list[list[int]], *, max_tokens: int,
             num_draft_tokens: int = 4, **engine_kw) -> dict:
    """Speculative then plain greedy tokens of one target + EAGLE-3 head, on one engine."""
    from gearshift import LLM
    from gearshift.bench.offline import environment
    from gearshift.policy.static import OffPolicy

    llm = LLM(str(target), speculative_algorithm="eagle3", draft_model=str(head),
              num_draft_tokens=num_draft_tokens, draft_topk=1, spec_policy="always", **engine_kw)
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    spec = [o.token_ids for o in llm.generate(prompts, greedy)]
    stats = llm.spec_stats()
    llm.engine.scheduler.policy = OffPolicy()  # the same target, never drafting: plain decode
    plain = [o.token_ids for o in llm.generate(prompts, greedy)]
    env = environment(llm)
    del llm
    release()
    hist = stats["accept_len_hist"]
    verify = sum(hist.values())  # request-verify events with K > 0
    return {
        "target": str(target), "head": str(head), "plain": plain, "spec": spec,
        "proposed": stats["proposed"], "accepted": stats["accepted"],
        "acceptance_rate": stats["acceptance_rate"], "verify_steps": verify,
        "mean_accept_len": (stats["accepted"] + verify) / verify if verify else None,
        "accept_len_hist": hist, "steps_by_k": stats["steps_by_k"],
        "spec_equals_plain": [s == p for s, p in zip(spec, plain)], "env": env,
    }


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or the shorter length); None when equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare_pairs(small: dict, big: dict) -> dict:
    """Greedy and acceptance equality of the big pair against the small one."""
    div = [first_divergence(s, b) for s, b in zip(small["plain"], big["plain"])]
    spec_div = [first_divergence(s, b) for s, b in zip(small["spec"], big["spec"])]
    keys = ("proposed", "accepted", "accept_len_hist")
    return {
        "greedy": {"equal": div.count(None), "total": len(div), "first_divergence": div,
                   "all_equal": all(d is None for d in div)},
        "spec_tokens_equal": spec_div.count(None),
        "acceptance": {"equal": all(small[k] == big[k] for k in keys),
                       **{name: {k: p[k] for k in ("proposed", "accepted", "acceptance_rate",
                                                   "verify_steps", "mean_accept_len",
                                                   "accept_len_hist", "steps_by_k")}
                          for name, p in (("small", small), ("big", big))}},
        "spec_equals_plain": {name: sum(p["spec_equals_plain"]) for name, p in
                              (("small", small), ("big", big))},
    }


def measure_cost(big: str | Path, preset: str, *, context: int, steps: int, dtype: str,
                 seed: int = 0, **engine_kw) -> dict:
    """Decode step time at batch 1 and `context` tokens of context: the big target, then the
    dummy preset (a preset name or a config .json), each alone on the device."""
    from gearshift import LLM
    from gearshift.bench.offline import environment, run_offline

    out: dict = {"context": context, "steps": steps, "dtype": dtype}
    for name, model, extra in (("big", str(big), {}), ("preset", preset, {"load_format": "dummy"})):
        llm = LLM(model, dtype=dtype, max_num_seqs=1, kv_cache_tokens=context + steps + 128,
                  seed=seed, **extra, **engine_kw)
        r = run_offline(llm, num_prompts=1, input_len=context, output_len=steps, seed=seed)
        out[name] = {k: r[k] for k in _COST_KEYS} | {"model": model, "env": environment(llm)}
        del llm
        release()
    b, p = out["big"], out["preset"]
    out["wall_ratio"] = b["decode_step_ms_median"] / p["decode_step_ms_median"]
    dev = None not in (b["decode_device_ms_median"], p["decode_device_ms_median"])
    out["device_ratio"] = (b["decode_device_ms_median"] / p["decode_device_ms_median"]) if dev else None
    out["ratio_basis"] = "device_ms" if dev else "wall_ms"
    ratio = out["device_ratio"] if dev else out["wall_ratio"]
    out["within_tolerance"] = abs(ratio - 1.0) <= COST_TOLERANCE
    return out


def bench_pair(*, big: str, big_head: str, small: str, small_head: str, preset: str,
               num_prompts: int, prompt_len: int, max_tokens: int, num_draft_tokens: int = 4,
               dtype: str = "float32", cost_dtype: str = "bfloat16", context: int = 1024,
               cost_steps: int = 64, only: str = "all", seed: int = 0, **engine_kw) -> dict:
    """The whole report (what `gearshift bench pair` prints and saves)."""
    result: dict = {"criteria": {}}
    if only in ("all", "equality"):
        prompts, result["prompts"] = pair_prompts(small, num_prompts, prompt_len, seed)
        kw = dict(dtype=dtype, max_num_seqs=num_prompts, seed=seed,
                  kv_cache_tokens=2 * num_prompts * (prompt_len + max_tokens + num_draft_tokens + 1)
                  + 512, **engine_kw)
        runs = {name: run_pair(t, h, prompts, max_tokens=max_tokens,
                               num_draft_tokens=num_draft_tokens, **kw)
                for name, t, h in (("small", small, small_head), ("big", big, big_head))}
        result.update(compare_pairs(runs["small"], runs["big"]), max_tokens=max_tokens,
                      num_draft_tokens=num_draft_tokens, dtype=dtype, env=runs["big"]["env"])
        result["criteria"].update(greedy_equal=result["greedy"]["all_equal"],
                                  acceptance_equal=result["acceptance"]["equal"],
                                  spec_lossless=all(n == num_prompts for n in
                                                    result["spec_equals_plain"].values()))
    if only in ("all", "cost"):
        result["cost"] = measure_cost(big, preset, context=context, steps=cost_steps,
                                      dtype=cost_dtype, seed=seed, **engine_kw)
        result.setdefault("env", result["cost"]["big"]["env"])
        result["criteria"]["cost_within_5pct"] = result["cost"]["within_tolerance"]
    result["passed"] = all(result["criteria"].values())
    return result


def print_report(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    fmt = lambda v: "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    if "cost" in r:
        c = r["cost"]
        t = Table(title=f"decode step, batch 1, context {c['context']} ({c['dtype']})")
        for col in ("model", "device ms (median)", "wall ms (median)", "wall ms (p90)"):
            t.add_column(col, justify="right" if col != "model" else "left")
        for name in ("big", "preset"):
            m = c[name]
            t.add_row(f"{name} ({Path(m['model']).name})", fmt(m["decode_device_ms_median"]),
                      fmt(m["decode_step_ms_median"]), fmt(m["decode_step_ms_p90"]))
        t.add_row("ratio big / preset", fmt(c["device_ratio"]), fmt(c["wall_ratio"]), "")
        con.print(t)
    if "acceptance" in r:
        t = Table(title=f"greedy, {r['prompts']['num_prompts']} prompts x {r['max_tokens']} tokens, "
                        f"EAGLE-3 chain K={r['num_draft_tokens']} ({r['dtype']})")
        for col in ("pair", "accepted / proposed", "acceptance", "mean accepted length",
                    "verify steps", "spec == plain"):
            t.add_column(col, justify="right" if col != "pair" else "left")
        n = r["greedy"]["total"]
        for name in ("small", "big"):
            a = r["acceptance"][name]
            t.add_row(name, f"{a['accepted']} / {a['proposed']}", fmt(a["acceptance_rate"]),
                      fmt(a["mean_accept_len"]), str(a["verify_steps"]),
                      f"{r['spec_equals_plain'][name]} / {n}")
        con.print(t)
        g = r["greedy"]
        con.print(f"greedy tokens big == small: {g['equal']} / {g['total']} prompts"
                  + ("" if g["all_equal"] else f" (first divergence: {g['first_divergence']})"))
    for k, v in r["criteria"].items():
        con.print(f"{k}: {'PASS' if v else 'FAIL'}")


def run(args) -> int:
    from gearshift.models.default import default_head_dir, default_target_dir

    engine_kw = {"device": args.device, "max_num_batched_tokens": args.max_num_batched_tokens,
                 "cuda_graphs": not args.no_cuda_graphs}
    if args.attention_backend:
        engine_kw["attention_backend"] = args.attention_backend
    result = bench_pair(
        big=args.big, big_head=args.big_head, small=args.small or str(default_target_dir()),
        small_head=args.small_head or str(default_head_dir()), preset=args.preset,
        num_prompts=args.num_prompts, prompt_len=args.prompt_len, max_tokens=args.max_tokens,
        num_draft_tokens=args.num_draft_tokens, dtype=args.dtype, cost_dtype=args.cost_dtype,
        context=args.context, cost_steps=args.cost_steps, only=args.only, seed=args.seed,
        **engine_kw)
    result["args"] = {k: v for k, v in vars(args).items() if k != "func"}
    print_report(result)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 1 if args.strict and not result["passed"] else 0


def add_args(p) -> None:
    p.add_argument("--big", required=True, help="widened target (make-bench-model --out)")
    p.add_argument("--big-head", required=True, help="widened EAGLE-3 head (--head-out)")
    p.add_argument("--small", default=None, help="small target (default: the shipped one)")
    p.add_argument("--small-head", default=None, help="small head (default: the shipped one)")
    p.add_argument("--preset", default="llama-3.1-8b",
                   help="dummy-weight preset of the big shape (name or config .json), for cost")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--num-draft-tokens", type=int, default=4, help="K of the draft chain")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the equality runs (float32: exact comparisons)")
    p.add_argument("--cost-dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--context", type=int, default=1024, help="context of the timed decode steps")
    p.add_argument("--cost-steps", type=int, default=64, help="timed decode steps per model")
    p.add_argument("--only", choices=["all", "equality", "cost"], default="all")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda if available)")
    p.add_argument("--attention-backend", choices=["torch", "triton"])
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strict", action="store_true", help="exit 1 when a criterion fails")
    p.add_argument("--output-json", default="bench_pair.json")


if __name__ == "__main__":  # python -m gearshift.bench.pair ... (same flags as the CLI)
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="gearshift bench pair")
    add_args(parser)
    sys.exit(run(parser.parse_args()))
