"""Step traces side by side (`--step-trace PATH` of `gearshift serve` / `bench ...`): where a
served run's time goes against the engine's closed loop at the same concurrency.

    python benchmarks/trace_report.py served.jsonl closed.jsonl
    python benchmarks/trace_report.py served.jsonl@START:END closed.jsonl@S1:E1,S2:E2

`@START:END` (Unix seconds, comma-separated for several) keeps the steps that started in
those windows: one run out of a server's long trace, or a sweep point's passes (its
`windows` in the sweep JSON).

Per trace, a markdown column: output tok/s over the traced span, the share of that span
in host gaps between steps (the caller's work), how many requests a step ran with (mean
weighted by wall time, and max: the ramp and tail of a run read below c), steps and
median / p90 wall ms per mode, median device ms, on CUDA a VERIFY step's draft device
time, device span and the wall time outside that span (host work not hidden), where a
VERIFY step's host time goes (its clock once planned, at the catch-up's launch,
verification's launch and the sync; apart for steps with a prefill chunk riding along), VERIFY
steps' K mix (request-steps by K; trees apart), the steps that carried a prefill chunk:
how many, and how many of those speculated, how long new requests waited for their first
chunk (from arrival at the engine: behind the step in flight, or queued), what arrivals
cost the decoders (`arrivals`), and the graphs captured, Triton kernels compiled and
few-row GEMM shapes timed after the warm-up (one-off stalls: runner/serving_watch.py).

Data flow: JSONL lines (gearshift/engine/step_trace.py) -> summarize() -> table().
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's gearshift, whatever else is installed

from gearshift.bench import percentile  # noqa: E402


def load(path: Path, windows: list[tuple[float, float]] | None = None) -> list[dict]:
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if windows is None:
        return steps
    return [s for s in steps if any(a <= s["ts"] <= b for a, b in windows)]


def parse_spec(spec: str) -> tuple[Path, list[tuple[float, float]] | None]:
    """'PATH' or 'PATH@START:END[,START:END...]' -> (path, windows or None)."""
    path, at, rest = spec.rpartition("@")
    if not at:
        return Path(spec), None
    try:
        windows = [tuple(float(x) for x in w.split(":")) for w in rest.split(",")]
    except ValueError:
        windows = []
    if not windows or any(len(w) != 2 or w[0] > w[1] for w in windows):
        raise ValueError(f"bad window {rest!r} (START:END in Unix seconds, START <= END)")
    return Path(path), windows


def summarize(steps: list[dict]) -> dict:
    """One trace's figures (see the module doc)."""
    if not steps:
        return {"steps": 0}
    span = (steps[-1]["t_ms"] + steps[-1]["ms"] - steps[0]["t_ms"]) / 1e3
    gaps = sum(s["gap_ms"] for s in steps[1:]) / 1e3
    wall = sum(s["ms"] for s in steps)
    out = {"steps": len(steps), "span_s": span,
           "tok_per_s": sum(s["generated"] for s in steps) / span if span > 0 else None,
           "gap_share": gaps / span if span > 0 else None, "modes": {},
           # requests in a step, weighted by its wall time: how full the batch ran (a run's
           # ramp and tail, or arrivals late to refill, read below its concurrency)
           "batch_mean": sum(s["batch"] * s["ms"] for s in steps) / wall if wall > 0 else None,
           "batch_max": max(s["batch"] for s in steps)}
    for mode in sorted({s["mode"] for s in steps}):
        own = [s for s in steps if s["mode"] == mode]
        dev = [s["device_ms"] for s in own if s.get("device_ms")]
        out["modes"][mode] = {"steps": len(own),
                              "ms_median": statistics.median(s["ms"] for s in own),
                              "ms_p90": percentile([s["ms"] for s in own], 0.9),
                              "device_ms_median": statistics.median(dev) if dev else None,
                              "gap_ms_median": statistics.median(s["gap_ms"] for s in own)}
    timed = [s for s in steps if s["mode"] == "verify" and "span_ms" in s]  # CUDA runs
    if timed:
        out["verify_timing"] = {
            "draft_ms": statistics.median(s["draft_ms"] for s in timed),
            "draft_host_ms": statistics.median(s.get("draft_host_ms", 0.0) for s in timed),
            "span_ms": statistics.median(s["span_ms"] for s in timed),
            "host_ms": statistics.median(s["ms"] - s["span_ms"] for s in timed)}
    for name, group in (("verify_host", [s for s in timed if "host_ms" in s]),
                        ("verify_prefill_host", [s for s in timed if "host_ms" in s
                                                 and s.get("prefill")])):
        if group:  # host clock from the step's start: planned, catch-up launched, verified, synced
            out[name] = (len(group), statistics.median(s["ms"] for s in group),
                         statistics.median(s.get("plan_ms", 0.0) for s in group),
                         *(statistics.median(s["host_ms"][j] for s in group) for j in range(3)))
    ks: Counter = Counter()
    for s in steps:
        if s["mode"] == "verify":
            key = "tree" if s.get("topk", 1) > 1 else None
            for k, n in s.get("ks", {}).items():
                ks[key or int(k)] += n
    out["k_mix"] = dict(sorted(ks.items(), key=lambda kv: (isinstance(kv[0], str), kv[0])))
    prefill = [s for s in steps if s.get("prefill")]
    out["prefill_steps"] = len(prefill)
    out["prefill_steps_speculating"] = sum(1 for s in prefill if s["mode"] == "verify")
    waits = [w for s in prefill for w in s["prefill"].get("waits_ms", ())]
    if waits:  # arrival at the engine -> the start of the step with its first chunk
        out["waits_ms"] = (statistics.median(waits), percentile(waits, 0.99), max(waits),
                           len(waits))
    late = [s for s in steps if s.get("late")]  # captured, compiled or timed a GEMM
    out["late"] = (*(sum(s["late"].get(k, 0) for s in late)
                     for k in ("captures", "compiles", "choices")), sum(s["ms"] for s in late))
    out.update(arrivals(steps, span))
    return out


