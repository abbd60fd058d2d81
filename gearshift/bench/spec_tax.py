"""`gearshift bench spec-tax` (issue #4): what configured but idle speculation costs a
decode step. (`gearshift bench burst`, what a stretch at K = 0 costs the speculation that
follows, is in burst.py and shares the helpers at the end of this file.)

spec-tax: engine A (no draft) and engine B (same target + EAGLE-3 head, spec_policy off),
  both alive. Per batch size, bs requests (synthetic ids, ignore_eos) run to the end; each
  full-batch DECODE step after `skip` gives wall ms (Engine.last_step time_s), device ms
  (the engine's CUDA events: target forward + sampling; with overlap scheduling reported
  one step late, shifted back here) and span ms (CUDA events around the whole step, the
  draft's K = 0 extend included). Windows alternate A B, B A, ... so clock drift hits
  both. Criterion: B / A within 3% at batch 1, 32 and 128.

Data flow: args -> LLMs A and B -> Engine.step loop -> per-step times -> JSON, table.
"""

from __future__ import annotations

import itertools
import json
import statistics

import torch

from gearshift.request import SamplingParams

_ids = itertools.count()


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _ratio(b: float | None, a: float | None) -> float | None:
    return b / a if a and b is not None else None


# ---------------------------------------------------------------------------- spec-tax
def decode_window(llm, prompts: list[list[int]], output_len: int, skip: int) -> dict[str, list]:
    """Run `prompts` to the end; per full-batch DECODE step after the first `skip`:
    wall, device and span milliseconds (device / span empty off CUDA). With overlap
    scheduling a step reports the device time of the step before it (read one step late):
    it is shifted back onto its own step here."""
    eng = llm.engine
    bs = len(prompts)
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    for p in prompts:
        eng.add_request(f"tax-{next(_ids)}", p, params)
    cuda = eng.runner.device.type == "cuda"
    steps: list[list] = []  # [full batch decode, wall ms, device ms, span events] per step
    last = eng.last_step
    while eng.has_unfinished_requests():
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else None
        if ev:
            ev[0].record()
        eng.step()
        if ev:
            ev[1].record()
        if eng.last_step is last:  # nothing planned (overlap: the last tokens came in)
            continue
        last = eng.last_step
        steps.append([last["mode"] == "decode" and last["batch_size"] == bs, last["time_s"] * 1e3,
                      last.get("device_ms"), ev])
    if getattr(eng, "overlap", False):
        for cur, nxt in zip(steps, steps[1:] + [[None, None, None, None]]):
            cur[2] = nxt[2]
    if cuda:
        torch.cuda.synchronize()  # every span event has completed: reading never waits
    steps = [s for s in steps if s[0]][skip:]
    return {"wall_ms": [s[1] for s in steps], "device_ms": [s[2] for s in steps if s[2] is not None],
            "span_ms": [s[3][0].elapsed_time(s[3][1]) for s in steps if s[3]]}


def measure_tax(engines: dict, batch_sizes: list[int], input_len: int, output_len: int,
                repeats: int = 2, skip: int = 4, seed: int = 0) -> list[dict]:
    """engines: {"A": no-draft LLM, "B": LLM with a draft and spec_policy off}."""
    from gearshift.bench.offline import synthetic_prompts

    names = list(engines)
    vocab = engines[names[0]].engine.model_config.vocab_size
    for llm in engines.values():  # allocator and kernels warm before the first window
        decode_window(llm, synthetic_prompts(1, min(input_len, 64), vocab, seed + 99), 4, 0)
    rows = []
    for bs in batch_sizes:
        samples = {n: {"wall_ms": [], "device_ms": [], "span_ms": []} for n in names}
        windows: dict[str, list] = {n: [] for n in names}
        for rep in range(repeats):
            prompts = synthetic_prompts(bs, input_len, vocab, seed + rep)
            order = names if rep % 2 == 0 else names[::-1]
            for name in order:
                w = decode_window(engines[name], prompts, output_len, skip)
                for key, xs in w.items():
                    samples[name][key] += xs
                windows[name].append({"rep": rep, "first": name == order[0],
                                      **{f"{k}_median": _median(v) for k, v in w.items()}})
        row: dict = {"batch_size": bs}
        for name in names:
            row[name] = {f"{k}_median": _median(v) for k, v in samples[name].items()}
            row[name].update(steps=len(samples[name]["wall_ms"]), windows=windows[name])
        for metric in ("wall", "device", "span"):
            row[f"ratio_{metric}"] = _ratio(row[names[1]][f"{metric}_ms_median"],
                                            row[names[0]][f"{metric}_ms_median"])
        row["within_3pct"] = {m: (abs(row[f"ratio_{m}"] - 1) <= 0.03 if row[f"ratio_{m}"] else None)
                              for m in ("wall", "device", "span")}
        rows.append(row)
    return rows


def run_tax(args) -> int:
    from gearshift import LLM
    from gearshift.bench.offline import environment
    from gearshift.engine_args import engine_kwargs

    kw = engine_kwargs(args)
    spec = {k: kw.pop(k) for k in ("speculative_algorithm", "draft_model", "num_draft_tokens",
                                   "draft_topk", "num_verify_tokens", "spec_policy") if k in kw}
    kw["max_num_seqs"] = args.max_num_seqs or max(args.batch_sizes)
    kw["kv_cache_tokens"] = args.kv_cache_tokens or (
        max(args.batch_sizes) * (args.input_len + args.output_len + 8) + 256)
    engines = {"A": LLM(**kw), "B": LLM(**kw, **{**spec, "spec_policy": "off"})}
    rows = measure_tax(engines, args.batch_sizes, args.input_len, args.output_len, args.repeats,
                       args.skip_steps, args.seed)
    b_stats = engines["B"].engine.stats()
    result = {"bench": "spec-tax", "results": rows,
              "b_verify_steps": b_stats["verify_steps"],  # 0: B never speculated
              "env": environment(engines["A"]) | {"draft": spec}, "args": json_args(args)}
    _print_tax(rows)
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


def _print_tax(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="decode step: A (no draft) vs B (draft configured, spec_policy off), medians")
    for col in ("bs", "steps A/B", "wall A", "wall B", "B/A", "device A", "device B", "B/A",
                "span B/A"):
        t.add_column(col, justify="right")

    def f(x, fmt=".3f"):
        return "-" if x is None else format(x, fmt)

    for r in rows:
        a, b = r["A"], r["B"]
        t.add_row(str(r["batch_size"]), f"{a['steps']}/{b['steps']}", f(a["wall_ms_median"]),
                  f(b["wall_ms_median"]), f(r["ratio_wall"], ".4f"), f(a["device_ms_median"]),
                  f(b["device_ms_median"]), f(r["ratio_device"], ".4f"), f(r["ratio_span"], ".4f"))
    Console().print(t)


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def fmt_list(xs: list) -> str:
    return "[" + " ".join(fmt(x) for x in xs) + "]"


def json_args(args) -> dict:
    return {k: v for k, v in vars(args).items() if k != "func"}


def int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",")]


def add_tax_args(p) -> None:
    from gearshift.engine_args import add_engine_args

    add_engine_args(p)
    p.set_defaults(speculative_algorithm="eagle3")  # for engine B; A never has a draft
    p.add_argument("--batch-sizes", type=int_list, default=[1, 32, 128])
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=96, help="max_tokens per request")
    p.add_argument("--repeats", type=int, default=2, help="windows per engine (order alternates)")
    p.add_argument("--skip-steps", type=int, default=4, help="full-batch decode steps skipped")
    p.add_argument("--output-json", default="bench_spec_tax.json")
