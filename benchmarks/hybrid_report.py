"""The "A proposer per request" section of docs/benchmarks.md, from the folder
benchmarks/h200_hybrid.sh wrote: per workload and concurrency, the hybrid (eagle3+suffix,
goodput picks the proposer and K per request) against EAGLE-3 alone and suffix decoding
alone, tok/s of each policy's better pass, the proposer mix, and the criteria (judged on a
GPU run only; a smoke or CPU run prints the ratios). "at c": hybrid / model-only over the
time every one of the c requests was running (both passes), the steady state a closed loop
with refills would see: one round refills no slot, and the slowest requests' tail sets a
point's time.

    python benchmarks/hybrid_report.py OUT     # prints the section (markdown)

OUT may also be benchmarks/cpu.sh's folder: the same section for the CPU default pair.
"""

from __future__ import annotations

import json
from pathlib import Path

import cpu_report
from cpu_report import best_of, cell

from gearshift.bench.hybrid import HYBRID_POLICIES

# workload file -> (label, the ratio the criterion reads, its bar, the c it is judged at)
CRITERIA = {
    "agentic": ("agentic (edit loops that copy their input)", "over_model", 1.5, (1, 8)),
    "novel": ("novel text (corpus windows)", "over_model", 0.97, (1, 8, 64)),
    "mixed_agentic": ("mixed-agentic (half each)", "over_best", 1.15, (8, 32)),
}
LABEL = {"over_model": "hybrid / model-only", "over_best": "hybrid / best single"}


def rows(results: dict) -> list[dict]:
    """Per concurrency: each policy's better pass, the two ratios and the proposer mix."""
    at = {q: {p["concurrency"]: p for p in pts} for q, pts in results.items()}
    out = []
    for c, h in sorted(at["hybrid"].items()):
        tps = {q: best_of(at[q][c]) for q in HYBRID_POLICIES if c in at.get(q, {})}
        acc = {q: at[q][c].get("acceptance_rate") for q in tps}
        picks = h.get("proposer_steps") or {}
        singles = [v for q, v in tps.items() if q != "hybrid"]
        at_c = [at[q][c].get("at_c_tok_per_s") for q in ("hybrid", "model-only")]
        out.append({"c": c, "tps": tps, "acc": acc,
                    "at_c": at_c[0] / at_c[1] if all(at_c) else None,
                    "over_model": tps["hybrid"] / tps["model-only"],
                    "over_best": tps["hybrid"] / max(singles),
                    "suffix_share": picks.get("suffix", 0) / max(sum(picks.values()), 1)})
    return out


def section(out: Path) -> str:
    meta = json.loads((out / "meta.json").read_text())
    steps = {}
    if (out / "steps.jsonl").is_file():
        for line in (out / "steps.jsonl").read_text().splitlines():
            s = json.loads(line)
            steps[s["step"]] = s
    judged = bool(meta.get("gpu")) and not meta.get("smoke")
    on_cpu = "cpu" in meta  # benchmarks/cpu.sh's folder: the embedded default pair, toy size
    command = ("OUT=cpu bash benchmarks/cpu.sh && python benchmarks/hybrid_report.py cpu"
               if on_cpu else "OUT=out bash benchmarks/h200_hybrid.sh && "
               "python benchmarks/hybrid_report.py out")
    device = (f"{meta['cpu']}, torch {meta['torch']}" if on_cpu else meta.get("gpu") or "CPU")
    title = "## A proposer per request (hybrid" + (", CPU)" if on_cpu else ", GPU)" if judged else ")")
    lines = [title, "",
             "`--speculative-algorithm eagle3+suffix`: each step goodput prices, per request, "
             "EAGLE-3's chain or tree against a suffix-decoding draft (the request's prompt and "
             "output plus recent outputs, no model) and picks the proposer and K. One engine "
             "compares three policies, interleaved, 2 passes (better pass shown): `hybrid`, "
             "`model-only` (EAGLE-3 alone, goodput) and `suffix-only`. In brackets: accepted / "
             "proposed drafts; suffix share: request-steps the hybrid drafted by suffix "
             "decoding; at c: hybrid / model-only while all c requests ran (with one round, "
             "no slot is refilled and the slowest requests' tail sets a point's time).", "",
             f"- device: {device}; date: {meta['started'][:10]}; "
             f"commit: `{str(meta['commit'])[:7]}`", f"- command: `{command}`", ""]
    verdicts = []
    for name, (label, key, bar, judged_at) in CRITERIA.items():
        path = out / f"{name}.json"
        if not path.is_file():
            lines += [f"{label}: did not run.", ""]
            continue
        data = json.loads(path.read_text())
        cmd = steps.get(name, {}).get("command")
        lines += [f"**{label}**" + (f": `{cmd}`" if cmd else ""), "",
                  "| c | " + " | ".join(HYBRID_POLICIES)
                  + " | hybrid / model-only | hybrid / best single | suffix share | at c |",
                  "|---:|" + "---:|" * (len(HYBRID_POLICIES) + 4)]
        for r in rows(data["results"]):
            lines.append(f"| {r['c']} | " + " | ".join(
                cell(r["tps"][q], r["acc"][q]) if q in r["tps"] else "-"
                for q in HYBRID_POLICIES)
                + f" | {r['over_model']:.3f} | {r['over_best']:.3f} | {r['suffix_share']:.2f} | "
                + (f"{r['at_c']:.3f} |" if r["at_c"] is not None else "- |"))
            if r["c"] in judged_at:
                verdicts.append((label, r["c"], key, bar, r[key]))
        lines.append("")
    for label, c, key, bar, v in verdicts:
        verdict = ("PASS" if v >= bar else "FAIL") if judged else "not judged off the GPU"
        lines.append(f"- {label}, c = {c}: {LABEL[key]} >= {bar}: {verdict} ({v:.3f})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return cpu_report.main(argv, section, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
