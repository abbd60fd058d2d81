"""The table of an A/B call (benchmarks/ab.sh): each sweep point of this checkout ("new")
beside the other tree ("old"), from $OUT/ab_{new,old}.json and their step traces:

    python benchmarks/ab_report.py OUT      # markdown on stdout

Per (policy, concurrency): output tok/s of each side and new / old, acceptance, and from
the trace windows of the point's passes the VERIFY step's median wall ms and, on CUDA, its
wall outside the device span (host work not hidden).

Data flow: OUT/{meta.json, ab_*.json, trace_*.jsonl} -> rows() -> markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_report import load, summarize  # noqa: E402

SIDES = ("new", "old")


def point_trace(out: Path, side: str, point: dict) -> dict:
    """The trace figures of one sweep point: its passes' windows cut out of the side's trace."""
    path = out / f"trace_{side}.jsonl"
    windows = [tuple(w) for w in point.get("windows", [])]
    if not path.is_file() or not windows:
        return {}
    return summarize(load(path, windows))


def rows(out: Path) -> list[dict]:
    sweeps = {s: json.loads((out / f"ab_{s}.json").read_text()) for s in SIDES
              if (out / f"ab_{s}.json").is_file()}
    found = []
    for policy, points in sweeps.get("new", {}).get("results", {}).items():
        for new in points:
            old = next((p for p in sweeps.get("old", {}).get("results", {}).get(policy, [])
                        if p["concurrency"] == new["concurrency"]), None)
            row = {"policy": policy, "c": new["concurrency"]}
            for side, p in (("new", new), ("old", old)):
                if p is None:
                    continue
                verify = point_trace(out, side, p)
                row[side] = {"tok_s": p["output_tok_per_s"], "acc": p.get("acceptance_rate"),
                             "verify_ms": verify.get("modes", {}).get("verify", {}).get("ms_median"),
                             "host_ms": verify.get("verify_timing", {}).get("host_ms")}
            found.append(row)
    return found


def _f(x, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def table(found: list[dict], meta: dict) -> str:
    lines = [f"A/B, commit {meta.get('commit', '?')} (new) against the other tree (old); "
             f"device: {meta.get('gpu') or 'cpu'}.", "",
             "| policy | c | tok/s new | tok/s old | new / old | acceptance new / old "
             "| VERIFY wall ms new / old | host not hidden ms new / old |",
             "|---|---:|---:|---:|---:|---|---|---|"]
    for r in found:
        new, old = r.get("new", {}), r.get("old", {})
        ratio = new["tok_s"] / old["tok_s"] if new and old and old["tok_s"] else None
        lines.append(
            f"| {r['policy']} | {r['c']} | {_f(new.get('tok_s'), '{:,.0f}')} | "
            f"{_f(old.get('tok_s'), '{:,.0f}')} | {_f(ratio, '{:.3f}')} | "
            f"{_f(new.get('acc'))} / {_f(old.get('acc'))} | "
            f"{_f(new.get('verify_ms'))} / {_f(old.get('verify_ms'))} | "
            f"{_f(new.get('host_ms'))} / {_f(old.get('host_ms'))} |")
    if not found:
        lines.append("| (no sweep results) | | | | | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the folder benchmarks/ab.sh wrote")
    args = p.parse_args(argv)
    meta_path = args.out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    found = rows(args.out)
    sys.stdout.write(table(found, meta))
    return 0 if found and all("old" in r for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
