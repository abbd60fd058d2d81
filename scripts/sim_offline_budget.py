"""Issue 2's offline run (256 prompts, 512 in / 256 out, <= 64 running) simulated on the CPU:
the real Scheduler plans every step, and a step's time comes from a cost model fitted to
the H200 (session 8's `scripts/exp_token_budget.py`, Llama-3.1-8B shape, dummy bf16):

    step ms = base + per_dec * decoders + pf_small * min(p, knee) + pf_big * max(p - knee, 0)

where p is the step's prefill tokens. At budgets 128 / 192 / 256 / 2048 it reproduces the
measured step counts, mixed-step counts and mean running exactly, and tok/s within 2%
(5,563 / 6,748 / 7,032 / 7,098 against 5,450 / 6,660 / 7,040 / 6,960).

It asks two questions:
- what a step-budget policy can gain: fixed budgets, a budget that grows while few
  requests decode, or decoders + a fixed number of prefill tokens;
- which kernel speed-ups, in the model's terms, reach 8,000 tok/s.

    python scripts/sim_offline_budget.py [--what-if]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.request import Request, SamplingParams  # noqa: E402
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool  # noqa: E402
from gearshift.scheduler.scheduler import Scheduler  # noqa: E402

H200 = dict(base=4.5, per_dec=0.030, pf_small=0.015, pf_big=0.0205, knee=256)
# session 17's final code: batch-1 decode 4.24 ms, 64-row decode 5.83 ms, the 512-token
# mixed step 13.8 ms (prefill slopes scaled from session 8's by its 452-token chunk)
H200_S17 = dict(base=4.24, per_dec=0.0248, pf_small=0.0154, pf_big=0.021, knee=256)
COSTS = {"s8": H200, "s17": H200_S17}


def step_ms(plan, base, per_dec, pf_small, pf_big, knee) -> float:
    d = sum(1 for n, s in zip(plan.extend_lens, plan.sample) if n == 1 and s)
    p = sum(plan.extend_lens) - d
    return base + per_dec * d + pf_small * min(p, knee) + pf_big * max(0, p - knee)


def decoders(s: Scheduler) -> int:
    return sum(1 for r in s.running if r.num_computed_tokens >= len(r.prompt_token_ids))


def simulate(budget, costs: dict, num_prompts=256, input_len=512, output_len=256,
             max_num_seqs=64) -> dict:
    """budget(scheduler) -> this step's token budget. Plenty of KV: no preemption (as measured)."""
    slots = SlotPool(num_prompts * (input_len + output_len) + 1)
    rows = ReqRowPool(max_num_seqs)
    s = Scheduler(slots, rows, max_num_seqs=max_num_seqs, max_num_batched_tokens=1,
                  max_model_len=input_len + output_len)
    for i in range(num_prompts):
        s.add(Request(f"r{i}", list(range(1, input_len + 1)),
                      SamplingParams(max_tokens=output_len, ignore_eos=True), 0))
    ms, steps, mixed, running = 0.0, 0, 0, []
    while s.has_unfinished():
        s.max_num_batched_tokens = budget(s)
        running.append(len(s.running))
        plan = s.schedule()
        for r, n in zip(plan.reqs, plan.extend_lens):  # what BatchBuilder.prepare allocates
            if r.req_pool_index < 0:
                r.req_pool_index = rows.alloc()
            r.slots.extend(slots.alloc(n))
        ms += step_ms(plan, **costs)
        steps += 1
        mixed += plan.mode.name == "EXTEND"
        s.commit(plan, [1] * len(plan.reqs))
    return {"tok_per_s": num_prompts * output_len / ms * 1e3, "steps": steps, "mixed": mixed,
            "mean_running": statistics.fmean(running), "seconds": ms / 1e3}


POLICIES = {
    **{f"budget {b}": (lambda s, b=b: b) for b in (128, 192, 256, 384, 512, 2048)},
    **{f"2048 while < {t} decode, else 256": (lambda s, t=t: 2048 if decoders(s) < t else 256)
       for t in (16, 32, 48)},
    **{f"decoders + {p}": (lambda s, p=p: decoders(s) + p) for p in (192, 256, 320)},
}
WHAT_IF = {
    "as measured": {},
    "base 4.2 ms": dict(base=4.2),
    "24 us per decoder": dict(per_dec=0.024),
    "prefill 13 / 18 us": dict(pf_small=0.013, pf_big=0.018),
    "base 4.2 + 24 us per decoder": dict(base=4.2, per_dec=0.024),
    "all three": dict(base=4.2, per_dec=0.024, pf_small=0.013, pf_big=0.018),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--what-if", action="store_true", help="kernel speed-ups x three policies")
    p.add_argument("--costs", choices=sorted(COSTS), default="s8",
                   help="step-cost fit: session 8's (the what-if's base) or session 17's")
    a = p.parse_args()
    print("| policy | tok/s | steps | mixed steps | mean running |\n|---|---:|---:|---:|---:|")
    for name, fn in POLICIES.items():
        r = simulate(fn, COSTS[a.costs])
        print(f"| {name} | {r['tok_per_s']:,.0f} | {r['steps']} | {r['mixed']} | {r['mean_running']:.1f} |")
    if a.what_if:
        names = ("budget 256", "budget 384", "decoders + 256")
        print(f"\n| cost change | {' | '.join(names)} |\n|---|" + "---:|" * len(names))
        for label, change in WHAT_IF.items():
            tps = [simulate(POLICIES[n], H200 | change)["tok_per_s"] for n in names]
            print(f"| {label} | " + " | ".join(f"{t:,.0f}" for t in tps) + " |")


if __name__ == "__main__":
    main()
