"""benchmarks/h200_tp.sh end to end in its CPU smoke mode (H200_SMOKE=1: gloo, 2 ranks, toy
shapes): every step runs and writes its JSON, the greedy check finds goodput equal to plain
decoding, the fault step sees the server exit non-zero after a rank is killed, and the
report renders the section. So the script of the two-GPU measurement cannot rot.

Data flow (tests only): bash benchmarks/h200_tp.sh (subprocess) -> OUT/* -> assertions.
"""

from __future__ import annotations

import json

from bench_smoke import ok, smoke

STEPS = ["pair", "decode_tp1", "decode_tp", "offline_tp", "load_70b", "sweep_tp", "greedy_tp",
         "fault_tp"]


def test_smoke_run_writes_every_figure(tmp_path):
    out = tmp_path / "out"
    ok(smoke("h200_tp.sh", out))
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == STEPS and all(s["exit"] == 0 for s in steps)
    assert all("--tensor-parallel-size 2" in s["command"] or "--tp 2" in s["command"]
               for s in steps if s["step"] not in ("pair", "decode_tp1"))
    for name in ("decode_tp1", "decode_tp", "load_70b"):
        rows = json.loads((out / f"{name}.json").read_text())["decode_by_batch"]
        assert [r["batch_size"] for r in rows] == [1, 2]
    assert json.loads((out / "decode_tp.json").read_text())["env"]["tensor_parallel_size"] == 2
    assert json.loads((out / "offline_tp.json").read_text())["output_tok_per_s"] > 0
    greedy = json.loads((out / "greedy_tp.json").read_text())
    assert greedy["equal"] and greedy["proposed"] > 0
    fault = json.loads((out / "fault_tp.json").read_text())
    assert fault["ok"] and fault["exit_code"] == 1 and fault["rank_named"]
    section = (out / "tp_section.md").read_text()
    assert "> **Smoke run**" in section and "commit `smoketest`" in section
    assert "| decode step, batch 1 |" in section and "Speculation sweep at TP=2" in section
