"""The one page of current figures, docs/benchmarks.md, from what `benchmarks/h200.sh` wrote:

    python benchmarks/report.py OUT [--output docs/benchmarks.md] [--commit HASH]

Each figure comes with its device, date, commit, command, model shape and measured
acceptance; the sweep's plot is copied beside the page (spec_sweep.png); the serving
section (benchmarks/serve_report.py, between its markers) and the CPU figures after the
page's KEPT line stay as they are. Criteria:
goodput >= 0.97 x the best other policy at every concurrency and >= 1.8 x `off` at c = 1
(gearshift/bench/sweep_report.py), and the spec tax: the decode step with a draft configured
at spec_policy off over the step without a draft, <= 1.03 at every batch size.

The README quotes the page's summary table between its README_BEGIN / README_END markers,
copied from the page each time the page is written (or alone: `report.py --readme-only`), so
the two never disagree.

Data flow: OUT/{meta.json, steps.jsonl, decode_plain.json, decode_draft.json, offline.json,
sweep.json, sweep.png} -> render() -> the page + its plot -> readme_block() -> README.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
sys.path.insert(0, str(ROOT))  # this checkout's gearshift, whatever else is installed

from gearshift.bench.sweep_report import (  # noqa: E402
    BEST_RATIO,
    OFF_RATIO_C1,
    markdown_table,
    verdict_lines,
    verdicts,
)

TAX_LIMIT = 1.03  # decode step with an idle draft / without one
PNG_NAME = "spec_sweep.png"
# the page's figures from other scripts (CPU runs, h200_hybrid.sh) follow this line; a new
# page keeps them
KEPT = ("<!-- Figures below are not measured by benchmarks/h200.sh (the CPU, "
        "benchmarks/h200_hybrid.sh): report.py keeps them. -->")
# benchmarks/serve_report.py's section sits between these, just before KEPT; a new page keeps it
SERVE_BEGIN, SERVE_END = "<!-- serve: begin -->", "<!-- serve: end -->"
# the README's copy of the page's summary sits between these
README_BEGIN = "<!-- figures: begin (benchmarks/report.py copies them from docs/benchmarks.md) -->"
README_END = "<!-- figures: end -->"
FILES = ("meta", "decode_plain", "decode_draft", "offline", "sweep", "mixed")
MIXED_REF = "goodput-request"  # the mixed workload's policy under test: a K per request
MIXED_RATIO, MIXED_AT = 1.10, (32, 64)  # over the best batch-wide policy, at these c


def load(out: Path) -> dict:
    data = {name: json.loads((out / f"{name}.json").read_text())
            for name in FILES if (out / f"{name}.json").is_file()}
    steps = out / "steps.jsonl"
    lines = steps.read_text().splitlines() if steps.is_file() else []
    data["steps"] = {s["step"]: s for s in map(json.loads, filter(None, lines))}
    return data


def _commit(meta: dict, given: str | None) -> str:
    if given:
        return given
    if meta.get("commit") not in (None, "", "unknown"):
        return meta["commit"]
    try:  # the device's copy had no .git: the checkout the report runs in
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def command(data: dict, step: str, out: Path) -> str:
    rec = data["steps"].get(step)
    if rec is None:
        return "(not run)"
    cmd = rec["command"].replace("python -m gearshift.cli ", "gearshift ")
    run_out = data.get("meta", {}).get("out") or str(out.resolve())  # the device's $OUT
    return cmd.replace(run_out.rstrip("/") + "/", "$OUT/")


def shape(env: dict) -> str:
    s = env["model_shape"]
    return (f"{s['layers']} layers, hidden {s['hidden']:,}, {s['heads']} heads / {s['kv_heads']} "
            f"KV heads of {s['head_dim']}, MLP {s['intermediate']:,}, vocabulary {s['vocab']:,}")


def engine_line(env: dict) -> str:
    return (f"{env['dtype']}, {env['attention_backend']} attention, "
            f"CUDA graphs {'on' if env['cuda_graphs'] else 'off'}, overlap scheduling "
            f"{'on' if env['overlap_schedule'] else 'off'}, at most {env['max_num_seqs']} running, "
            f"{env['max_num_batched_tokens']:,} tokens a step, {env['kv_slots']:,} KV slots")


def facts(env: dict, commit: str, cmd: str, model: str, acceptance: str) -> list[str]:
    d = env.get("draft")
    draft = ([f"- draft: {d['algorithm']} head `{d['model'] or 'embedded'}`, up to "
              f"K = {d['num_draft_tokens']} drafts, tree width {d['tree_width']}, engine policy "
              f"`{d['spec_policy']}`"] if d else [])
    return [f"- device: {env['device']}; date: {env['date'][:10]}; commit: `{commit[:12]}`; "
            f"torch {env['torch']}",
            f"- model: {model} ({shape(env)})", *draft,
            f"- engine: {engine_line(env)}",
            f"- measured acceptance: {acceptance}",
            f"- command: `{cmd}`", ""]


def missing(data: dict, step: str) -> list[str]:
    rec = data["steps"].get(step)
    why = f"exit {rec['exit']} after {rec['seconds']} s" if rec else "not run"
    return [f"**Not measured in this run** (step `{step}`: {why}; see `$OUT/{step}.log`).", ""]


def model_name(env: dict) -> str:
    if env["load_format"] == "dummy":
        name = Path(env["model"]).name.removesuffix(".json")  # a preset name or its file
        return f"`{name}` preset, random (dummy) weights"
    return "the bench target (`gearshift make-bench-model`: the embedded default model widened)"


def spec_tax(plain: dict, draft: dict) -> list[dict]:
    """Per batch size: A (no draft) and B (draft at policy off) medians and B / A."""
    b_rows = {r["batch_size"]: r for r in draft["decode_by_batch"]}
    rows = []
    for a in plain["decode_by_batch"]:
        b = b_rows.get(a["batch_size"])
        if b is None:
            continue
        ratio = (b["step_ms_median"] / a["step_ms_median"]
                 if a["step_ms_median"] and b["step_ms_median"] else None)
        dev = (b["device_ms_median"] / a["device_ms_median"]
               if a["device_ms_median"] and b["device_ms_median"] else None)
        rows.append({"batch_size": a["batch_size"], "a": a, "b": b, "ratio": ratio,
                     "device_ratio": dev})
    return rows


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else "**PASS**" if ok else "**FAIL**"


def summary(data: dict) -> list[str]:
    rows = []
    plain = data.get("decode_plain")
    one = next((r for r in plain["decode_by_batch"] if r["batch_size"] == 1), None) if plain else None
    if one:
        dev = one["device_ms_median"]
        rows.append(f"| batch-1 decode step ({plain['input_len']:,} tokens of context) | "
                    f"**{_ms(one['step_ms_median'])} ms**"
                    + (f" (device {_ms(dev)} ms)" if dev is not None else "") + " | |")
    if "offline" in data:
        o = data["offline"]
        rows.append(f"| offline throughput ({o['num_prompts']} prompts, {o['input_len']} in / "
                    f"{o['output_len']} out) | **{o['output_tok_per_s']:,.0f} output tok/s** | |")
    if "sweep" in data:
        v = verdicts(data["sweep"]["results"])
        if v["points"]:
            worst = min(v["points"], key=lambda p: p["goodput_over_best"])
            rows.append(f"| sweep: goodput / the best other policy, worst concurrency | "
                        f"**{worst['goodput_over_best']:.3f}** (c = {worst['concurrency']}, "
                        f"vs {worst['best_other']}) | >= {BEST_RATIO}: "
                        f"{_verdict(v['goodput_within_best'])} |")
        if v["goodput_over_off_c1"] is not None:
            rows.append(f"| sweep: goodput / off at c = 1 | **{v['goodput_over_off_c1']:.2f}** | "
                        f">= {OFF_RATIO_C1}: {_verdict(v['goodput_beats_off_c1'])} |")
    at = [p for p in mixed_points(data) if p["concurrency"] in MIXED_AT]
    if at:
        rows.append(f"| mixed workload: {MIXED_REF} / the best batch-wide policy at c = "
                    + ", ".join(str(p["concurrency"]) for p in at) + " | **"
                    + ", ".join(f"{p['goodput_over_best']:.3f}" for p in at)
                    + f"** | >= {MIXED_RATIO}: {_verdict(all(p['ok'] for p in at))} |")
    if plain and "decode_draft" in data:
        tax = [r for r in spec_tax(plain, data["decode_draft"]) if r["ratio"] is not None]
        if tax:
            worst = max(tax, key=lambda r: r["ratio"])
            sizes = ", ".join(str(r["batch_size"]) for r in tax)
            rows.append(f"| spec tax: decode step with an idle draft / without, worst of batch "
                        f"{sizes} | **{worst['ratio']:.3f}** (batch {worst['batch_size']}) | "
                        f"<= {TAX_LIMIT}: {_verdict(all(r['ratio'] <= TAX_LIMIT for r in tax))} |")
    return ["| figure | measured | criterion |", "|---|---:|---|", *rows, ""]


def decode_section(data: dict, commit: str, out: Path) -> list[str]:
    plain = data.get("decode_plain")
    sizes = ", ".join(str(r["batch_size"]) for r in plain["decode_by_batch"]) if plain else ""
    lines = [f"## Decode step by batch size ({sizes})" if plain else "## Decode step", "",
             "The time of one decode step: every running request gains one token. Each batch "
             "size b runs b requests with the same prompt length to the end; the figure is the "
             "median over their full-batch decode steps (the first 4 after the prefill left "
             "out). *Wall* is the step loop's period (with overlap scheduling the host plans "
             "step n+1 while step n runs, so it is the device's pace), *device* the CUDA-event "
             "time of the target's forward and sampling. Batch 1 is the latency a lone user sees.",
             ""]
    if not plain:
        return lines + missing(data, "decode_plain")
    lines += facts(plain["env"], commit, command(data, "decode_plain", out), model_name(plain["env"]),
                   "none (no speculation)")
    lines += ["| batch | steps | wall ms (median) | wall ms (p90) | device ms (median) |",
              "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['batch_size']} | {r['steps']} | {_ms(r['step_ms_median'])} | "
              f"{_ms(r['step_ms_p90'])} | {_ms(r['device_ms_median'])} |"
              for r in plain["decode_by_batch"]]
    return lines + [""]


def offline_section(data: dict, commit: str, out: Path) -> list[str]:
    lines = ["## Offline throughput", "",
             "Every prompt is submitted at once (synthetic token ids, fixed lengths, "
             "`ignore_eos`); the engine runs them with at most `max_num_seqs` running and a "
             "step token budget, blending prefill chunks into decode steps. Output tok/s = "
             "prompts x output length / the run's wall time (after a short warm-up request).",
             ""]
    o = data.get("offline")
    if not o:
        return lines + missing(data, "offline")
    lines += facts(o["env"], commit, command(data, "offline", out), model_name(o["env"]),
                   "none (no speculation)")
    lines += ["| output tok/s | total tok/s | run (s) | steps (mixed / decode) | time in mixed / "
              "decode steps (s) | mean running | decode step ms (median) |",
              "|---:|---:|---:|---|---|---:|---:|",
              f"| **{o['output_tok_per_s']:,.0f}** | {o['total_tok_per_s']:,.0f} | "
              f"{o['elapsed_s']:.2f} | {o['steps']} ({o['extend_steps']} / {o['decode_steps']}) | "
              f"{o['extend_s']:.2f} / {o['decode_s']:.2f} | {o['mean_running']:.1f} | "
              f"{_ms(o['decode_step_ms_median'])} |", ""]
    return lines


def sweep_section(data: dict, commit: str, out: Path, png: str | None) -> list[str]:
    lines = ["## Speculation sweep", "",
             "Output tok/s of each speculation policy against concurrency c, on one engine "
             "with an EAGLE-3 head (chains up to K = 4 drafts, or a draft tree): `off` (plain "
             "decode), `always-2` / `always-4` (chains of 2 / 4), `threshold` (SGLang-like: "
             "K = 4, off from batch 64), `threshold-vllm` (K = 3 up to 64, K = 1 up to 128, off "
             "above), `tree-WxD-N` (a draft tree of width W, depth D, N nodes), `goodput` (the "
             "default: per step, the K that maximises committed tokens per second from the "
             "measured step costs) and `goodput-request` (the same, a K per request). "
             "Concurrency c: a closed loop with c requests in flight, each replaced as it "
             "finishes; prompts are windows of the held-out corpus, so "
             "acceptance is real (in brackets: accepted / proposed drafts; a tree counts all its "
             "nodes). Policies run interleaved, in reverse order on the second pass.", ""]
    s = data.get("sweep")
    if not s:
        return lines + missing(data, "sweep")
    a, env = s["args"], s["env"]
    lines += facts(env, commit, command(data, "sweep", out), model_name(env),
                   "per policy and concurrency in the table (each point sets its own policy)")
    warm = env.get("warmup_s")
    lines += [f"Workload: {a['input_len']}-token prompts, {a['output_len']} output tokens "
              f"(greedy, `ignore_eos`); a point = {a['passes']} passes of c x {a['rounds']} "
              f"requests (at least {a['min_requests']} in all); the engine's start-up "
              "speculation warm-up (every batch and K shape) took "
              + (f"{warm:.0f} s." if warm is not None else "no time (no CUDA graphs)."), ""]
    if png:
        lines += [f"![output tok/s and time per output token against concurrency]({png})", ""]
    lines += [markdown_table(s["results"]), "",
              "*goodput / best*: goodput's tok/s over the best other policy's at that c; *per "
              "pass*: the same ratio within each pass (same prompts), median and min, a view "
              "of the noise; *K mix*: goodput's request-steps by draft length.", ""]
    lines += [f"- {line}" for line in verdict_lines(verdicts(s["results"]))]
    return lines + [""]


def mixed_section(data: dict, commit: str, out: Path) -> list[str]:
    lines = ["## Per-request draft lengths: the mixed workload", "",
             f"`{MIXED_REF}` gives each request its own K by marginal value (request i's k-th "
             "draft is worth a_i^k from its own acceptance, against the step time it adds); "
             "every other policy gives the whole batch one K. Workload: half the requests "
             "greedy, half sampled at temperature 1.2 (`bench sweep --workload mixed`), so "
             "acceptance differs per request. Criterion: "
             f"{MIXED_REF} >= {MIXED_RATIO} x the best batch-wide policy at c = "
             f"{' and '.join(map(str, MIXED_AT))}, >= 1.0 x at every other c. The step runs "
             "in its own call (`STEPS=\"pair mixed\"`).", ""]
    mdata = data.get("mixed_run") or data  # its own call's folder (--mixed), else OUT
    m = mdata.get("mixed")
    if not m:
        return lines + missing(mdata, "mixed")
    if mdata is not data:
        commit = _commit(mdata.get("meta", {}), None)
    if m.get("renamed"):  # policy names of that commit -> today's
        lines += ["Measured before a rename; the columns carry today's names ("
                  + ", ".join(f"`{a}` then" + f" = `{b}` now" for a, b in m["renamed"].items())
                  + ").", ""]
    lines += facts(m["env"], commit, command(mdata, "mixed", mdata.get("out", out)),
                   model_name(m["env"]),
                   "per policy and concurrency in the table (greedy and sampled requests together)")
    lines += [markdown_table(m["results"], MIXED_REF), ""]
    for p in mixed_points(data):
        lines.append(f"- c = {p['concurrency']}: {MIXED_REF} / {p['best_other']} = "
                     f"{p['goodput_over_best']:.3f} (>= {p['need']}): "
                     f"{'PASS' if p['ok'] else 'FAIL'}")
    return lines + [""]


def mixed_points(data: dict) -> list[dict]:
    """The mixed workload's verdict points (sweep_report.verdicts against MIXED_REF), each
    with the ratio it needs and whether it has it; [] when not measured."""
    m = (data.get("mixed_run") or data).get("mixed")
    if not m:
        return []
    points = verdicts(m["results"], MIXED_REF)["points"]
    for p in points:
        p["need"] = MIXED_RATIO if p["concurrency"] in MIXED_AT else 1.0
        p["ok"] = p["goodput_over_best"] >= p["need"]
    return points


def tax_section(data: dict, commit: str, out: Path) -> list[str]:
    lines = ["## Spec tax", "",
             "What configured but idle speculation costs: the decode step of an engine with the "
             "bench EAGLE-3 head at `spec_policy off` (B) over the same engine without a draft "
             f"(A; the decode table above), per batch size. Criterion: B / A <= {TAX_LIMIT}.", ""]
    plain, draft = data.get("decode_plain"), data.get("decode_draft")
    if not plain or not draft:
        return lines + missing(data, "decode_draft" if plain else "decode_plain")
    spec = draft.get("spec", {})
    lines += facts(draft["env"], commit, command(data, "decode_draft", out), model_name(draft["env"]),
                   f"none: the draft proposed {spec.get('proposed', 0)} tokens (policy off)")
    lines += ["| batch | wall A ms | wall B ms | B / A | device A ms | device B ms | B / A |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in spec_tax(plain, draft):
        ratio = "-" if r["ratio"] is None else f"**{r['ratio']:.4f}**"
        dev = "-" if r["device_ratio"] is None else f"{r['device_ratio']:.4f}"
        lines.append(f"| {r['batch_size']} | {_ms(r['a']['step_ms_median'])} | "
                     f"{_ms(r['b']['step_ms_median'])} | {ratio} | {_ms(r['a']['device_ms_median'])} "
                     f"| {_ms(r['b']['device_ms_median'])} | {dev} |")
    return lines + [""]


def run_section(data: dict, out: Path) -> list[str]:
    lines = ["## The run", "", "`benchmarks/h200.sh`'s steps, each under its own time limit:", "",
             "| step | exit | seconds | limit (s) |", "|---|---:|---:|---:|"]
    lines += [f"| {s['step']} | {s['exit']} | {s['seconds']} | {s['timeout_s']} |"
              for s in data["steps"].values()]
    if "pair" in data["steps"]:
        lines += ["", f"The bench pair: `{command(data, 'pair', out)}`"
                      " (the embedded default model and its EAGLE-3 head embedded exactly into the "
                      "larger shape: the big model's cost with the small model's tokens and "
                      "acceptance; docs/default_model.md)."]
    return lines + [""]


def kept_tail(page: Path) -> str:
    """What a new page keeps of the old: the serving section (its markers included) and the
    CPU figures from the KEPT line to the end ('' if neither)."""
    text = page.read_text() if page.is_file() else ""
    tail = text[text.index(KEPT):] if KEPT in text else ""
    if SERVE_BEGIN in text and SERVE_END in text and SERVE_BEGIN not in tail:
        block = text[text.index(SERVE_BEGIN):text.index(SERVE_END) + len(SERVE_END)]
        return block + "\n\n" + tail if tail else block + "\n"
    return tail


def render(data: dict, out: Path, commit: str, png: str | None, tail: str = "") -> str:
    meta = data.get("meta", {})
    envs = [data[k]["env"] for k in ("decode_plain", "offline", "sweep", "decode_draft") if k in data]
    device = envs[0]["device"] if envs else "an unknown device"
    date = envs[0]["date"][:10] if envs else meta.get("started", "")[:10]
    lines = ["# Benchmarks: the current figures", ""]
    if meta.get("smoke"):
        lines += ["> **Smoke run** (`H200_SMOKE=1`: CPU, toy sizes). These numbers test the "
                  "script; they are not figures.", ""]
    lines += [f"Gearshift's headline figures, all from one run of `benchmarks/h200.sh` on {device}"
              + (f" ({meta['gpu']})" if meta.get("gpu") else "")
              + f", {date}, commit `{commit[:12]}`. Earlier figures are in this page's git history.",
              "", "To reproduce (two device calls of under 10 minutes each on one H200):", "",
              "```bash", "OUT=out bash benchmarks/h200.sh      # every step below but one: JSON, "
              "logs, the sweep's PNG under out/",
              'OUT=mixed STEPS="pair mixed" bash benchmarks/h200.sh   # the mixed workload',
              "python benchmarks/report.py out --mixed mixed   # this page and spec_sweep.png",
              "```",
              "", "Compare speeds measured on one machine: machines of the same kind differ by a "
              "few percent.", "", "## Summary", ""]
    lines += summary(data)
    lines += decode_section(data, commit, out)
    lines += offline_section(data, commit, out)
    lines += sweep_section(data, commit, out, png)
    lines += mixed_section(data, commit, out)
    lines += tax_section(data, commit, out)
    lines += run_section(data, out)
    page = "\n".join(lines).rstrip() + "\n"
    return page + "\n" + tail if tail else page


def summary_table(page: str) -> list[str]:
    """The page's summary table, as its lines."""
    lines = page.splitlines()
    start = lines.index("## Summary") + 2
    end = lines.index("", start)
    return lines[start:end]


