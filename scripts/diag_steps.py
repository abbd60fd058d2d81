"""Where does goodput lose time against always-4 at the same K? (GPU diagnostic)

In the session 4 sweeps goodput ran K = 4 for ~95% of its request-steps at c = 2..32, with
the same number of steps as always-4, yet each step took 0.1-0.8 ms longer. This runs the
two policies alternately on one engine (the sweep's set-up) and records every step: mode,
batch, K, the wall time of engine.step() and the draft's catch-up time, and the time the
policy's plan() took. Writes one JSON (per-step rows and a summary by mode and K).

Usage:
    python scripts/diag_steps.py --model /tmp/big --draft-model /tmp/bighead --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from gearshift import LLM, SamplingParams
from gearshift.bench.sweep import _warm_up, make_prompts, policy_object, warm_up


def run(eng, policy, prompts, c: int) -> list[dict]:
    eng.scheduler.policy = policy
    warm_up(eng, prompts, c)
    eng.scheduler.max_num_seqs = c
    plans, plan_ms = [], []
    schedule, plan_fn = eng.scheduler.schedule, policy.plan

    def timed_plan(view):
        t = time.perf_counter()
        out = plan_fn(view)
        plan_ms.append((time.perf_counter() - t) * 1e3)
        return out

    def spy():
        plan = schedule()
        plans.append(plan)
        return plan

    eng.scheduler.schedule, policy.plan = spy, timed_plan
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"q{i}-{time.monotonic_ns()}", p, params)
    rows = []
    try:
        while eng.has_unfinished_requests():
            n = len(plan_ms)
            t = time.perf_counter()
            eng.step()
            wall = (time.perf_counter() - t) * 1e3
            plan = plans[-1]
            rows.append({"mode": plan.mode.value, "bs": plan.batch_size,
                         "k": max(plan.draft_lens, default=0), "wall_ms": round(wall, 3),
                         "step_ms": round(eng.last_step["time_s"] * 1e3, 3),
                         "catch_up_ms": round(eng.spec.follow.catch_up_ms(), 3)
                         if plan.mode.value == "verify" else 0.0,
                         "plan_ms": round(sum(plan_ms[n:]), 4)})
    finally:
        del eng.scheduler.schedule, policy.plan  # back to the class methods
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for key in sorted({(r["mode"], r["k"]) for r in rows}):
        sel = [r for r in rows if (r["mode"], r["k"]) == key]
        out[f"{key[0]} K={key[1]}"] = {
            "steps": len(sel), "wall_ms_median": round(statistics.median(r["wall_ms"] for r in sel), 3),
            "wall_ms_total": round(sum(r["wall_ms"] for r in sel), 1),
            "catch_up_ms_total": round(sum(r["catch_up_ms"] for r in sel), 1),
            "plan_ms_total": round(sum(r["plan_ms"] for r in sel), 2)}
    out["total_ms"] = round(sum(r["wall_ms"] for r in rows), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft-model", required=True)
    ap.add_argument("--concurrency", default="2,32")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    llm = LLM(a.model, speculative_algorithm="eagle3", draft_model=a.draft_model,
              num_draft_tokens=4, max_num_seqs=256, spec_policy="off")
    eng = llm.engine
    _warm_up(eng)
    pols = {n: policy_object(n, eng, 4) for n in ("goodput", "always-4")}
    res = {}
    for c in (int(x) for x in a.concurrency.split(",")):
        n = max(8, c * 2)
        prompts = make_prompts(llm.tokenizer, eng.model_config.vocab_size, n * a.reps, 128, 0)
        for rep in range(a.reps):
            for name in pols if rep % 2 == 0 else reversed(pols):
                rows = run(eng, pols[name], prompts[rep * n:(rep + 1) * n], c)
                res[f"c{c}/{name}/{rep}"] = {"summary": summary(rows), "steps": rows}
                print(f"c={c} {name} rep {rep}: {json.dumps(summary(rows))}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "diag_steps.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
