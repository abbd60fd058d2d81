"""`gearshift bench offline` on CPU with a tiny target: the throughput report (tok/s by its
definition, where the time went) and the decode table by batch size, with no draft and with
a draft configured at policy off (the spec tax's two runs: the draft never proposes); a
missing optional table library stops the bench before it measures, in one line.

Data flow (tests only): tiny checkpoints -> `gearshift bench offline` -> JSON, stdout.
"""

from __future__ import annotations

import json
import sys

import pytest
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift.cli import main

CPU = ["--device", "cpu", "--dtype", "float32", "--attention-backend", "torch"]


def test_throughput_report(tiny_llama_dir, tmp_path):
    out = tmp_path / "offline.json"
    assert main(["bench", "offline", "--model", str(tiny_llama_dir), *CPU, "--max-num-seqs", "3",
                 "--max-num-batched-tokens", "16", "--num-prompts", "5", "--input-len", "12",
                 "--output-len", "6", "--output-json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["output_tok_per_s"] == pytest.approx(5 * 6 / r["elapsed_s"])
    assert r["total_tok_per_s"] == pytest.approx(5 * (12 + 6) / r["elapsed_s"])
    assert r["steps"] == r["decode_steps"] + r["extend_steps"] == len(r["step_log"])
    assert r["decode_s"] + r["extend_s"] == pytest.approx(
        sum(s["time_ms"] for s in r["step_log"]) / 1e3)
    assert 0 < r["mean_running"] <= 3  # at most --max-num-seqs running
    assert r["env"]["max_num_batched_tokens"] == 16 and r["env"]["draft"] is None
    assert r["env"]["model_shape"]["layers"] >= 1 and "spec" not in r


def test_decode_table_with_and_without_a_draft_at_policy_off(tiny_llama_dir, tmp_path, capsys):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    base = ["bench", "offline", "--model", str(tiny_llama_dir), *CPU, "--batch-sizes", "1,3",
            "--input-len", "8", "--output-len", "10"]
    plain, draft = tmp_path / "plain.json", tmp_path / "draft.json"
    assert main([*base, "--output-json", str(plain)]) == 0
    assert "decode step by batch size" in capsys.readouterr().out
    assert main([*base, "--draft-model", str(head), "--spec-policy", "off",
                 "--output-json", str(draft)]) == 0
    a, b = json.loads(plain.read_text()), json.loads(draft.read_text())
    for r in (a, b):
        rows = r["decode_by_batch"]
        assert [x["batch_size"] for x in rows] == [1, 3]
        # full-batch decode steps after the first 4: the prefill samples the first token
        assert all(x["steps"] in (10 - 1 - 4, 10 - 4) for x in rows)
        assert all(x["step_ms_median"] > 0 and x["device_ms_median"] is None for x in rows)
        assert r["env"]["max_num_seqs"] == 3  # the largest batch size
    assert [x["steps"] for x in a["decode_by_batch"]] == [x["steps"] for x in b["decode_by_batch"]]
    assert a["env"]["draft"] is None
    assert b["env"]["draft"]["algorithm"] == "eagle3" and b["env"]["draft"]["spec_policy"] == "off"
    assert b["spec"]["proposed"] == 0 and b["engine_stats"]["verify_steps"] == 0


def test_missing_table_library_stops_before_measuring(tiny_llama_dir, tmp_path, monkeypatch,
                                                       capsys):
    monkeypatch.setitem(sys.modules, "rich", None)  # import rich -> ImportError
    with pytest.raises(SystemExit) as e:
        main(["bench", "offline", "--model", str(tiny_llama_dir), *CPU,
              "--output-json", str(tmp_path / "x.json")])
    assert e.value.code == 2
    assert "needs the [bench] extra (rich not installed)" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    for bad in ("0,4", "a"):
        with pytest.raises(SystemExit):
            main(["bench", "offline", "--batch-sizes", bad])
        assert "expected batch sizes >= 1" in capsys.readouterr().err
