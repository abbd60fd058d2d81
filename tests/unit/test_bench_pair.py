"""`gearshift bench pair` (gearshift/bench/pair.py) on CPU with a tiny pair and its widened copy.

Data flow (tests only): test_widen_eagle3's near-bigram target + hand-built head (~25%
acceptance) -> widen.make_bench_model + widen_eagle3.make_bench_head (the "big" pair) and
the big config as a dummy preset -> bench_pair / the CLI -> the report's equality verdicts
and cost numbers.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_widen_eagle3 import _near_bigram_pair, _widen_target, pair  # noqa: F401 (fixture)

from gearshift.bench import pair as bench
from gearshift.train import widen_eagle3

TINY = dict(num_prompts=4, prompt_len=16, max_tokens=24, num_draft_tokens=3, dtype="float32",
            cost_dtype="float32", context=32, cost_steps=6, device="cpu", attention_backend="torch")


@pytest.fixture(scope="module")
def dirs(pair) -> dict:  # noqa: F811 (the imported fixture)
    small_t, small_h = _near_bigram_pair(pair)
    big_t = _widen_target(small_t, small_t.parent / "bt")
    big_h = widen_eagle3.make_bench_head(small_h, big_t, small_t.parent / "bh",
                                         dtype=torch.float32, draft_vocab_size=540)
    preset = small_t.parent / "big_preset.json"  # the big shape, for dummy weights
    preset.write_text((big_t / "config.json").read_text())
    return {"small": str(small_t), "small_head": str(small_h), "big": str(big_t),
            "big_head": str(big_h), "preset": str(preset)}


def test_widened_pair_report_says_equal(dirs) -> None:
    r = bench.bench_pair(**dirs, **TINY)
    assert r["prompts"]["source"] == "synthetic ids"  # the tiny target has no tokenizer
    assert r["greedy"] == {"equal": 4, "total": 4, "first_divergence": [None] * 4,
                           "all_equal": True}
    acc = r["acceptance"]
    assert acc["equal"] and acc["small"]["accepted"] == acc["big"]["accepted"]
    assert 0.15 < acc["small"]["acceptance_rate"] < 0.9  # partial acceptance: equality means something
    assert 1.0 < acc["big"]["mean_accept_len"] == acc["small"]["mean_accept_len"] < 4.0
    assert acc["big"]["verify_steps"] == sum(acc["big"]["accept_len_hist"].values()) > 0
    assert r["spec_equals_plain"] == {"small": 4, "big": 4} and r["spec_tokens_equal"] == 4
    c = r["cost"]
    for name in ("big", "preset"):
        assert c[name]["decode_step_ms_median"] > 0 and c[name]["decode_steps"] >= 5
        assert c[name]["decode_device_ms_median"] is None  # CPU: no CUDA events
    assert c["ratio_basis"] == "wall_ms" and c["device_ratio"] is None and c["wall_ratio"] > 0
    assert c["preset"]["env"]["load_format"] == "dummy"
    assert r["env"]["model_shape"]["hidden"] == 128 and r["env"]["dtype"] == "float32"
    assert {"greedy_equal", "acceptance_equal", "spec_lossless", "cost_within_5pct"} == set(
        r["criteria"])
    assert r["criteria"]["greedy_equal"] and r["criteria"]["acceptance_equal"]
    assert r["criteria"]["spec_lossless"]


def test_compare_pairs_reports_divergence() -> None:
    run = lambda plain, acc: {"plain": plain, "spec": plain, "proposed": 10, "accepted": acc,  # noqa: E731
                              "acceptance_rate": acc / 10, "verify_steps": 4,
                              "mean_accept_len": (acc + 4) / 4, "accept_len_hist": {acc: 4},
                              "steps_by_k": {3: 4}, "spec_equals_plain": [True, True]}
    r = bench.compare_pairs(run([[1, 2, 3], [4, 5]], 4), run([[1, 2, 9], [4, 5]], 3))
    assert r["greedy"]["first_divergence"] == [2, None] and r["greedy"]["equal"] == 1
    assert not r["greedy"]["all_equal"] and not r["acceptance"]["equal"]
    assert bench.first_divergence([1, 2], [1, 2, 3]) == 2


def test_cli_cost_only_writes_json(dirs, tmp_path) -> None:
    from gearshift.cli import main

    out = tmp_path / "pair.json"
    argv = ["bench", "pair", "--big", dirs["big"], "--big-head", dirs["big_head"],
            "--small", dirs["small"], "--small-head", dirs["small_head"], "--preset",
            dirs["preset"], "--only", "cost", "--context", "24", "--cost-steps", "4",
            "--cost-dtype", "float32", "--device", "cpu", "--output-json", str(out)]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert r["cost"]["big"]["decode_step_ms_median"] > 0 and r["cost"]["context"] == 24
    assert set(r["criteria"]) == {"cost_within_5pct"} and "acceptance" not in r
    assert r["env"]["load_format"] == "safetensors" and r["args"]["only"] == "cost"
