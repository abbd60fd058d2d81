"""The "Goodput on the CPU" section of docs/benchmarks.md, from the folder benchmarks/cpu.sh
wrote: per concurrency, each policy's better pass (best of 2, the passes interleaved), goodput
against the best of off / always-2 / always-4 and against off, and the transition workload's
phases. Criteria (the embedded model on a CPU): goodput >= 0.90 x the best other policy at
batch 1 and 4, >= 1.3 x off at batch 1.

    python benchmarks/cpu_report.py OUT        # prints the section (markdown)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BEST_RATIO, OFF_RATIO_C1 = 0.90, 1.3
PHASES = ("code", "words", "code")


def best_of(point: dict) -> float:
    return max(point["pass_tok_per_s"])


def uniform_rows(results: dict) -> list[dict]:
    rows = []
    for j, g in enumerate(results["goodput"]):
        tps = {q: best_of(pts[j]) for q, pts in results.items()}
        others = {q: v for q, v in tps.items() if q != "goodput"}
        best = max(others, key=others.get)
        rows.append({"c": g["concurrency"], "tps": tps, "best": best,
                     "ratio": tps["goodput"] / others[best],
                     "over_off": tps["goodput"] / tps["off"],
                     "acc": {q: pts[j].get("acceptance_rate") for q, pts in results.items()}})
    return rows


def cell(tps: float, acc: float | None) -> str:
    return f"{tps:,.0f}" + (f" ({acc:.2f})" if acc is not None else "")


def section(out: Path) -> str:
    meta = json.loads((out / "meta.json").read_text())
    uni = json.loads((out / "uniform.json").read_text())
    pols = list(uni["results"])
    rows = uniform_rows(uni["results"])
    lines = ["## Goodput on the CPU (embedded default model)", "",
             "The README's engine: the embedded default model and its EAGLE-3 head, goodput "
             "by default, chains up to K = 4; fp32, torch attention. Code prompts (128-token "
             "windows of the held-out corpus), 128 greedy tokens each; a closed loop at "
             "concurrency c (4 requests a pass), every policy interleaved, two passes in "
             "alternating order: each policy's better pass (best of 2). In brackets: accepted / "
             "proposed drafts.", "",
             f"- device: {meta['cpu']}, torch {meta['torch']}; date: {meta['started'][:10]}; "
             f"commit: `{meta['commit'][:7]}`",
             "- command: `OUT=cpu bash benchmarks/cpu.sh && python benchmarks/cpu_report.py cpu`",
             "",
             "| c | " + " | ".join(pols) + " | best other | goodput / best | goodput / off |",
             "|---:|" + "---:|" * len(pols) + "---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['c']} | " + " | ".join(cell(r["tps"][q], r["acc"][q]) for q in pols)
                     + f" | {r['best']} | **{r['ratio']:.3f}** | {r['over_off']:.2f} |")
    lines.append("")
    worst = min(r["ratio"] for r in rows)
    lines.append(f"- goodput >= {BEST_RATIO} x the best other policy at every c: "
                 f"{'PASS' if worst >= BEST_RATIO else 'FAIL'} (min {worst:.3f})")
    c1 = next((r for r in rows if r["c"] == 1), None)
    if c1 is not None:
        lines.append(f"- goodput >= {OFF_RATIO_C1} x off at c = 1: "
                     f"{'PASS' if c1['over_off'] >= OFF_RATIO_C1 else 'FAIL'} "
                     f"({c1['over_off']:.2f})")
    trans = out / "transition.json"
    if trans.is_file():
        lines += ["", "The transition workload (`--workload transition`): code, then random "
                  "words sampled at temperature 1.2 (drafts mostly rejected), then code again, "
                  "one closed loop per "
                  "policy with nothing reset between phases; each phase's tok/s (best of 2) "
                  "against the best fixed policy of that phase. On the GPU bench pair the "
                  "criterion is >= 0.95 in every phase; here the ratios only.", "",
                  "| c | phase | " + " | ".join(pols) + " | best fixed | goodput / best |",
                  "|---:|---|" + "---:|" * len(pols) + "---|---:|"]
        res = json.loads(trans.read_text())["results"]
        for j, row in enumerate(res["goodput"]):
            for p, name in enumerate(PHASES):
                tps = {q: best_of(res[q][j]["phases"][p]) for q in pols}
                acc = {q: res[q][j]["phases"][p].get("acceptance_rate") for q in pols}
                fixed = {q: v for q, v in tps.items() if q != "goodput"}
                best = max(fixed, key=fixed.get)
                lines.append(f"| {row['concurrency']} | {p + 1}: {name} | "
                             + " | ".join(cell(tps[q], acc[q]) for q in pols)
                             + f" | {best} | **{tps['goodput'] / fixed[best]:.3f}** |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, section=section, doc: str = __doc__) -> int:
    """`python <report>.py OUT`: prints `section(OUT)` (hybrid_report.py's main too)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(doc)
        return 2
    print(section(Path(args[0])), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
