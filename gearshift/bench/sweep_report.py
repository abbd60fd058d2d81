"""What a `gearshift bench sweep` says: the markdown table (output tok/s and acceptance per
policy and concurrency, goodput / the best other policy, paired per pass, goodput's K mix,
geometric means), the criteria verdicts, a rich table and the PNG plot. Read by
`bench sweep` itself and by benchmarks/report.py (a partial sweep, cut by a time limit,
shows "-" where a policy has no point). Beside the criteria, goodput / best on the steps
run with all c requests in flight: a finite loop's tail runs below c, longer for policies
whose requests finish at different speeds.

Criteria: at every concurrency goodput >= 0.97 x the best other policy; at c = 1 goodput
>= 1.8 x `off` (speculation pays when the GPU is idle).

Data flow: sweep results {policy: [point per concurrency]} -> table / verdicts / plot.
"""

from __future__ import annotations

import math
import statistics

BEST_RATIO = 0.97  # goodput / the best other policy, at every concurrency
OFF_RATIO_C1 = 1.8  # goodput / off at concurrency 1


def _by_concurrency(results: dict) -> tuple[dict, list[int]]:
    at = {q: {pt["concurrency"]: pt for pt in pts} for q, pts in results.items()}
    return at, sorted({c for q in at for c in at[q]})


def verdicts(results: dict, ref: str = "goodput") -> dict:
    """{"points": [{c, best_other, goodput_over_best, paired_median, paired_min}],
    "min_goodput_over_best", "goodput_within_best" (>= 0.97 at every c goodput ran),
    "goodput_over_off_c1" and "goodput_beats_off_c1" (None without c = 1), "geomean"}.
    `ref`: the policy measured against the others (the keys keep goodput's name)."""
    at, concs = _by_concurrency(results)
    points = []
    for c in concs:
        row = {q: at[q][c] for q in at if c in at[q]}
        others = [q for q in row if q != ref]
        g = row.get(ref)
        if g is None or not others:
            continue
        best = max(others, key=lambda q: row[q]["output_tok_per_s"])
        paired = _paired(row, ref)
        points.append({"concurrency": c, "best_other": best,
                       "goodput_over_best": g["output_tok_per_s"] / row[best]["output_tok_per_s"],
                       "paired_median": statistics.median(paired) if paired else None,
                       "paired_min": min(paired) if paired else None, **_at_c(row, ref)})
    ratios = [p["goodput_over_best"] for p in points]
    c1 = at.get(ref, {}).get(1), at.get("off", {}).get(1)
    off_ratio = c1[0]["output_tok_per_s"] / c1[1]["output_tok_per_s"] if None not in c1 else None
    geo = {q: math.exp(statistics.fmean(math.log(pt["output_tok_per_s"]) for pt in at[q].values()))
           for q in at if len(at[q]) == len(concs)}
    return {"points": points, "min_goodput_over_best": min(ratios) if ratios else None,
            "goodput_within_best": bool(ratios) and min(ratios) >= BEST_RATIO,
            "goodput_over_off_c1": off_ratio,
            "goodput_beats_off_c1": None if off_ratio is None else off_ratio >= OFF_RATIO_C1,
            "geomean": geo}


def _at_c(row: dict, ref: str) -> dict:
    """`ref`'s tok/s over the best other's on the steps run with all c requests in flight
    (the loop's tail apart: sweep_point.py), and the share of `ref`'s time they took;
    None where a point lacks them."""
    tps = {q: pt.get("at_c_tok_per_s") for q, pt in row.items()}
    g = row[ref]
    ratio = tps[ref] / max(v for q, v in tps.items() if q != ref) if all(tps.values()) else None
    share = g["at_c_s"] / g["elapsed_s"] if g.get("at_c_s") is not None and g.get("elapsed_s") \
        else None
    return {"at_c_over_best": ratio, "at_c_share": share}


def _paired(row: dict, ref: str = "goodput") -> list[float]:
    """Per pass: `ref`'s tok/s over the best other policy's in the same pass (the same
    prompts); [] without `ref` or per-pass figures."""
    g = row.get(ref)
    others = [pt["pass_tok_per_s"] for q, pt in row.items() if q != ref]
    if not g or not others or not g.get("pass_tok_per_s"):
        return []
    return [x / max(o[i] for o in others) for i, x in enumerate(g["pass_tok_per_s"])
            if all(i < len(o) for o in others) and max(o[i] for o in others) > 0]


