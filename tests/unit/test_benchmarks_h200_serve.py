"""benchmarks/h200_serve.sh end to end in its CPU smoke mode (H200_SMOKE=1: h200.sh's smoke
pair, a CPU server, toy sizes): the engine sweep, both servers' multi-turn runs, the served
points and the rate sweep write their JSON; serve_report.py renders the section into a copy of
the page, report.py keeps it when it rewrites the page, and a server that cannot start fails
its step at once with its log's tail. So the script of the serving figures cannot rot.

Data flow (tests only): bash benchmarks/h200_serve.sh (subprocess) -> OUT/* -> serve_report /
report (subprocess) on a copy of docs/benchmarks.md -> assertions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench_smoke import ROOT, smoke

SCRIPT = ROOT / "benchmarks" / "h200_serve.sh"
BEGIN, END = "<!-- serve: begin -->", "<!-- serve: end -->"
TITLE = "## Serving: prefix cache and speculation through the server (H200)"
KEPT = "<!-- Figures below are not measured by benchmarks/h200.sh"
SAMPLING = [f"samp_{t}_{m}" for t in ("0.7", "1.0") for m in ("coupled", "rejection")]
STEPS = ["pair", "engine", *SAMPLING, "serve_off", "mt_off_r2", "mt_off_inf", "serve_on", "mt_on_r2",
         "mt_on_inf", "warm_burst_spec", "warm_burst_nospec", "srv_c1_spec", "srv_c1_nospec",
         "srv_c2_nospec", "srv_c2_spec", "rates"]


def _run(out: Path, cwd: Path, **env) -> subprocess.CompletedProcess:
    return smoke(SCRIPT.name, out, cwd=cwd, timeout=240, **env)


def _py(*args: str) -> None:
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True, capture_output=True,
                   timeout=120)


def test_smoke_run_writes_every_figure_and_the_section(tmp_path):
    out = tmp_path / "out"
    run = _run(out, tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == STEPS and all(s["exit"] == 0 for s in steps)
    by_name = {s["step"]: s for s in steps}
    assert "--no-enable-prefix-caching" in by_name["serve_off"]["command"]
    assert "--no-enable-prefix-caching" not in by_name["serve_on"]["command"]
    for name in SAMPLING:  # each mode sampled, at its temperature, on an engine of its own
        sweep = json.loads((out / f"{name}.json").read_text())
        _, t, mode = name.split("_")
        assert sweep["args"]["temperature"] == float(t) and sweep["args"]["spec_sampling"] == mode
        assert sweep["env"]["draft"]["spec_sampling"] == mode
    for mode in ("off", "on"):
        assert (out / f"serve_{mode}.log").stat().st_size > 0  # the server's log is kept
        for rate in ("r2", "inf"):
            mt = json.loads((out / f"mt_{mode}_{rate}.json").read_text())
            assert mt["failed"] == 0 and mt["completed"] == 6 and mt["config"]["turns"] == 2
            assert (mt["prefix_cache_hit_rate"] > 0.3) == (mode == "on")
    for c in (1, 2):
        spec = json.loads((out / f"srv_c{c}_spec.json").read_text())
        plain = json.loads((out / f"srv_c{c}_nospec.json").read_text())
        assert not spec["config"]["no_speculative"] and plain["config"]["no_speculative"]
        assert spec["failed"] == plain["failed"] == 0 and spec["output_tok_per_s"] > 0
    engine = json.loads((out / "engine_sweep.json").read_text())
    assert set(engine["results"]) == {"goodput", "off"}
    assert engine["args"]["tree_width"] == 1  # chains, as the server verifies them
    rates = json.loads((out / "rates.json").read_text())
    assert set(rates["runs"]) == {"speculative", "plain"}
    assert all(len(r) == len(rates["rates"]) == 2 for r in rates["runs"].values())
    assert (out / "rates.png").stat().st_size > 0
    assert set(rates["warmup"]) == {"speculative", "plain"}  # the sweep's own bursts
    assert rates["order"] == [["speculative", "plain"], ["plain", "speculative"]]

    # the section goes into a copy of the page just before the CPU figures, once
    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    original = (ROOT / "docs" / "benchmarks.md").read_text()
    if BEGIN in original:  # start from the page without its section
        original = original[:original.index(BEGIN)] + original[original.index(KEPT):]
    page.write_text(original)
    for _ in range(2):  # a second render replaces the first in place
        _py("benchmarks/serve_report.py", str(out), "--page", str(page))
    text = page.read_text()
    assert text.count(BEGIN) == 1 and text.index(END) < text.index(KEPT)
    assert text.replace(text[text.index(BEGIN):text.index(KEPT)], "") == original
    section = text[text.index(BEGIN):text.index(END)]
    assert TITLE in section and "> **Smoke run**" in section and "commit: `smoketest`" in section
    assert "| 2 | " in section and "(not run)" not in section and "Not measured" not in section
    assert "3 to 4 prompts a run" in section and "| 8 | 4 | " in section  # --sweep-seconds
    assert "coupled against rejection" in section and "| 1.0 | 2 | " in section
    assert "vocabulary 8,192" in section and "`gearshift serve --model $P/target" in section
    assert "- server: the engine in a process of its own" in section
    assert "The untimed bursts (3 prompts at once, speculation first)" in section
    assert "- serve_on: graph_captures 0, capture_ms 0, triton_compiles 0, gemm_choices 0" \
        in section  # from the server's final /metrics
    assert (page.parent / "serve_rates.png").is_file()

    # report.py rewrites the page from an h200.sh run (here: none) and keeps the section
    (tmp_path / "empty").mkdir()
    _py("benchmarks/report.py", str(tmp_path / "empty"), "--output", str(page), "--commit", "x")
    kept = page.read_text()
    assert kept.count(BEGIN) == 1 and section in kept and kept.index(END) < kept.index(KEPT)
    assert kept[kept.index(KEPT):] == original[original.index(KEPT):]


def test_a_server_that_cannot_start_fails_its_step(tmp_path):
    out = tmp_path / "out"
    run = _run(out, tmp_path, STEPS="prefix_off", PAIR=str(tmp_path / "none"),
               SERVE_FLAGS="--no-engine-process --log-level INFO")
    assert run.returncode != 0
    assert "serve_off: not up after" in run.stdout and "none/target" in run.stdout  # log tail
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [(s["step"], s["exit"]) for s in steps] == [("serve_off", 1)]
    assert steps[0]["command"].endswith("--no-engine-process --log-level INFO "
                                        "--no-enable-prefix-caching")  # SERVE_FLAGS: each
    assert "- server: the engine on a thread" in (out / "benchmarks.md").read_text()
    assert "Not measured in this run" in (out / "benchmarks.md").read_text()


def test_trace_step_puts_served_and_closed_loop_steps_side_by_side(tmp_path):
    """STEPS="pair trace": a server with --step-trace at each served concurrency and a burst
    (all at once), the closed loop at the same ones, and per c a trace_report table of both
    windows."""
    out = tmp_path / "out"
    run = _run(out, tmp_path, STEPS="pair trace")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (out / "steps.jsonl").read_text().splitlines()]
    assert steps == ["pair", "serve_trace", "trace_srv_c1", "trace_srv_c2", "trace_srv_c4",
                     "trace_loop"]
    loop = json.loads((out / "trace_loop.json").read_text())
    assert loop["args"]["tree_width"] == 1 and set(loop["results"]) == {"goodput"}
    for c in (1, 2, 4):
        table = (out / f"trace_c{c}.md").read_text()
        counts = next(line for line in table.splitlines() if line.startswith("| steps |"))
        served, closed = (int(x) for x in counts.strip("| ").split(" | ")[1:])
        assert served > 0 and closed > 0  # both windows found their steps
