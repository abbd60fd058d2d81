"""Host time of the goodput policy per step on this machine's CPU: plan() + step_topk()
+ observe() for a tree-capable engine's gears (roofline cost model, 600-token contexts,
acceptance evidence already recorded), at several batch sizes. Prints a markdown table.

Usage: python scripts/bench_plan.py [--batch-sizes 1,8,32,128,256] [--steps 2000]
"""

from __future__ import annotations

import argparse
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
    cost = CostModel.roofline(16e9, 16e9, 1.3e5, 4, [1, 2, 4, 8, 16, 32, 64, 128, 256],
                              tree_nodes=16)
    print("| batch | topk | plan + observe, us |\n|---:|---:|---:|")
    for bs in sizes:
        reqs = [Request(str(i), [1] * 600, SamplingParams(), 0) for i in range(bs)]
        for r in reqs:
            r.spec_alpha_num, r.spec_alpha_den = 7.0, 10.0
        for topk in (1, 4):
            pol = GoodputPolicy(cost, 4)
            view = PolicyView(reqs, 0, 4, (70.0, 100.0), topk, (80.0, 100.0))
            t0 = time.perf_counter()
            for _ in range(a.steps):
                ks = pol.plan(view)
                pol.step_topk(view)
                pol.observe(max(ks), bs, 600 * bs, 7.0)
            print(f"| {bs} | {topk} | {(time.perf_counter() - t0) / a.steps * 1e6:.0f} |")


if __name__ == "__main__":
    main()