def k_mix(point: dict) -> dict:
    """Goodput's request-steps by K, its tree steps apart (they count under max K)."""
    mix = {str(k): v for k, v in point.get("request_steps_by_k", {}).items()}
    tree = point.get("request_steps_tree") or 0
    if tree and mix:
        deepest = max(mix, key=int)
        mix[deepest] -= tree
        mix = {k: v for k, v in mix.items() if v} | {"tree": tree}
    return mix


def markdown_table(results: dict, ref: str = "goodput") -> str:
    """Output tok/s (acceptance) per policy and concurrency, with `ref`'s verdict per row."""
    at, concs = _by_concurrency(results)
    pols = list(results)
    v = verdicts(results, ref)
    per_c = {p["concurrency"]: p for p in v["points"]}
    lines = ["| c | " + " | ".join(pols) + f" | best other | {ref} / best "
             f"| per pass: median, min | {ref} K mix | at c: {ref} / best (its time at c) |",
             "|---:|" + "---:|" * len(pols) + "---|---:|---|---|---|"]
    for c in concs:
        cells = []
        for q in pols:
            pt = at[q].get(c)
            acc = pt and pt.get("acceptance_rate")
            cells.append("-" if pt is None else f"{pt['output_tok_per_s']:,.0f}"
                         + (f" ({acc:.2f})" if acc is not None else ""))
        p = per_c.get(c)
        g = at.get(ref, {}).get(c)
        paired = (f"{p['paired_median']:.3f}, {p['paired_min']:.3f}"
                  if p and p["paired_median"] is not None else "-")
        lines.append(f"| {c} | " + " | ".join(cells) + " | "
                     + (f"{p['best_other']} | **{p['goodput_over_best']:.3f}**" if p else "- | -")
                     + f" | {paired} | " + (_mix_text(k_mix(g)) if g else "-")
                     + f" | {_at_c_text(p)} |")
    geo = v["geomean"]
    lines.append("| geomean | " + " | ".join(f"{geo[q]:,.0f}" if q in geo else "-" for q in pols)
                 + " | | | | | |")
    return "\n".join(lines)


def _at_c_text(p: dict | None) -> str:
    if not p or p.get("at_c_over_best") is None:
        return "-"
    share = p.get("at_c_share")
    return f"{p['at_c_over_best']:.3f}" + (f" ({share:.0%})" if share is not None else "")


def _mix_text(mix: dict) -> str:
    return ", ".join(f"{k}: {n}" for k, n in mix.items()) or "-"


def verdict_lines(v: dict, judged: bool = True) -> list[str]:
    """The criteria in words, one line each; not `judged`: the ratios alone."""
    def verdict(ok: bool) -> str:
        return ("PASS" if ok else "FAIL") if judged else "not judged here"

    lines = []
    if v["min_goodput_over_best"] is not None:
        lines.append(f"goodput >= {BEST_RATIO} x the best other policy at every concurrency: "
                     f"{verdict(v['goodput_within_best'])} "
                     f"(min {v['min_goodput_over_best']:.3f})")
    if v["goodput_over_off_c1"] is not None:
        lines.append(f"goodput >= {OFF_RATIO_C1} x off at c = 1: "
                     f"{verdict(v['goodput_beats_off_c1'])} "
                     f"({v['goodput_over_off_c1']:.2f})")
    return lines


def print_table(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="output tok/s by concurrency (acceptance)")
    t.add_column("policy")
    _, concs = _by_concurrency(results)
    for c in concs:
        t.add_column(str(c), justify="right")
    for name, pts in results.items():
        at = {p["concurrency"]: p for p in pts}  # a cut sweep: not every policy at every c
        t.add_row(name, *[f"{at[c]['output_tok_per_s']:.0f}" + (
            f" ({at[c]['acceptance_rate']:.2f})" if at[c]["acceptance_rate"] is not None
            else "") if c in at else "-" for c in concs])
    Console().print(t)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, pts in results.items():
        xs = [p["concurrency"] for p in pts]
        a.plot(xs, [p["output_tok_per_s"] for p in pts], marker="o", label=name)
        b.plot(xs, [p["tpot_ms_median"] for p in pts], marker="o", label=name)
    concs = sorted({p["concurrency"] for pts in results.values() for p in pts})
    for ax, title in ((a, "output tokens/s"), (b, "time per output token (ms, median)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    a.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
