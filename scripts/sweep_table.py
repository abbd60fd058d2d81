"""Markdown table and issue-4 verdicts from a `gearshift bench sweep` JSON: output tok/s
(acceptance) per policy and concurrency, goodput / best other per point, geometric means
(of policies measured at every c), goodput's K mix, and goodput / best other paired per pass
(same prompts: median and min over passes, a view of the noise); optionally the sweep's PNG
(`--png`). Several JSONs (the halves of one sweep, run in two device calls) are merged
first: each policy's points from every file, by concurrency (`--merged` writes them out).
A `--focus` run (not every policy at every c) shows "-" where a policy did not run.

Usage: python scripts/sweep_table.py sweep.json [more.json ...] [--png sweep.png]
       [--merged all.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+")
    p.add_argument("--png")
    p.add_argument("--merged", help="write the merged sweep JSON here")
    args = p.parse_args()
    res = merge([json.load(open(f))["results"] for f in args.json])
    if args.merged:
        with open(args.merged, "w") as f:
            json.dump({"results": res, "sources": args.json}, f, indent=1)
    pols = list(res)
    others = [q for q in pols if q != "goodput"]
    # a --focus run has not every policy at every c: points are matched by concurrency
    at = {q: {pt["concurrency"]: pt for pt in res[q]} for q in pols}
    concs = sorted({c for q in pols for c in at[q]})
    print("| c | " + " | ".join(pols)
          + " | best other | goodput / best | per pass: median, min | goodput K mix |")
    print("|---:|" + "---:|" * len(pols) + "---|---:|---|---|")
    ratios = []
    for c in concs:
        row = {q: at[q][c] for q in pols if c in at[q]}
        cells = []
        for q in pols:
            pt = row.get(q)
            if pt is None:
                cells.append("-")
                continue
            acc = pt["acceptance_rate"]
            cells.append(f"{pt['output_tok_per_s']:,.0f}" + (f" ({acc:.2f})" if acc is not None else ""))
        best = max((q for q in others if q in row), key=lambda q: row[q]["output_tok_per_s"])
        g = row.get("goodput")
        ratio = g["output_tok_per_s"] / row[best]["output_tok_per_s"] if g else None
        ratios.append(ratio)
        mix = dict(g.get("request_steps_by_k", {})) if g else {}
        if g and g.get("request_steps_tree"):  # request-steps that verified the tree: they
            tree = g["request_steps_tree"]  # count under its depth (max K) in steps_by_k
            deepest = max(mix, key=int)
            mix[deepest] -= tree
            mix = {k: v for k, v in mix.items() if v} | {"tree": tree}
        paired = _paired(row)
        print(f"| {c} | " + " | ".join(cells) + f" | {best} | "
              + (f"**{ratio:.3f}**" if ratio is not None else "-") + " | "
              + (f"{statistics.median(paired):.3f}, {min(paired):.3f}" if paired else "-")
              + f" | {mix} |")
    geo = {q: math.exp(sum(math.log(pt["output_tok_per_s"]) for pt in res[q]) / len(res[q]))
           for q in pols if len(res[q]) == len(concs)}
    print("| geomean | " + " | ".join(f"{geo[q]:,.0f}" if q in geo else "-" for q in pols) + " | | | |")
    if "goodput" in geo:
        beats = {q: geo["goodput"] / v for q, v in geo.items() if q != "goodput"}
        print("\ngoodput geomean / other policies: "
              + ", ".join(f"{q} {r:.3f}" for q, r in beats.items()))
        print(f"goodput >= 0.97 x best at every c: {all(r >= 0.97 for r in ratios if r)}; "
              f"min {min(r for r in ratios if r):.3f}")
        c0 = concs[0]
        if c0 in at.get("off", {}) and c0 in at["goodput"]:
            print(f"goodput / off at c = {c0}: "
                  f"{at['goodput'][c0]['output_tok_per_s'] / at['off'][c0]['output_tok_per_s']:.2f}")
    if args.png:
        from gearshift.bench.sweep import plot

        plot(res, args.png)


def merge(parts: list[dict]) -> dict:
    """{policy: points} of several sweeps, each policy's points sorted by concurrency; a
    concurrency measured in more than one file is an error (which one would stand?)."""
    out: dict[str, dict] = {}
    for res in parts:
        for q, pts in res.items():
            for pt in pts:
                c = pt["concurrency"]
                if c in out.setdefault(q, {}):
                    raise SystemExit(f"{q} at c = {c} is in more than one file")
                out[q][c] = pt
    return {q: [pts[c] for c in sorted(pts)] for q, pts in out.items()}


def _paired(row: dict) -> list[float]:
    """Per pass: goodput's tok/s over the best other policy's in the same pass (the same
    prompts); [] without goodput or per-pass figures."""
    g = row.get("goodput")
    others = [pt["pass_tok_per_s"] for q, pt in row.items() if q != "goodput"]
    if not g or not others or not g.get("pass_tok_per_s"):
        return []
    return [x / max(o[i] for o in others) for i, x in enumerate(g["pass_tok_per_s"])
            if all(i < len(o) for o in others) and max(o[i] for o in others) > 0]


if __name__ == "__main__":
    main()
