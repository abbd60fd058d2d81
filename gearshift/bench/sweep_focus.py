"""`bench sweep --focus PRIOR.json[,...]`: a confirmation run. At each concurrency it runs
goodput and only the `--focus-top` (2) other policies that came closest to the best in
earlier sweeps, so the same device time buys more passes of the comparisons that decide
issue 4's verdict (goodput >= 0.97 x the best other policy at every c). The earlier sweeps
are the screening: a policy far behind at some c there cannot be that c's best.

    rank at c = mean over the prior sweeps of (policy's tok/s / best other's tok/s at c)

A concurrency that no prior sweep measured runs every policy.

Data flow: prior sweep JSONs -> focus_subsets -> sweep(..., subsets) -> JSON with gaps.
"""

from __future__ import annotations

import json
import statistics


def focus_subsets(paths: list[str], top: int, concurrency: list[int],
                  labels: list[str]) -> dict[int, list[str]]:
    """-> {c: policy labels to run at c}, goodput first, then the `top` best others (in the
    order of `labels`); labels the prior sweeps did not measure at c are not ranked."""
    ratios: dict[int, dict[str, list[float]]] = {}
    for path in paths:
        with open(path) as f:
            results = json.load(f)["results"]
        by_c: dict[int, dict[str, float]] = {}
        for label, points in results.items():
            for p in points:
                by_c.setdefault(p["concurrency"], {})[label] = p["output_tok_per_s"]
        for c, tps in by_c.items():
            others = {k: v for k, v in tps.items() if k != "goodput" and k in labels}
            if not others:
                continue
            best = max(others.values())
            for k, v in others.items():
                ratios.setdefault(c, {}).setdefault(k, []).append(v / best)
    out = {}
    for c in concurrency:
        ranked = ratios.get(c)
        if not ranked:
            out[c] = list(labels)
            continue
        keep = sorted(ranked, key=lambda k: -statistics.mean(ranked[k]))[:top]
        out[c] = [k for k in labels if k == "goodput" or k in keep]
    return out
