"""benchmarks/h200.sh end to end in its CPU smoke mode (H200_SMOKE=1: a widened copy of the
embedded default model, toy sizes): every step runs under its own limit and writes its JSON,
the sweep its PNG, steps.jsonl the exact commands, and the report renders a page preview.
So the script that produces docs/benchmarks.md cannot rot between GPU runs.

Data flow (tests only): bash benchmarks/h200.sh (subprocess) -> OUT/* -> assertions.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench_smoke import ROOT, ok, smoke

STEPS = ["pair", "decode_plain", "decode_draft", "offline", "sweep"]


def _smoke(out: Path, **env) -> subprocess.CompletedProcess:
    return ok(smoke("h200.sh", out, timeout=170, **env))


def test_smoke_run_writes_every_figure(tmp_path):
    out = tmp_path / "out"
    run = _smoke(out, COMMIT="smoketest")
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == STEPS and all(s["exit"] == 0 for s in steps)
    assert all(s["command"].startswith("python -m gearshift.cli ") for s in steps)
    assert all(0 < s["timeout_s"] <= 585 for s in steps)
    for step in STEPS[1:]:
        assert (out / f"{step}.json").is_file() and f"[h200] {step}: exit 0" in run.stdout
    assert (out / "sweep.png").stat().st_size > 0
    sweep = json.loads((out / "sweep.json").read_text())
    assert len(sweep["results"]) == 8  # every policy the sweep compares
    assert [p["concurrency"] for p in sweep["criteria"]["points"]] == [1, 2]
    plain = json.loads((out / "decode_plain.json").read_text())
    draft = json.loads((out / "decode_draft.json").read_text())
    assert [r["batch_size"] for r in plain["decode_by_batch"]] == [1, 2, 4]
    assert draft["spec"]["proposed"] == 0 and plain["env"]["draft"] is None
    assert json.loads((out / "meta.json").read_text())["commit"] == "smoketest"
    # the mixed and transition workloads in a call of their own, and the page from both folders
    mixed = tmp_path / "mixed"
    _smoke(mixed, COMMIT="mixedtest", STEPS="pair mixed transition")
    assert "goodput-request" in json.loads((mixed / "mixed.json").read_text())["results"]
    transition = json.loads((mixed / "transition.json").read_text())
    assert sorted(transition["results"]) == ["always-2", "always-4", "goodput", "off"]
    assert [len(r["phases"]) for r in transition["results"]["goodput"]] == [3, 3]  # c = 1, 2
    page_md = tmp_path / "page.md"
    subprocess.run(["python", str(ROOT / "benchmarks" / "report.py"), str(out), "--mixed",
                    str(mixed), "--output", str(page_md)], check=True, timeout=60)
    page = page_md.read_text()
    assert "> **Smoke run**" in page and "commit `smoketest`" in page
    assert "Not measured" not in page and (tmp_path / "spec_sweep.png").is_file()
    assert "commit: `mixedtest`" in page and "| goodput-request / best |" in page
    assert "--workload mixed" in page and "c = 2: goodput-request / " in page
    assert "--output-json $OUT/decode_plain.json`" in page  # commands as run, $OUT spelled out
