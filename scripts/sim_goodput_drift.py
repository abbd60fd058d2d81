"""Goodput's gear choices under a step-time drift shared by every gear (CPU simulation).

Costs: the H200 warm-up's table for the 8B bench pair (session 9, call D; ms per step at
batch 1..16, gears 0..4), measured again at start-up with 3% noise. Every speculative step's
true cost is the table's times a drift that rises linearly to `--drift` over the first 150
steps, then holds (plain decode, timed on the device, does not drift); each measurement
has 3% noise. Per (batch size, acceptance): the steps goodput ran at each gear over 20 seeds x
600 steps, and its throughput against the best fixed gear.

    python scripts/sim_goodput_drift.py [--drift 1.25] [--shared 0] [--share-after 16]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.policy.base import PolicyView  # noqa: E402
from gearshift.policy.cost import CostModel  # noqa: E402
from gearshift.policy.goodput import GoodputPolicy, expected_tokens  # noqa: E402
from gearshift.request import Request, SamplingParams  # noqa: E402

SIZES = [1, 2, 4, 8, 16]
TABLE = {0: [4.65, 4.72, 4.70, 4.76, 4.80], 1: [6.18, 6.49, 6.96, 6.90, 7.39],
         2: [6.43, 6.41, 6.83, 7.12, 7.74], 3: [6.72, 6.92, 7.06, 7.21, 7.75],
         4: [7.05, 7.17, 7.55, 7.83, 8.26]}


def requests(n: int, alpha: float) -> list[Request]:
    out = []
    for i in range(n):
        r = Request(str(i), [1] * 100, SamplingParams(), 0)
        r.spec_alpha_num, r.spec_alpha_den = 1000 * alpha, 1000.0
        out.append(r)
    return out


def run(seed: int, bs: int, alpha: float, args) -> tuple[list[int], float]:
    rnd = random.Random(seed)
    cost = CostModel(shared=args.shared)
    for k, ys in TABLE.items():
        cost.set_measured(k, [[s, y * (1 + rnd.gauss(0, 0.03))] for s, y in zip(SIZES, ys)])
        cost.attn_ms_per_token[k] = 0.0
    pol = GoodputPolicy(cost, 4, share_after=args.share_after)
    rs, i = requests(bs, alpha), SIZES.index(bs)
    ks, tokens, ms = [], 0.0, 0.0
    for t in range(args.steps):
        drift = 1 + (args.drift - 1) * min(t / 150, 1)
        k = pol.plan(PolicyView(rs, 0, 4))[0]
        true = TABLE[k][i] * (drift if k else 1.0)
        pol.observe(k, bs, 0, true * (1 + rnd.gauss(0, 0.03)))
        ks.append(k)
        tokens += bs * expected_tokens(alpha, k)
        ms += true
    best = max(bs * expected_tokens(alpha, k) * args.steps
               / sum(TABLE[k][i] * (1 + (args.drift - 1) * min(t / 150, 1))
                     for t in range(args.steps)) for k in range(1, 5))
    return ks, tokens / ms / best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drift", type=float, default=1.25)
    p.add_argument("--shared", type=float, default=CostModel.shared)
    p.add_argument("--share-after", type=int, default=16)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--seeds", type=int, default=20)
    args = p.parse_args()
    for bs in (2, 8, 16):
        for alpha in (0.7, 0.8):
            counts, eff = {}, 0.0
            for s in range(args.seeds):
                ks, e = run(s, bs, alpha, args)
                eff += e / args.seeds
                for k in ks:
                    counts[k] = counts.get(k, 0) + 1
            print(f"bs {bs:2d} a {alpha}: steps by gear {dict(sorted(counts.items()))}, "
                  f"throughput / best fixed gear {eff:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