def readme_block(page: str) -> str:
    """What the README shows between its markers: where the figures come from, and the
    page's summary table."""
    head = page.split("\n\n", 2)[1]  # "Gearshift's headline figures, all from one run ..."
    source = head.split(" Earlier figures")[0].replace("Gearshift's headline figures, all from",
                                                        "From")
    return "\n".join([f"{source.rstrip('.')}; [docs/benchmarks.md](docs/benchmarks.md) has "
                      "every figure with its command, model and engine settings:", "",
                      *summary_table(page)])


def sync_readme(page: Path, readme: Path) -> bool:
    """Copy the page's summary into the README between its markers; False if it has none."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        return False
    before, rest = text.split(README_BEGIN, 1)
    after = rest.split(README_END, 1)[1]
    readme.write_text(f"{before}{README_BEGIN}\n{readme_block(page.read_text())}\n{README_END}{after}")
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, nargs="?", help="the folder benchmarks/h200.sh wrote ($OUT)")
    p.add_argument("--output", type=Path, default=PAGE)
    p.add_argument("--readme", type=Path, help="the README whose figures quote the page's "
                   "summary (default: this checkout's, when --output is its page)")
    p.add_argument("--readme-only", action="store_true",
                   help="only copy the page's summary into the README (no OUT)")
    p.add_argument("--commit", help="the measured commit (default: the run's, else this checkout's)")
    p.add_argument("--mixed", type=Path, help="the folder of the mixed workload's own call "
                   "(STEPS=\"pair mixed\"; default: OUT)")
    args = p.parse_args(argv)
    if args.readme is None and args.output.resolve() == PAGE:
        args.readme = ROOT / "README.md"
    if args.readme_only:
        if args.readme is None or not sync_readme(args.output, args.readme):
            raise SystemExit(f"report: no figure markers in {args.readme}")
        print(f"wrote {args.readme}")
        return 0
    if args.out is None:
        p.error("the folder benchmarks/h200.sh wrote is needed (or --readme-only)")
    for folder in (args.out, args.mixed):
        if folder is not None and not folder.is_dir():
            raise SystemExit(f"report: no folder {folder}")
    data = load(args.out)
    if args.mixed is not None:
        data["mixed_run"] = {**load(args.mixed), "out": args.mixed}
    png = None
    if (args.out / "sweep.png").is_file():
        args.output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.out / "sweep.png", args.output.parent / PNG_NAME)
        png = PNG_NAME
    page = render(data, args.out, _commit(data.get("meta", {}), args.commit), png,
                  kept_tail(args.output))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(page)
    print("\n".join(summary(data)) + f"wrote {args.output}")
    if args.readme is not None and sync_readme(args.output, args.readme):
        print(f"wrote {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