def arrivals(steps: list[dict], span: float) -> dict:
    """What new requests cost the decoders: plain steps with a prefill chunk beside
    decoding requests (at K = 0), their share of the span (their wall and the host gap
    after them, which waits for their device work), and the VERIFY step right after one
    (the draft's catch-up) against a VERIFY step after a VERIFY step."""
    idx = [i for i, s in enumerate(steps) if s["mode"] != "verify" and s.get("prefill")
           and s["batch"] > s["prefill"]["requests"]]
    cost = sum(steps[i]["ms"] + (steps[i + 1]["gap_ms"] if i + 1 < len(steps) else 0.0)
               for i in idx)
    next_verify = [steps[i + 1]["ms"] for i in idx
                   if i + 1 < len(steps) and steps[i + 1]["mode"] == "verify"]
    steady = [b["ms"] for a, b in zip(steps, steps[1:])
              if a["mode"] == "verify" and b["mode"] == "verify"]
    return {"arrival_steps": len(idx),
            "arrival_share": cost / 1e3 / span if span > 0 else None,
            "verify_after_arrival_ms": statistics.median(next_verify) if next_verify else None,
            "verify_steady_ms": statistics.median(steady) if steady else None}


def _f(x, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def table(names: list[str], sums: list[dict]) -> str:
    rows = [("steps", [str(s["steps"]) for s in sums]),
            ("span (s)", [_f(s.get("span_s")) for s in sums]),
            ("output tok/s", [_f(s.get("tok_per_s"), "{:,.0f}") for s in sums]),
            ("host gaps / span", [_f(s.get("gap_share"), "{:.1%}") for s in sums]),
            ("requests in a step, mean by wall time / max",
             [f"{_f(s.get('batch_mean'), '{:.1f}')} / {s.get('batch_max', '-')}" for s in sums])]
    for mode in sorted({m for s in sums for m in s.get("modes", {})}):
        ms = [s.get("modes", {}).get(mode) for s in sums]
        rows += [(f"{mode}: steps", [_f(m and m["steps"], "{}") for m in ms]),
                 (f"{mode}: wall ms median / p90",
                  [f"{m['ms_median']:.2f} / {m['ms_p90']:.2f}" if m else "-" for m in ms]),
                 (f"{mode}: device ms median", [_f(m and m["device_ms_median"]) for m in ms]),
                 (f"{mode}: host gap before, median ms", [_f(m and m["gap_ms_median"]) for m in ms])]
    timing = [s.get("verify_timing") for s in sums]
    if any(timing):
        rows += [("verify: draft device ms median", [_f(t and t["draft_ms"]) for t in timing]),
                 ("verify: draft host ms median (proposal and layout, host clock)",
                  [_f(t and t["draft_host_ms"]) for t in timing]),
                 ("verify: device span ms median (catch-up .. verification)",
                  [_f(t and t["span_ms"]) for t in timing]),
                 ("verify: wall less span, median ms (host not hidden)",
                  [_f(t and t["host_ms"]) for t in timing])]
    for key, label in (("verify_host", "verify"), ("verify_prefill_host", "verify with a prefill")):
        rows.append((f"{label}: steps, wall ms; host ms from its start, medians: planned / "
                     "catch-up launched / verification launched / synced",
                     [("{}, {:.2f}; {:.2f} / {:.2f} / {:.2f} / {:.2f}".format(*s[key])
                       if key in s else "-") for s in sums]))
    rows += [("VERIFY K mix (request-steps)",
              [", ".join(f"{k}: {n}" for k, n in s.get("k_mix", {}).items()) or "-" for s in sums]),
             ("steps with a prefill chunk (speculating)",
              [f"{s.get('prefill_steps', 0)} ({s.get('prefill_steps_speculating', 0)})"
               for s in sums]),
             ("plain steps with a prefill beside decoders (share of span)",
              [f"{s.get('arrival_steps', 0)} ({_f(s.get('arrival_share'), '{:.1%}')})"
               for s in sums]),
             ("VERIFY wall median after one / after a VERIFY",
              [f"{_f(s.get('verify_after_arrival_ms'))} / {_f(s.get('verify_steady_ms'))}"
               for s in sums]),
             ("new requests' wait for their first chunk, ms p50 / p99 / max (n)",
              [("{:.2f} / {:.2f} / {:.2f} ({})".format(*s["waits_ms"]) if "waits_ms" in s
                else "-") for s in sums]),
             ("after the warm-up: graphs captured, kernels compiled, GEMM shapes timed "
              "(their steps' wall ms)",
              [("{}, {}, {} ({:.0f})".format(*s["late"]) if "late" in s else "-")
               for s in sums])]
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+",
                   help="JSONL files written by --step-trace, each optionally @START:END")
    args = p.parse_args(argv)
    try:
        specs = [parse_spec(t) for t in args.traces]
    except ValueError as e:
        print(f"trace_report: {e}", file=sys.stderr)
        return 2
    missing = [str(path) for path, _ in specs if not path.is_file()]
    if missing:
        print(f"trace_report: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    sums = [summarize(load(path, windows)) for path, windows in specs]
    print(table([path.stem for path, _ in specs], sums))
    return 0


if __name__ == "__main__":
    sys.exit(main())
