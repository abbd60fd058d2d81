"""`--step-trace`: one JSON line per engine step, and benchmarks/trace_report.py over two
traces (a speculating run and a plain one), on the tiny CPU model."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checkpoints import random_prompts

from gearshift import SamplingParams
from gearshift.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _run(make_llm, model_dir, path: Path, **kw) -> tuple[list[dict], object, int]:
    llm = make_llm(model_dir, step_trace=str(path), **kw)
    outs = llm.generate(random_prompts([5, 9, 3, 12], seed=7),
                        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    # on disk as soon as the engine ran out of requests (a server may end by a signal)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return lines, llm, sum(len(o.token_ids) for o in outs)


def test_every_step_is_one_line(make_llm, tiny_llama_dir, tmp_path):
    lines, llm, generated = _run(make_llm, tiny_llama_dir, tmp_path / "spec.jsonl",
                                 speculative_algorithm="ngram", num_draft_tokens=3,
                                 spec_policy="always")
    stats = llm.engine.stats()
    assert len(lines) == stats["steps"]
    assert sum(x["generated"] for x in lines) == generated  # every token, from its step
    assert [x["mode"] for x in lines].count("verify") == stats["verify_steps"] > 0
    assert lines[0].get("prefill", {}).get("requests", 0) >= 1  # the prompts' first chunks
    assert all(x["gap_ms"] >= 0 and x["ms"] > 0 for x in lines)
    assert all(a["t_ms"] <= b["t_ms"] and a["ts"] <= b["ts"] for a, b in zip(lines, lines[1:]))
    for x in lines:
        if x["mode"] == "verify":  # its requests by K, and the chain width
            assert sum(x["ks"].values()) == x["batch"] and x["topk"] == 1
            assert set(x["ks"]) <= {"0", "3"}


def test_trace_report_puts_two_runs_side_by_side(make_llm, tiny_llama_dir, tmp_path):
    _run(make_llm, tiny_llama_dir, tmp_path / "spec.jsonl", speculative_algorithm="ngram",
         num_draft_tokens=3, spec_policy="always")
    _run(make_llm, tiny_llama_dir, tmp_path / "plain.jsonl")
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trace_report.py"),
                          str(tmp_path / "spec.jsonl"), str(tmp_path / "plain.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "| | spec | plain |" in out and "| verify: steps | " in out
    row = next(line for line in out.splitlines() if line.startswith("| VERIFY K mix"))
    assert "3: " in row and row.endswith("| - |")  # the plain run verified nothing
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trace_report.py"),
                          str(tmp_path / "none.jsonl")], capture_output=True, text=True)
    assert bad.returncode == 2 and "no such file" in bad.stderr


def test_a_trace_in_a_missing_folder_is_refused(make_llm, tiny_llama_dir, tmp_path):
    with pytest.raises(ConfigError, match="step_trace"):
        make_llm(tiny_llama_dir, step_trace=str(tmp_path / "no" / "t.jsonl"))


def test_trace_report_cuts_windows_out_of_a_trace(make_llm, tiny_llama_dir, tmp_path):
    """PATH@START:END keeps the steps that started in the window (Unix seconds): one run out
    of a server's long trace, or a sweep point's passes."""
    lines, _, _ = _run(make_llm, tiny_llama_dir, tmp_path / "t.jsonl")
    report = ROOT / "benchmarks" / "trace_report.py"
    mid = lines[len(lines) // 2]["ts"]
    first = f"{lines[0]['ts'] - 1}:{mid}"
    run = subprocess.run([sys.executable, str(report), f"{tmp_path / 't.jsonl'}@{first}",
                          str(tmp_path / "t.jsonl")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    row = next(line for line in run.stdout.splitlines() if line.startswith("| steps |"))
    kept = sum(1 for x in lines if x["ts"] <= mid)
    assert row == f"| steps | {kept} | {len(lines)} |" and 0 < kept < len(lines)
    bad = subprocess.run([sys.executable, str(report), f"{tmp_path / 't.jsonl'}@5:1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "bad window" in bad.stderr


def test_trace_report_prices_what_arrivals_cost_the_decoders():
    """A plain step with a prefill beside decoders, then the VERIFY step after it: counted,
    their share of the span (wall + the next step's host gap), and the VERIFY after one
    against a VERIFY after a VERIFY."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from trace_report import arrivals

    def step(t, mode, ms, gap=0.0, batch=4, prefill=None):
        return {"t_ms": t, "mode": mode, "ms": ms, "gap_ms": gap, "batch": batch,
                **({"prefill": {"requests": prefill, "tokens": 128}} if prefill else {})}

    steps = [step(0, "verify", 10), step(10, "verify", 10),
             step(20, "extend", 2, batch=4, prefill=1),  # an arrival beside 3 decoders
             step(22, "verify", 14, gap=6), step(42, "verify", 10),
             step(52, "extend", 3, batch=1, prefill=1)]  # alone: no decoder waits
    got = arrivals(steps, span=0.1)
    assert got["arrival_steps"] == 1
    assert got["arrival_share"] == pytest.approx((2 + 6) / 100)
    assert got["verify_after_arrival_ms"] == 14 and got["verify_steady_ms"] == 10


def test_verify_steps_carry_their_device_timing_on_cuda(tmp_path):
    """On CUDA the trace turns on the VERIFY steps' events and writes their catch-up, draft
    and span times; trace_report shows the draft, the span and the wall outside it."""
    from types import SimpleNamespace

    from gearshift.engine.step_trace import StepTrace
    from gearshift.forward_batch import ForwardMode
    from gearshift.scheduler.plan import StepPlan

    timing = SimpleNamespace(last={"catch_up_ms": 0.1, "draft_ms": 1.2, "span_ms": 5.5,
                                   "plan_ms": 0.4, "draft_host_ms": 0.9})
    host = time.perf_counter()  # the host clock at mark 0, mark 3 and the sync
    spec = SimpleNamespace(runner=SimpleNamespace(device=SimpleNamespace(type="cuda")))
    spec.time_verify_steps = lambda: setattr(spec, "timing", timing)
    trace = StepTrace(str(tmp_path / "t.jsonl"), spec)
    assert spec.timing is timing
    plan = StepPlan(mode=ForwardMode.VERIFY)
    plan.draft_lens = [3]
    last = {"time_s": 0.008, "device_ms": 4.0, "mode": "verify", "gear": 3}
    for _ in range(3):
        timing.last["host"] = [host + 0.001, host + 0.003, host + 0.007]
        trace.record(plan, last, 4)
        host = time.perf_counter()
    trace.flush()
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert all(x["draft_ms"] == 1.2 and x["span_ms"] == 5.5 for x in lines)
    for x in lines:  # relative to the step's start (its end less its 8 ms), in order
        a, b, c = x["host_ms"]
        assert -8 < a < b < c and b - a == pytest.approx(2, abs=1e-2) \
            and c - b == pytest.approx(4, abs=1e-2)
    cpu = SimpleNamespace(runner=SimpleNamespace(device=SimpleNamespace(type="cpu")))
    StepTrace(str(tmp_path / "cpu.jsonl"), cpu)
    assert not hasattr(cpu, "timing")  # no CUDA, no events

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from trace_report import summarize, table

    out = table(["t"], [summarize(lines)])
    assert "| verify: draft device ms median | 1.20 |" in out
    assert "| verify: draft host ms median (proposal and layout, host clock) | 0.90 |" in out
    assert "| verify: wall less span, median ms (host not hidden) | 2.50 |" in out
    host_row = next(r for r in out.splitlines() if r.startswith("| verify: steps, wall ms;"))
    assert host_row.startswith("| verify: steps, wall ms; host ms from its start, medians: ") \
        and "| 3, 8.00; 0.40 / " in host_row
    assert "| verify with a prefill: steps" in out and out.rstrip().count(" | - |") >= 1


def test_trace_report_sums_what_steps_captured_or_compiled_after_the_warm_up():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from trace_report import summarize, table

    def step(t, ms, late=None):
        return {"t_ms": t, "mode": "verify", "ms": ms, "gap_ms": 0.0, "batch": 4,
                "generated": 8, "device_ms": None, **({"late": late} if late else {})}

    steps = [step(0, 10), step(10, 300, {"captures": 2, "compiles": 1, "choices": 0}),
             step(310, 10), step(320, 90, {"captures": 0, "compiles": 1}),  # an older trace
             step(410, 60, {"captures": 0, "compiles": 0, "choices": 3})]
    out = table(["t"], [summarize(steps)])
    assert "| after the warm-up: graphs captured, kernels compiled, GEMM shapes timed (their " \
           "steps' wall ms) | 2, 2, 3 (450) |" in out


def test_new_requests_waits_for_their_first_chunk(make_llm, tiny_llama_dir, tmp_path):
    """Each request's first chunk carries its wait since it reached the engine, once (later
    chunks do not); requests admitted in later steps waited longer. The report sums them."""
    lines, _, _ = _run(make_llm, tiny_llama_dir, tmp_path / "t.jsonl", max_num_batched_tokens=8)
    waits = [x["prefill"].get("waits_ms", []) for x in lines if x.get("prefill")]
    assert sum(map(len, waits)) == 4  # four prompts, each once
    firsts = [w for w in waits if w]
    assert len(firsts) > 1 and all(w >= 0 for ws in firsts for w in ws)
    assert min(firsts[-1]) > max(firsts[0])  # admitted later: waited longer
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trace_report.py"),
                          str(tmp_path / "t.jsonl")], capture_output=True, text=True, timeout=60)
    row = next(line for line in run.stdout.splitlines() if "wait for their first chunk" in line)
    assert row.endswith("(4) |")


def test_trace_report_weighs_the_batch_by_wall_time():
    """How full the batch ran: requests a step weighted by its wall time (a long full step
    counts more than a short tail step), and the largest."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from trace_report import summarize, table

    steps = [{"t_ms": 0, "mode": "verify", "ms": 30.0, "gap_ms": 0.0, "batch": 32,
              "generated": 64},
             {"t_ms": 30, "mode": "verify", "ms": 10.0, "gap_ms": 0.0, "batch": 8,
              "generated": 16}]
    got = summarize(steps)
    assert got["batch_mean"] == pytest.approx((32 * 30 + 8 * 10) / 40) and got["batch_max"] == 32
    assert "| requests in a step, mean by wall time / max | 26.0 / 32 |" in table(["t"], [got])
