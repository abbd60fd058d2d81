"""Experiment: offline throughput against the step token budget, on one engine.

Issue 2's offline run (256 prompts, 512 in / 256 out, <= 64 running) spends its time in
two kinds of step: ~6.4 ms decode steps of 64 rows (weight-bandwidth-bound) and ~9.1 ms
mixed steps of 256 rows (compute-bound GEMMs). A smaller budget spreads each prompt's
prefill over more, cheaper steps that keep the GEMMs nearer their bandwidth/compute knee.
This script measures it: the engine is built once with the largest budget (so EXTEND
graphs cover every step) and the scheduler's budget is set per run; budgets run in
interleaved passes. Writes JSON (per run: tok/s, steps per mode, medians, rows per step).

Usage: python scripts/exp_token_budget.py --budgets 160,192,256,2048 --passes 2 --out x.json
       python scripts/exp_token_budget.py --budgets 512,d256,d320 --passes 2   (dN: decoders + N)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="llama-3.1-8b")
    p.add_argument("--budgets", default="160,192,224,256,384,2048",
                   help="step token budgets; dN: this step's decoders + N (SGLang's mixed chunk: "
                        "the prefill chunk's tokens do not shrink as more requests decode)")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--out", default="token_budget.json")
    args = p.parse_args()
    from gearshift import LLM
    from gearshift.bench.offline import environment, run_offline
    from gearshift.runner.jit_log import triton_compiles

    budgets = args.budgets.split(",")
    t0 = time.perf_counter()
    widest = max(int(b[1:]) + args.max_num_seqs if b.startswith("d") else int(b) for b in budgets)
    llm = LLM(args.preset or None, load_format="dummy" if args.preset else "safetensors",
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=widest)
    from gearshift.kernels.skinny_select import CHOOSER

    result = {"env": environment(llm), "build_s": time.perf_counter() - t0, "runs": [],
              "skinny_gemm": CHOOSER.report(),  # the start-up picks and their timings
              # EXTEND graph bucket -> the graph its steps run in (ModelRunner.extend_route)
              "extend_route": getattr(llm.engine.runner, "extend_route", {})}
    sched = llm.engine.scheduler
    for rnd in range(args.passes):
        order = budgets if rnd % 2 == 0 else budgets[::-1]
        for b in order:
            set_budget(sched, b, widest)
            measured = len(chooser_table())
            with triton_compiles() as compiles:
                r = run_offline(llm, num_prompts=args.num_prompts, input_len=args.input_len,
                                output_len=args.output_len)
            log = r.pop("step_log")
            slowest = sorted(log, key=lambda s: -s["time_ms"])[:3]
            ext = [s["time_ms"] for s in log if s["mode"] == "extend"]
            run = {"budget": b, "pass": rnd, **{k: r[k] for k in (
                "elapsed_s", "output_tok_per_s", "steps", "decode_steps",
                "decode_step_ms_median", "extend_step_ms_median", "preemptions", "graphs")},
                "extend_steps": len(ext), "extend_s": sum(ext) / 1e3,
                "decode_s": sum(s["time_ms"] for s in log if s["mode"] == "decode") / 1e3,
                "mean_running": statistics.fmean(s["running_before"] for s in log),
                # one-off costs inside the run: Triton compiles, GEMM shapes the skinny chooser
                # measured for the first time, the slowest steps
                "triton_compiles": list(compiles), "chooser_new_shapes": len(chooser_table()) - measured,
                "slowest_steps": slowest}
            result["runs"].append(run)
            print(f"budget {b:>5} pass {rnd}: {r['output_tok_per_s']:8.1f} tok/s, "
                  f"{r['steps']} steps ({len(ext)} mixed, {run['extend_s']:.2f} s; "
                  f"{r['decode_steps']} decode, {run['decode_s']:.2f} s), "
                  f"mean running {run['mean_running']:.1f}; {len(compiles)} Triton compiles, "
                  f"{run['chooser_new_shapes']} new GEMM shapes timed, slowest step "
                  f"{slowest[0]['mode']} {slowest[0]['time_ms']:.1f} ms", flush=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    return 0


def set_budget(sched, budget: str, widest: int) -> None:
    """A fixed step budget ("512"), or "dN": before every plan, the budget is the running
    requests that decode plus N (at most `widest`, what the engine's graphs cover)."""
    sched.__dict__.pop("schedule", None)  # the class's schedule again
    if not budget.startswith("d"):
        sched.max_num_batched_tokens = int(budget)
        return
    extra, plan = int(budget[1:]), type(sched).schedule

    def schedule():
        decoding = sum(r.num_computed_tokens >= len(r.prompt_token_ids) for r in sched.running)
        sched.max_num_batched_tokens = min(decoding + extra, widest)
        return plan(sched)

    sched.schedule = schedule


def chooser_table() -> dict:
    from gearshift.kernels.skinny_select import CHOOSER

    return CHOOSER.table


if __name__ == "__main__":
    raise SystemExit(main())
