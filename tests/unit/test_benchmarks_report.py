"""benchmarks/report.py on fake `benchmarks/h200.sh` outputs: the page carries every figure
with its device, date, commit, command, model shape and acceptance, the criteria verdicts
(sweep: goodput >= 0.97 x the best other policy, >= 1.8 x off at c = 1; spec tax B / A <=
1.03), the sweep plot copied beside it, and says which figure a failed step left out.

Data flow (tests only): hand-made OUT folder -> report.main -> page text + PNG.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env(model: str, load_format: str, draft: dict | None = None, **extra) -> dict:
    return {"date": "2026-12-02T10:00:00+00:00", "device": "NVIDIA H200", "torch": "2.11.0",
            "model": model, "load_format": load_format, "dtype": "bfloat16",
            "attention_backend": "triton", "cuda_graphs": True, "overlap_schedule": True,
            "max_num_seqs": 64, "max_num_batched_tokens": 512, "kv_slots": 900_000,
            "model_shape": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                            "head_dim": 128, "intermediate": 14336, "vocab": 128256},
            "draft": draft, **extra}


def _decode(wall: list[float], device: list[float]) -> list[dict]:
    return [{"batch_size": b, "steps": 120, "step_ms_median": w, "step_ms_p90": w * 1.01,
             "device_ms_median": d} for b, w, d in zip((1, 32, 128), wall, device)]


def _point(c: int, tps: float, acc: float | None) -> dict:
    return {"concurrency": c, "output_tok_per_s": tps, "acceptance_rate": acc,
            "pass_tok_per_s": [tps, tps], "tpot_ms_median": 1000 * c / tps,
            "request_steps_by_k": {4: 100} if acc else {}, "request_steps_tree": 0}


def _fake_out(out: Path) -> None:
    out.mkdir()
    draft = {"algorithm": "eagle3", "model": "/tmp/pair/head", "num_draft_tokens": 4,
             "tree_width": 1, "spec_policy": "off"}
    (out / "meta.json").write_text(json.dumps({"commit": "0123456789abcdef", "smoke": False,
                                               "gpu": "NVIDIA H200, 700.00 W, 1980 MHz",
                                               "out": "/device/out"}))
    plain = {"input_len": 1024, "output_len": 128, "env": _env("llama-3.1-8b", "dummy"),
             "decode_by_batch": _decode([4.2, 5.6, 8.1], [4.15, 5.6, 8.1])}
    b = {**plain, "env": _env("llama-3.1-8b", "dummy", draft), "spec": {"proposed": 0},
         "decode_by_batch": _decode([4.2 * 1.01, 5.6 * 1.05, 8.1], [4.18, 5.7, 8.0])}
    offline = {"num_prompts": 256, "input_len": 512, "output_len": 256, "elapsed_s": 8.6,
               "output_tok_per_s": 7629.0, "total_tok_per_s": 22887.0, "steps": 1100,
               "extend_steps": 291, "decode_steps": 809, "extend_s": 3.96, "decode_s": 4.61,
               "mean_running": 59.6, "decode_step_ms_median": 5.7, "env": _env("llama-3.1-8b", "dummy")}
    table = {"goodput": (461, 2755, 10277, 16111), "off": (217, 1608, 9201, 16217),
             "always-4": (429, 2756, 10175, 14231), "tree-4x4-16": (458, 2709, 6049, 7918)}
    sweep = {"results": {q: [_point(c, v, None if q == "off" else 0.6) for c, v in
                             zip((1, 8, 64, 256), vals)] for q, vals in table.items()},
             "env": _env("/tmp/pair/target", "safetensors",
                         {**draft, "tree_width": 4}, warmup_s=41.7),
             "args": {"input_len": 128, "output_len": 128, "passes": 2, "rounds": 2,
                      "min_requests": 8}}
    for name, obj in (("decode_plain", plain), ("decode_draft", b), ("offline", offline),
                      ("sweep", sweep)):
        (out / f"{name}.json").write_text(json.dumps(obj))
    (out / "sweep.png").write_bytes(b"\x89PNG fake")
    g = "python -m gearshift.cli"
    steps = [("pair", f"{g} make-bench-model --shape llama-3.1-8b --out /tmp/pair/target"),
             ("decode_plain", f"{g} bench offline --preset llama-3.1-8b --load-format dummy "
                              "--batch-sizes 1,32,128 --output-json /device/out/decode_plain.json"),
             ("decode_draft", f"{g} bench offline --draft-model /tmp/pair/head --spec-policy off"),
             ("offline", f"{g} bench offline --num-prompts 256 --max-num-batched-tokens 512"),
             ("sweep", f"{g} bench sweep --concurrency 1,8,64,256")]
    (out / "steps.jsonl").write_text("".join(
        json.dumps({"step": s, "exit": 0, "seconds": 40, "timeout_s": 80, "command": c}) + "\n"
        for s, c in steps))


def test_page_has_every_figure_and_verdict(tmp_path):
    out, page_path = tmp_path / "out", tmp_path / "docs" / "benchmarks.md"
    _fake_out(out)
    report = _report()
    page_path.parent.mkdir()
    cpu = f"{report.KEPT}\n\n## Server soak (CPU)\n\n0 leaked slots\n"
    page_path.write_text("# An older page\n\n| old figure | 1 |\n\n" + cpu)
    assert report.main([str(out), "--output", str(page_path)]) == 0
    page = page_path.read_text()
    assert page.endswith("\n\n" + cpu) and "old figure" not in page  # the CPU part stays
    assert (tmp_path / "docs" / "spec_sweep.png").read_bytes() == b"\x89PNG fake"
    assert "![output tok/s and time per output token against concurrency](spec_sweep.png)" in page
    assert "OUT=out bash benchmarks/h200.sh" in page and "python benchmarks/report.py out" in page
    assert "NVIDIA H200 (NVIDIA H200, 700.00 W, 1980 MHz), 2026-12-02, commit `0123456789ab`" in page
    # the summary: batch 1, offline, the sweep's two criteria, the spec tax (worst: 1.05 at 32)
    assert "| batch-1 decode step (1,024 tokens of context) | **4.200 ms** (device 4.150 ms) |" in page
    assert "| **7,629 output tok/s** |" in page
    assert "| **0.993** (c = 256, vs off) | >= 0.97: **PASS** |" in page
    assert "| sweep: goodput / off at c = 1 | **2.12** | >= 1.8: **PASS** |" in page
    assert "| **1.050** (batch 32) | <= 1.03: **FAIL** |" in page
    # each figure: device, date, commit, command, model shape, acceptance
    assert page.count("- device: NVIDIA H200; date: 2026-12-02; commit: `0123456789ab`") == 4
    assert page.count("(32 layers, hidden 4,096, 32 heads / 8 KV heads of 128, MLP 14,336, "
                      "vocabulary 128,256)") == 4
    assert "`gearshift bench offline --preset llama-3.1-8b --load-format dummy --batch-sizes " \
           "1,32,128 --output-json $OUT/decode_plain.json`" in page
    assert "measured acceptance: none: the draft proposed 0 tokens (policy off)" in page
    assert page.count("- model: `llama-3.1-8b` preset, random (dummy) weights") == 3
    assert "| 1 | 461 (0.60) | 217 | 429 (0.60) | 458 (0.60) | tree-4x4-16 | **1.007** |" in page
    assert "- goodput >= 0.97 x the best other policy at every concurrency: PASS (min 0.993)" in page
    assert "| 32 | 5.600 | 5.880 | **1.0500** | 5.600 | 5.700 | 1.0179 |" in page
    assert "| 1,100 " not in page and "| 1100 (291 / 809) | 3.96 / 4.61 | 59.6 |" in page
    assert "speculation warm-up (every batch and K shape) took 42 s" in page
    assert "Smoke run" not in page


def test_a_failed_step_is_named_and_its_figure_left_out(tmp_path, capsys):
    out, page_path = tmp_path / "out", tmp_path / "benchmarks.md"
    _fake_out(out)
    (out / "sweep.json").unlink()
    (out / "sweep.png").unlink()
    lines = (out / "steps.jsonl").read_text().splitlines()
    cut = {**json.loads(lines[-1]), "exit": 124, "seconds": 300}
    (out / "steps.jsonl").write_text("\n".join([*lines[:-1], json.dumps(cut)]) + "\n")
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "smoke": True}))
    assert _report().main([str(out), "--output", str(page_path), "--commit", "feedface"]) == 0
    page = page_path.read_text()
    assert "**Not measured in this run** (step `sweep`: exit 124 after 300 s" in page
    assert "sweep: goodput" not in page and "](spec_sweep.png)" not in page
    assert "commit `feedface`" in page and "> **Smoke run**" in page
    assert "| spec tax: decode step with an idle draft / without" in capsys.readouterr().out


def test_the_mixed_workload_from_its_own_call(tmp_path):
    """`--mixed DIR`: the mixed workload's call (STEPS="pair mixed") renders its section
    with its own commit and command, and its criterion joins the summary."""
    out, mixed, page_path = tmp_path / "out", tmp_path / "mixed", tmp_path / "benchmarks.md"
    _fake_out(out)
    mixed.mkdir()
    table = {"goodput-request": (400, 7000, 14500), "goodput": (410, 6000, 13000),
             "off": (240, 6500, 13200)}
    results = {q: [_point(c, v, None if q == "off" else 0.4) for c, v in zip((1, 32, 64), vals)]
               for q, vals in table.items()}
    env = _env("/tmp/pair/target", "safetensors")
    (mixed / "mixed.json").write_text(json.dumps({"results": results, "env": env}))
    (mixed / "meta.json").write_text(json.dumps({"commit": "abcdef0123", "out": "/dev2/out"}))
    (mixed / "steps.jsonl").write_text(json.dumps(
        {"step": "mixed", "exit": 0, "seconds": 300, "timeout_s": 400,
         "command": "python -m gearshift.cli bench sweep --workload mixed "
                    "--output-json /dev2/out/mixed.json"}) + "\n")
    report = _report()
    assert report.main([str(out), "--mixed", str(mixed), "--output", str(page_path)]) == 0
    page = page_path.read_text()
    assert ("| mixed workload: goodput-request / the best batch-wide policy at c = 32, 64 | "
            "**1.077, 1.098** | >= 1.1: **FAIL** |") in page
    section = page[page.index("## Per-request draft lengths"):page.index("## Spec tax")]
    assert "commit: `abcdef0123`" in section and "Not measured" not in section
    assert "`gearshift bench sweep --workload mixed --output-json $OUT/mixed.json`" in section
    assert "- c = 1: goodput-request / goodput = 0.976 (>= 1.0): FAIL" in section
    assert "- c = 32: goodput-request / off = 1.077 (>= 1.1): FAIL" in section
    with pytest.raises(SystemExit, match="no folder"):
        report.main([str(out), "--mixed", str(tmp_path / "none"), "--output", str(page_path)])


def test_the_readme_quotes_the_pages_summary(tmp_path):
    """Writing the page also writes its summary table into the README, between its markers
    (the rest of the README untouched); --readme-only copies it from the page alone."""
    out, page_path, readme = tmp_path / "out", tmp_path / "benchmarks.md", tmp_path / "README.md"
    _fake_out(out)
    report = _report()
    readme.write_text(f"# Title\n\n{report.README_BEGIN}\n| stale | 9 ms |\n{report.README_END}\n\ntail\n")
    assert report.main([str(out), "--output", str(page_path), "--readme", str(readme)]) == 0
    page, text = page_path.read_text(), readme.read_text()
    assert text.startswith(f"# Title\n\n{report.README_BEGIN}\n") and text.endswith(
        f"{report.README_END}\n\ntail\n")
    assert "stale" not in text and "| **7,629 output tok/s** |" in text
    assert "\n".join(report.summary_table(page)) in text
    assert "NVIDIA H200 (NVIDIA H200, 700.00 W, 1980 MHz), 2026-12-02, commit `0123456789ab`" in text
    readme.write_text(f"{report.README_BEGIN}\n{report.README_END}\n")
    assert report.main(["--readme-only", "--output", str(page_path), "--readme", str(readme)]) == 0
    assert readme.read_text() == f"{report.README_BEGIN}\n{report.readme_block(page)}\n" \
                                 f"{report.README_END}\n"


def test_the_readmes_figures_are_the_benchmark_pages():
    """One source: the README's figures are docs/benchmarks.md's summary, as report.py copies
    it (after editing the page by hand: python benchmarks/report.py --readme-only)."""
    report = _report()
    readme = (ROOT / "README.md").read_text()
    block = readme.split(report.README_BEGIN, 1)[1].split(report.README_END, 1)[0]
    assert block.strip() == report.readme_block((ROOT / "docs" / "benchmarks.md").read_text())
    for line in report.summary_table((ROOT / "docs" / "benchmarks.md").read_text())[2:]:
        assert line in block
    outside = readme.replace(block, "")
    assert " ms |" not in outside and "tok/s |" not in outside  # no figures beside them
