"""The serving section of docs/benchmarks.md from what benchmarks/h200_serve.sh wrote:

    python benchmarks/serve_report.py OUT [--page docs/benchmarks.md] [--commit HASH]
        [--device TEXT] [--date YYYY-MM-DD] [--shape PRESET]

Three tables: the prefix cache on multi-turn chats (cache on / off: TTFT p50 <= 0.5x, output
tok/s >= 1.3x); the server's speculation gain against the engine's closed loop at the same
concurrency (server gain / engine gain >= 0.95; TTFT p50 with / without speculation <= 1.10x
at c < 32, <= 1.0x from 32); the request-rate sweep (with speculation / without: TPOT p50
<= 1.03x, TTFT p99 <= 1.10x). The section replaces the one between the page's serve markers,
or goes just before report.py's KEPT line; the rate sweep's plot goes beside the page.

Data flow: OUT/{meta.json, steps.jsonl, target_config.json, engine_sweep.json, mt_*.json,
srv_c*_{spec,nospec}.json, warm_burst_*.json, rates.json, rates.png, *_metrics.txt} ->
section() -> the page + serve_rates.png.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import KEPT, ROOT, SERVE_BEGIN, SERVE_END, _commit, command, missing, shape  # noqa: E402

TITLE = "## Serving: prefix cache and speculation through the server (H200)"
PNG_NAME = "serve_rates.png"
TTFT_CACHE, TOKS_CACHE = 0.5, 1.3  # prefix cache on / off: TTFT p50 at most, output tok/s at least
GAIN_RATIO = 0.95  # the server's speculation gain / the engine's, at least
TTFT_SPEC, TTFT_SPEC_HIGH, HIGH_C = 1.10, 1.0, 32  # TTFT p50 spec / nospec, at most (from c 32)
TPOT_RATE, TTFT99_RATE = 1.03, 1.10  # rate sweep, with speculation / without, at most
COUPLED_COST = 0.97  # coupled / rejection output tok/s, at least, for coupled as the default


def engine_mode(data: dict) -> str:
    """Where the served runs' engine stepped, from their servers' commands."""
    commands = [s["command"] for name, s in data["steps"].items() if name.startswith("serve_")]
    if not commands:
        return "not recorded by this run"
    threads = ["--no-engine-process" in c.split() for c in commands]
    if all(threads):
        return "the engine on a thread of the server (`--no-engine-process`)"
    if not any(threads):
        return "the engine in a process of its own (`serve`'s default)"
    return "mixed: some servers ran the engine on a thread (see the commands)"


def load(out: Path) -> dict:
    data = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    steps = out / "steps.jsonl"
    lines = steps.read_text().splitlines() if steps.is_file() else []
    data["steps"] = {s["step"]: s for s in map(json.loads, filter(None, lines))}
    return data


def absent(data: dict, step: str, file: str) -> list[str]:
    """report.missing(), or for a run that kept no steps.jsonl (by hand) the missing file."""
    if data["steps"]:
        return missing(data, step)
    return [f"**Not measured in this run** (no `$OUT/{file}`).", ""]


def _x(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _cell(ratio: float | None, limit: float, at_most: bool = True) -> str:
    if ratio is None:
        return "(not run)"
    ok = ratio <= limit if at_most else ratio >= limit
    return f"**{ratio:.2f}x** {'PASS' if ok else 'FAIL'}"


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "(not run)" if x is None else format(x, fmt)


def _shape(data: dict, preset: str | None) -> str:
    """The bench target's shape: kept by the run, from the engine sweep, or recomputed."""
    env = data.get("engine_sweep", {}).get("env")
    if env:
        return shape(env)
    cfg = data.get("target_config")
    if cfg is None and preset:  # make-bench-model's config is a function of the preset
        from gearshift.models.default import default_target_dir
        from gearshift.train.widen import load_shape, widen_config
        small = json.loads((default_target_dir() / "config.json").read_text())
        cfg = widen_config(small, load_shape(preset))
    if cfg is None:
        return "shape not recorded"
    heads = cfg["num_attention_heads"]
    return shape({"model_shape": {
        "layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"], "heads": heads,
        "kv_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "intermediate": cfg["intermediate_size"], "vocab": cfg["vocab_size"]}})


def prefix_table(data: dict) -> list[str]:
    lines = ["| arrivals | prefix cache | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | output tok/s "
             "| hit rate |", "|---|---|---:|---:|---:|---:|---:|"]
    for rate, label in (("r2", "2 requests/s"), ("inf", "all at once")):
        off, on = data.get(f"mt_off_{rate}"), data.get(f"mt_on_{rate}")
        for mode, r in (("off", off), ("on", on)):
            if r:
                lines.append(f"| {label} | {mode} | {r['ttft_ms']['p50']:.1f} | "
                             f"{r['ttft_ms']['p99']:.1f} | {r['tpot_ms']['p50']:.2f} | "
                             f"{r['output_tok_per_s']:,.0f} | {r['prefix_cache_hit_rate']:.0%} |")
            else:
                lines.append(f"| {label} | {mode} | (not run) | | | | |")
        ttft = _x(on and on["ttft_ms"]["p50"], off and off["ttft_ms"]["p50"])
        toks = _x(on and on["output_tok_per_s"], off and off["output_tok_per_s"])
        # at a fixed rate the arrivals bound the throughput: its criterion is all at once's
        toks_cell = (_cell(toks, TOKS_CACHE, at_most=False) if rate == "inf"
                     else f"{toks:.2f}x" if toks else "(not run)")
        lines.append(f"| {label} | **on / off** | {_cell(ttft, TTFT_CACHE)} | | | {toks_cell} | |")
    return lines + [""]


def _engine_gain(sweep: dict | None, c: int) -> float | None:
    if not sweep:
        return None
    at = {q: {p["concurrency"]: p["output_tok_per_s"] for p in pts}
          for q, pts in sweep["results"].items()}
    return _x(at.get("goodput", {}).get(c), at.get("off", {}).get(c))


def served_table(data: dict) -> list[str]:
    concs = sorted({int(k.split("_")[1][1:]) for k in data if k.startswith("srv_c")})
    lines = ["| c | server tok/s, spec / no spec | server gain | engine gain (goodput / off) "
             f"| server / engine gain (>= {GAIN_RATIO}) | TTFT p50 ms, spec / no spec | TTFT "
             f"spec / no spec (<= {TTFT_SPEC:.2f}x; {TTFT_SPEC_HIGH:.2f}x from c {HIGH_C}) | "
             "hit rate, "
             "spec / no spec |", "|---:|---|---:|---:|---|---|---|---|"]
    for c in concs:
        s, n = data.get(f"srv_c{c}_spec"), data.get(f"srv_c{c}_nospec")
        if not s or not n:
            lines.append(f"| {c} | (not run) | | | | | | |")
            continue
        gain = _x(s["output_tok_per_s"], n["output_tok_per_s"])
        engine = _engine_gain(data.get("engine_sweep"), c)
        ttft = _x(s["ttft_ms"]["p50"], n["ttft_ms"]["p50"])
        limit = TTFT_SPEC_HIGH if c >= HIGH_C else TTFT_SPEC
        lines.append(f"| {c} | {s['output_tok_per_s']:,.0f} / {n['output_tok_per_s']:,.0f} | "
                     f"{gain:.2f}x | {_f(engine, '.2f')}{'x' if engine else ''} | "
                     f"{_cell(_x(gain, engine), GAIN_RATIO, at_most=False)} | "
                     f"{s['ttft_ms']['p50']:.1f} / {n['ttft_ms']['p50']:.1f} | {_cell(ttft, limit)} "
                     f"| {s['prefix_cache_hit_rate']:.0%} / {n['prefix_cache_hit_rate']:.0%} |")
    return lines + [""]


def burst_lines(data: dict) -> list[str]:
    """The untimed bursts before the served points: what a server's first batch of 64
    costs each mode (the first burst pays what the server does once)."""
    spec, plain = data.get("warm_burst_spec"), data.get("warm_burst_nospec")
    if not (spec and plain):
        return []
    n = spec["config"]["num_prompts"]
    return [f"The untimed bursts ({n} prompts at once, speculation first): TTFT p50 "
            f"{spec['ttft_ms']['p50']:.1f} ms with speculation, {plain['ttft_ms']['p50']:.1f} "
            f"ms without; output tok/s {spec['output_tok_per_s']:.0f} and "
            f"{plain['output_tok_per_s']:.0f}.", ""]


def late_lines(out: Path) -> list[str]:
    """What each server met after its warm-up (its final /metrics, `late.*`): one-off
    stalls (graphs captured, kernels compiled, GEMM shapes timed) and allocator growth."""
    lines = []
    for path in sorted(out.glob("*_metrics.txt")):
        late = {}
        for line in path.read_text().splitlines():
            if line.startswith('gearshift_engine_stat{name="late.'):
                name, value = line.split('"')[1], line.rsplit(" ", 1)[1]
                late[name.removeprefix("late.")] = float(value)
        if late:
            lines.append(f"- {path.name.removesuffix('_metrics.txt')}: "
                         + ", ".join(f"{k} {v:g}" for k, v in late.items()))
    if not lines:
        return []
    return ["After the warm-up, each server (from its final `/metrics`, `late.*`):", "",
            *lines, ""]


def rates_table(rates: dict) -> list[str]:
    spec, plain = rates["runs"].get("speculative", []), rates["runs"].get("plain", [])
    lines = ["| rate /s | prompts | TPOT p50 ms, spec / no spec | TPOT ratio | TTFT p50 ms, "
             "spec / no spec | TTFT p99 ms, spec / no spec | TTFT p99 ratio | hit rate, spec / "
             "no spec |",
             "|---:|---:|---|---|---|---|---|---|"]
    for rate, s, n in zip(rates["rates"], spec, plain, strict=False):
        lines.append(f"| {'all at once' if rate == float('inf') else f'{rate:g}'} | "
                     f"{s['config']['num_prompts']} | "
                     f"{s['tpot_ms']['p50']:.2f} / {n['tpot_ms']['p50']:.2f} | "
                     f"{_cell(_x(s['tpot_ms']['p50'], n['tpot_ms']['p50']), TPOT_RATE)} | "
                     f"{s['ttft_ms']['p50']:.1f} / {n['ttft_ms']['p50']:.1f} | "
                     f"{s['ttft_ms']['p99']:.1f} / {n['ttft_ms']['p99']:.1f} | "
                     f"{_cell(_x(s['ttft_ms']['p99'], n['ttft_ms']['p99']), TTFT99_RATE)} | "
                     f"{s['prefix_cache_hit_rate']:.0%} / {n['prefix_cache_hit_rate']:.0%} |")
    return lines + [""]


def sampling_lines(data: dict, commit: str) -> list[str]:
    """Coupled against rejection verification of sampled requests, per temperature and c
    (`commit`: the run's, where a sweep's environment does not name one)."""
    temps = sorted({k.split("_")[1] for k in data if k.startswith("samp_")}, key=float)
    if not temps:
        return absent(data, "samp_0.7_coupled", "samp_0.7_coupled.json")
    first = next(data[k] for k in data if k.startswith("samp_"))
    a, env = first["args"], first["env"]
    lines = [f"`bench sweep` of goodput (chains up to K = 4) with sampled requests, each "
             f"`spec_sampling` on an engine of its own: {a['input_len']}-token corpus prompts, "
             f"{a['output_len']} output tokens, {a['passes']} passes of c x {a['rounds']} "
             f"requests. Device {env.get('device')}, {env.get('date', '')[:10]}, commit "
             f"`{env.get('commit') or commit}`. Criterion for coupled as the default: "
             f"coupled / rejection output tok/s >= {COUPLED_COST}. In brackets: accepted / "
             "proposed drafts.", "",
             "| temperature | c | coupled tok/s | rejection tok/s | coupled / rejection |",
             "|---:|---:|---:|---:|---|"]
    for t in temps:
        pts = {m: {p["concurrency"]: p for p in data.get(f"samp_{t}_{m}", {})
                   .get("results", {}).get("goodput", [])} for m in ("coupled", "rejection")}
        for c in sorted(set(pts["coupled"]) | set(pts["rejection"])):
            cp, rp = pts["coupled"].get(c), pts["rejection"].get(c)
            ratio = _x(cp and cp["output_tok_per_s"], rp and rp["output_tok_per_s"])
            lines.append(f"| {t} | {c} | {_toks(cp)} | {_toks(rp)} | "
                         f"{_cell(ratio, COUPLED_COST, at_most=False)} |")
    return lines + [""]


def _toks(p: dict | None) -> str:
    if not p:
        return "(not run)"
    acc = p.get("acceptance_rate")
    return f"{p['output_tok_per_s']:,.0f}" + (f" ({acc:.2f})" if acc is not None else "")


def _workload(r: dict | None, extra: str = "") -> str:
    if not r:
        return ""
    c = r["config"]
    return (f"Workload: `{c['dataset']}` prompts of {c['input_len']} tokens, {c['output_len']} "
            f"output tokens (greedy, `ignore_eos`){extra}.")


def section(data: dict, out: Path, commit: str, device: str, date: str, model: str,
            png: str | None) -> list[str]:
    meta = data.get("meta", {})
    lines = [SERVE_BEGIN, TITLE, ""]
    if meta.get("smoke"):
        lines += ["> **Smoke run** (`H200_SMOKE=1`: CPU, toy sizes). These numbers test the "
                  "script; they are not figures.", ""]
    lines += ["The bench pair behind `gearshift serve` (OpenAI API, streamed), driven over HTTP "
              "by `gearshift bench serve`: what the prefix cache and speculation give a client. "
              "TTFT: time to the first token; TPOT: time per output token after it; hit rate: "
              "prompt tokens served from the prefix cache.", "",
              f"- device: {device}; date: {date}; commit: `{commit[:12]}`",
              f"- model: the bench target and its EAGLE-3 head (`gearshift make-bench-model`; "
              f"{model}), speculation policy `goodput` (the default)",
              f"- server: {engine_mode(data)}",
              "- to reproduce: `OUT=out bash benchmarks/h200_serve.sh && python "
              "benchmarks/serve_report.py out`", "",
              "### Prefix cache: multi-turn chats", ""]
    mt = data.get("mt_on_r2") or data.get("mt_off_r2")
    if mt:
        c = mt["config"]
        lines += [f"{c['num_prompts']} chats of {c['turns']} turns under one shared "
                  f"{c['shared_prefix_len']:,}-word system prompt (`{c['dataset']}`), "
                  f"{c['input_len']} new prompt tokens and {c['output_len']} output tokens a "
                  f"turn, at most {c['concurrency']} in flight; each turn resends the whole chat. "
                  "Cache off: a server of its own with `--no-enable-prefix-caching`. Criteria, "
                  f"cache on / off: TTFT p50 <= {TTFT_CACHE}x, output tok/s >= {TOKS_CACHE}x "
                  "all at once (at 2 requests/s the arrivals bound the throughput).", ""]
        lines += prefix_table(data)
    else:
        lines += absent(data, "mt_on_r2", "mt_on_r2.json")
    lines += ["### Speculation through the server against the closed loop", ""]
    if any(k.startswith("srv_c") for k in data):
        lines += ["On the cache-on server after the chats and an untimed burst each way: at "
                  "each concurrency c, the prompts with speculation and with `\"speculative\": "
                  "false`, the modes taking turns at going first, the prefix cache cleared "
                  "before each (where the hit rates differ, it was not: the second run found "
                  "the first's prompts cached). Engine gain: `bench sweep`'s goodput / off at "
                  "the same c, closed loop, same lengths. "
                  + _workload(data.get("srv_c1_spec")), ""]
        lines += burst_lines(data)
        lines += served_table(data)
        if "engine_sweep" not in data:
            lines += absent(data, "engine", "engine_sweep.json")
    else:
        lines += absent(data, "srv_c1_spec", "srv_c1_spec.json")
    lines += ["### Sampled speculation: coupled against rejection", ""]
    lines += sampling_lines(data, commit)
    lines += ["### Request-rate sweep", ""]
    rates = data.get("rates")
    if rates:
        first = next(iter(rates["runs"].values()))[0]
        counts = sorted({r["config"]["num_prompts"] for rs in rates["runs"].values() for r in rs})
        prompts = (f"{counts[0]} prompts a run" if len(counts) == 1 else
                   f"{counts[0]} to {counts[-1]} prompts a run (the faster rates send more, "
                   f"`--sweep-seconds`: the prompts column)")
        lines += [f"Poisson arrivals at each rate, at most {first['config']['concurrency']} in "
                  f"flight, {prompts}, each rate with and "
                  f"without speculation (taking turns at going first, after an untimed burst "
                  f"of every prompt at once each way), the same prompts each run and the prefix "
                  f"cache cleared before each. Criteria, with / without: TPOT p50 <= {TPOT_RATE:.2f}x, "
                  f"TTFT p99 <= {TTFT99_RATE:.2f}x. " + _workload(first), ""]
        if png:
            lines += [f"![TTFT, TPOT and output tok/s against request rate]({png})", ""]
        lines += rates_table(rates)
    else:
        lines += absent(data, "rates", "rates.json")
    failed = sum(r.get("failed", 0) for k, r in data.items() if k.startswith(("mt_", "srv_")))
    failed += sum(r["failed"] for rs in (rates or {}).get("runs", {}).values() for r in rs)
    lines += [f"Failed requests: {failed}.", ""] + late_lines(out)
    lines += ["Commands (`$OUT`: the output folder; "
              "`$P`: the bench pair):", ""]
    if data["steps"]:
        pair = shlex.split(command(data, "pair", out)) + ["--out", "$P/target"]
        pair = pair[pair.index("--out") + 1].removesuffix("/target") + "/"
        lines += [f"- {name} (exit {s['exit']}, {s['seconds']} s): "
                  f"`{command(data, name, out).replace(pair, '$P/')}`"
                  for name, s in data["steps"].items()]
    else:
        lines += ["- not recorded by this run: those of `benchmarks/h200_serve.sh` at full size"]
    return lines + ["", SERVE_END]


def place(page: str, block: str) -> str:
    """The page with `block` between the serve markers, or just before KEPT, or at the end."""
    if SERVE_BEGIN in page and SERVE_END in page:
        return page[:page.index(SERVE_BEGIN)] + block + page[page.index(SERVE_END) + len(SERVE_END):]
    if KEPT in page:
        i = page.index(KEPT)
        return page[:i] + block + "\n\n" + page[i:]
    return (page.rstrip() + "\n\n" if page.strip() else "") + block + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the folder benchmarks/h200_serve.sh wrote ($OUT)")
    p.add_argument("--page", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--commit", help="the measured commit (default: the run's, else this checkout's)")
    p.add_argument("--device", help="default: the run's nvidia-smi line")
    p.add_argument("--date", help="default: the run's start")
    p.add_argument("--shape", help="the bench target's shape preset, where the run kept no "
                                   "target_config.json")
    args = p.parse_args(argv)
    if not args.out.is_dir():
        raise SystemExit(f"serve_report: no folder {args.out}")
    data = load(args.out)
    meta = data.get("meta", {})
    png = None
    if (args.out / "rates.png").is_file():
        args.page.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.out / "rates.png", args.page.parent / PNG_NAME)
        png = PNG_NAME
    device = args.device or meta.get("gpu") or ("CPU" if meta.get("smoke") else "unknown")
    date = args.date or meta.get("started", "")[:10] or "unknown"
    block = "\n".join(section(data, args.out, _commit(meta, args.commit), device, date,
                              _shape(data, args.shape), png))
    page = args.page.read_text() if args.page.is_file() else ""
    args.page.write_text(place(page, block))
    print(f"wrote {TITLE.removeprefix('## ')} into {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
