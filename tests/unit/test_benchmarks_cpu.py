"""benchmarks/cpu_report.py: the CPU section from what benchmarks/cpu.sh wrote (best of 2
passes per policy; goodput against the best other and against off; the transition phases);
benchmarks/hybrid_report.py on the same folder (the hybrid's CPU figures, no verdicts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cpu_report  # noqa: E402
import hybrid_report  # noqa: E402


def _pt(c, passes, acc=None, at_c=None):
    return {"concurrency": c, "pass_tok_per_s": passes, "acceptance_rate": acc,
            "output_tok_per_s": sum(passes) / 2, "at_c_tok_per_s": at_c}


def test_the_cpu_section_takes_each_policys_better_pass(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps(
        {"commit": "abcdef0123", "cpu": "a CPU", "torch": "2.13.0+cpu",
         "started": "2026-12-06T20:00:00+00:00"}))
    uniform = {"goodput": [_pt(1, [120.0, 140.0], 0.6), _pt(4, [300.0, 290.0], 0.6)],
               "off": [_pt(1, [100.0, 95.0]), _pt(4, [250.0, 260.0])],
               "always-4": [_pt(1, [130.0, 135.0], 0.5), _pt(4, [320.0, 330.0], 0.5)]}
    (tmp_path / "uniform.json").write_text(json.dumps({"results": uniform}))
    phases = lambda a, b, c: {"concurrency": 1, "phases": [_pt(1, [a, a]), _pt(1, [b, b]),  # noqa: E731
                                                           _pt(1, [c, c])]}
    (tmp_path / "transition.json").write_text(json.dumps({"results": {
        "goodput": [phases(130.0, 95.0, 128.0)], "off": [phases(100.0, 100.0, 100.0)],
        "always-4": [phases(135.0, 70.0, 135.0)]}}))
    text = cpu_report.section(tmp_path)
    assert "| 1 | 140 (0.60) | 100 | 135 (0.50) | always-4 | **1.037** | 1.40 |" in text
    assert "| 4 | 300 (0.60) | 260 | 330 (0.50) | always-4 | **0.909** | 1.15 |" in text
    assert "at every c: PASS (min 0.909)" in text and "off at c = 1: PASS (1.40)" in text
    assert "| 1 | 2: words | 95 | 100 | 70 | off | **0.950** |" in text
    assert "commit: `abcdef0`" in text


def test_cpu_sh_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "cpu.sh")]).returncode == 0


def test_the_hybrid_section_reads_cpu_sh_folders_without_verdicts(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps(
        {"commit": "abcdef0123", "cpu": "a CPU", "torch": "2.13.0+cpu",
         "started": "2026-12-06T20:00:00+00:00"}))
    hybrid = dict(_pt(8, [300.0, 340.0], 0.7, at_c=400.0),
                  proposer_steps={"eagle3": 25, "suffix": 75})
    (tmp_path / "agentic.json").write_text(json.dumps({"results": {
        "hybrid": [hybrid], "model-only": [_pt(8, [200.0, 210.0], 0.6, at_c=250.0)],
        "suffix-only": [_pt(8, [300.0, 290.0], 0.7)]}}))
    text = hybrid_report.section(tmp_path)
    assert text.startswith("## A proposer per request (hybrid, CPU)")
    assert "device: a CPU, torch 2.13.0+cpu" in text and "benchmarks/cpu.sh" in text
    assert "| 8 | 340 (0.70) | 210 (0.60) | 300 (0.70) | 1.619 | 1.133 | 0.75 | 1.600 |" in text
    assert "c = 8: hybrid / model-only >= 1.5: not judged off the GPU (1.619)" in text
    assert "novel text (corpus windows): did not run." in text
