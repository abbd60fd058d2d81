"""The tensor-parallel section of docs/benchmarks.md from what benchmarks/h200_tp.sh wrote:
decode steps at TP ranks against one GPU, offline throughput, the 70B preset, the policy
sweep, the greedy check and the fault, each with its command. Prints markdown.

Usage: python benchmarks/tp_report.py OUT > section.md

Data flow: h200_tp.sh -> OUT/{meta_tp,steps}.json(l), OUT/*.json, OUT/load_70b.log -> stdout.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _json(out: Path, name: str) -> dict | None:
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _ms(x) -> str:
    return "—" if x is None else f"{x:.2f} ms"


def _decode_rows(tp1: dict | None, tpn: dict | None, tp: int) -> list[str]:
    by1 = {r["batch_size"]: r for r in (tp1 or {}).get("decode_by_batch", [])}
    rows = []
    for r in (tpn or {}).get("decode_by_batch", []):
        one = by1.get(r["batch_size"], {}).get("step_ms_median")
        mine = r["step_ms_median"]
        ratio = f"{mine / one:.2f}x" if one and mine else "—"
        rows.append(f"| decode step, batch {r['batch_size']} | {_ms(one)} | {_ms(mine)} | {ratio} |")
    return rows or [f"| decode step | — | — | not measured at TP={tp} |"]


def main(out: Path) -> int:
    from gearshift.bench.sweep_report import markdown_table, verdict_lines, verdicts

    meta = _json(out, "meta_tp") or {}
    tp = meta.get("tensor_parallel_size", 2)
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()
             if line.strip()] if (out / "steps.jsonl").is_file() else []
    lines = [f"## Tensor parallelism (TP={tp})", ""]
    if meta.get("smoke"):
        lines += ["> **Smoke run** (CPU, toy sizes): the figures say nothing about a GPU.", ""]
    lines += [f"Device {meta.get('gpu') or 'CPU'}, {meta.get('started', '?')}, commit "
              f"`{meta.get('commit', '?')}`.", "",
              f"| figure | one GPU | TP={tp} | TP / one |", "|---|---:|---:|---:|"]
    lines += _decode_rows(_json(out, "decode_tp1"), _json(out, "decode_tp"), tp)
    offline = _json(out, "offline_tp")
    if offline:
        lines.append(f"| offline throughput ({offline['num_prompts']} x {offline['input_len']} in"
                     f" / {offline['output_len']} out) | | {offline['output_tok_per_s']:,.0f} "
                     "tok/s | |")
    big = _json(out, "load_70b")
    if big:
        log = (out / "load_70b.log").read_text() if (out / "load_70b.log").is_file() else ""
        loaded = re.search(r"loaded dummy weights \(([\d.]+) GiB\) in ([\d.]+) s", log)
        shape = big["env"]["model_shape"]
        lines += ["", f"70B preset ({shape['layers']} layers, hidden {shape['hidden']}), "
                      f"TP={tp}: " + (f"{loaded.group(1)} GiB a rank loaded in {loaded.group(2)} s"
                                      if loaded else "loaded") + "; decode step "
                  + ", ".join(f"{_ms(r['step_ms_median'])} at batch {r['batch_size']}"
                              for r in big["decode_by_batch"]) + "."]
    sweep = _json(out, "sweep_tp")
    if sweep:
        lines += ["", f"Speculation sweep at TP={tp}:", "", markdown_table(sweep["results"]), ""]
        lines += verdict_lines(verdicts(sweep["results"]))
    greedy = _json(out, "greedy_tp")
    if greedy:
        n = greedy["prompts"] + greedy["solo"]
        lines += ["", f"Greedy outputs of goodput equal plain decoding at TP={tp} "
                      f"({greedy['dtype']}): {n - len(greedy['differ'])} of {n} "
                      f"({greedy['proposed']} drafts proposed, {greedy['accepted']} accepted)."]
    fault = _json(out, "fault_tp")
    if fault:
        lines += ["", f"Rank {tp - 1} killed under {fault['requests']} streamed requests: the "
                      f"server exited with code {fault['exit_code']} after "
                      f"{fault['seconds_to_exit']} s; {fault['streams_ended']} of "
                      f"{fault['requests']} streams ended."]
    lines += ["", "Commands (as run; $OUT is the output folder):", ""]
    lines += [f"- {s['step']} (exit {s['exit']}, {s['seconds']} s): "
              f"`{s['command'].replace(str(out), '$OUT')}`" for s in steps]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
