"""benchmarks/h200_hybrid.sh end to end in its CPU smoke mode (H200_SMOKE=1: h200.sh's widened
copy of the embedded default model, toy sizes): each workload's step compares the hybrid
with each proposer alone and writes its JSON, so the script behind the hybrid's GPU figures
cannot rot between GPU runs.

Data flow (tests only): bash benchmarks/h200_hybrid.sh (subprocess) -> OUT/* -> assertions
and benchmarks/hybrid_report.py (the page's section) over the same folder.
"""

from __future__ import annotations

import json
import sys

from bench_smoke import ROOT, ok, smoke

sys.path.insert(0, str(ROOT / "benchmarks"))

import hybrid_report  # noqa: E402


def test_smoke_run_compares_the_hybrid_on_every_workload(tmp_path):
    out = tmp_path / "out"
    ok(smoke("h200_hybrid.sh", out))
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == ["pair", "agentic", "novel", "mixed_agentic"]
    for name, workload in (("agentic", "agentic"), ("novel", "uniform"),
                           ("mixed_agentic", "mixed-agentic")):
        data = json.loads((out / f"{name}.json").read_text())
        assert set(data["results"]) == {"hybrid", "model-only", "suffix-only"}
        assert data["args"]["workload"] == workload
        assert "eagle3+suffix" in next(s["command"] for s in steps if s["step"] == name)

    # the page's section from the same folder: every workload's table, no verdict off a GPU
    page = hybrid_report.section(out)
    assert "did not run" not in page
    for label, *_ in hybrid_report.CRITERIA.values():
        assert f"**{label}**" in page
    assert page.count("not judged off the GPU") == 2  # agentic and novel at c = 1
