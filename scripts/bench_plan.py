"""Host time of the goodput policy per step on this machine's CPU: prepare() (scoring while
the device runs a VERIFY step), plan() + step_topk() and observe(), for a tree-capable
engine's gears (roofline cost model, 600-token contexts, acceptance evidence 0.7 already
recorded, each step observed at its predicted cost), at several batch sizes, scoring every
plan (rescore_every 1) or keeping a steady gear unscored between scorings (the default).
Prints a markdown table.

Usage: python scripts/bench_plan.py [--batch-sizes 1,8,32,128,256] [--steps 2000]
"""

from __future__ import annotations

import argparse
import copy
import time

from gearshift.policy.base import PolicyView
from gearshift.policy.cost import CostModel
from gearshift.policy.goodput import GoodputPolicy
from gearshift.request import Request, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,8,32,128,256")
    ap.add_argument("--steps", type=int, default=2000)
    a = ap.parse_args()
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    prior = CostModel.roofline(16e9, 16e9, 1.3e5, 4, [1, 2, 4, 8, 16, 32, 64, 128, 256],
                               tree_nodes=16)
    default = GoodputPolicy(prior, 4).rescore_every
    print("| batch | rescore_every | prepare us | plan us | observe us | total us | unscored plans |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for bs in sizes:
        reqs = [Request(str(i), [1] * 600, SamplingParams(), 0) for i in range(bs)]
        for r in reqs:
            r.spec_alpha_num, r.spec_alpha_den = 7.0, 10.0
        view = PolicyView(reqs, 0, 4, (70.0, 100.0), 4, (80.0, 100.0, 70.0, 100.0))
        for every in sorted({1, default}):
            cost = copy.deepcopy(prior)
            pol = GoodputPolicy(cost, 4)
            pol.rescore_every = every
            t = [0.0, 0.0, 0.0]
            for i in range(a.steps + 200):  # the first 200: settling, untimed
                t0 = time.perf_counter()
                pol.prepare(view)
                t1 = time.perf_counter()
                k = max(pol.plan(view))
                gear = 5 if pol.step_topk(view) > 1 else k
                t2 = time.perf_counter()
                pol.observe(gear, bs, 600 * bs, cost.predict(gear, bs, 600 * bs))
                t3 = time.perf_counter()
                if i >= 200:
                    t = [t[0] + t1 - t0, t[1] + t2 - t1, t[2] + t3 - t2]
            us = [x / a.steps * 1e6 for x in t]
            print(f"| {bs} | {every} | {us[0]:.1f} | {us[1]:.1f} | {us[2]:.1f} | {sum(us):.1f} "
                  f"| {pol.reused} |")


if __name__ == "__main__":
    main()
