"""`gearshift bench sweep --workload transition` (code, random words, code; one closed loop
per policy, nothing reset between phases) and the criteria switch: judged where they were
set (a GPU), else ratios without a verdict; a judged FAIL exits 1 unless --criteria off."""

from __future__ import annotations

import json

import pytest
from checkpoints import make_tiny_checkpoint
from eagle3_checkpoints import make_eagle3_checkpoint

import gearshift.bench.sweep as sweep_mod
import gearshift.bench.sweep_point as point_mod
from gearshift.bench import transition
from gearshift.cli import main


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    return (make_tiny_checkpoint(root / "t", "llama"),
            make_eagle3_checkpoint(root / "h", aux_layer_ids=[0, 1, 1]))


def _args(pair, tmp_path, *extra):
    target, head = pair
    return ["bench", "sweep", "--model", str(target), "--draft-model", str(head),
            "--device", "cpu", "--concurrency", "1,2", "--rounds", "1", "--input-len", "6",
            "--output-len", "5", "--min-requests", "2", "--tree-width", "1", "--settle", "0",
            "--output-json", str(tmp_path / "s.json"), "--output-png", str(tmp_path / "s.png"),
            *extra]


def test_the_transition_workload_times_three_phases_warming_only_the_first(
        pair, tmp_path, capsys, monkeypatch):
    warmed, temps = [], []
    real, point = point_mod.warm_up, transition.run_point
    monkeypatch.setattr(point_mod, "warm_up", lambda *a, **k: warmed.append(1) or real(*a, **k))
    monkeypatch.setattr(transition, "run_point",
                        lambda *a, **k: temps.append(k["temperature"]) or point(*a, **k))
    rc = main(_args(pair, tmp_path, "--workload", "transition", "--passes", "1",
                    "--policies", "goodput,off,always-2"))
    assert rc == 0 and (tmp_path / "s.png").stat().st_size > 0
    data = json.loads((tmp_path / "s.json").read_text())
    for name in ("goodput", "off", "always-2"):
        rows = data["results"][name]
        assert [r["concurrency"] for r in rows] == [1, 2]
        assert all(len(r["phases"]) == 3 and all(p["output_tok_per_s"] > 0 for p in r["phases"])
                   for r in rows)
    assert len(warmed) == 3 * 2  # policies x concurrencies: the first phase of each loop only
    assert temps == [0.0, 1.2, 0.0] * 3 * 2  # the words sampled (--sampled-temperature)
    printed = capsys.readouterr().out
    assert "| 1 | 2: words |" in printed and "| 2 | 3: code |" in printed
    assert "(not judged here)" in printed and "FAIL" not in printed  # a CPU: no verdict
    assert [(p["concurrency"], p["phase"]) for p in data["criteria"]["points"]] == \
        [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]


def test_word_prompts_have_the_asked_length():
    from transformers import AutoTokenizer

    from gearshift.models.default import default_target_dir

    tok = AutoTokenizer.from_pretrained(str(default_target_dir()))
    prompts = transition.word_prompts(tok, 3, 20, seed=1)
    assert [len(p) for p in prompts] == [20, 20, 20] and prompts[0] != prompts[1]


def _fake(results):
    return lambda *a, **k: results


def _pt(c, tps):
    return {"concurrency": c, "output_tok_per_s": tps, "acceptance_rate": None,
            "pass_tok_per_s": [tps, tps]}


SLOW = {"goodput": [_pt(1, 100.0)], "off": [_pt(1, 150.0)]}


@pytest.mark.parametrize("criteria, rc, shown", [
    ("auto", 0, "not judged here"), ("on", 1, "FAIL"), ("off", 0, "FAIL")])
def test_a_failed_criterion_exits_1_only_where_judged(pair, tmp_path, capsys, monkeypatch,
                                                      criteria, rc, shown):
    monkeypatch.setattr(sweep_mod, "sweep", _fake(SLOW))
    assert main(_args(pair, tmp_path, "--criteria", criteria, "--policies", "goodput,off")) == rc
    printed = capsys.readouterr().out
    assert shown in printed
    if criteria == "auto":
        assert "FAIL" not in printed and "PASS" not in printed
