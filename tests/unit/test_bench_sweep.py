"""`gearshift bench sweep` end to end on CPU with a tiny target + EAGLE-3 head: every policy
is measured at every concurrency (after an untimed warm-up), JSON and PNG are written."""

from __future__ import annotations

import json

from checkpoints import make_tiny_checkpoint
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift.bench.sweep import CHAIN_POLICIES
from gearshift.cli import main


def test_sweep_cli_writes_every_point(tmp_path):
    target = make_tiny_checkpoint(tmp_path / "t", "llama")
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    rc = main(["bench", "sweep", "--model", str(target), "--draft-model", str(head),
               "--device", "cpu", "--concurrency", "1,3", "--rounds", "1", "--input-len", "6",
               "--output-len", "6", "--min-requests", "2", "--tree-topk", "2", "--tree-depth", "2",
               "--tree-tokens", "4",
               "--output-json", str(out), "--output-png", str(png)])
    assert rc == 0 and png.stat().st_size > 0
    results = json.loads(out.read_text())["results"]
    assert set(CHAIN_POLICIES) < set(results) and any(k.startswith("tree-") for k in results)
    for name, pts in results.items():
        assert [p["concurrency"] for p in pts] == [1, 3]
        assert all(p["requests"] == max(p["concurrency"], 2) and p["output_tok_per_s"] > 0 for p in pts)
        if name == "off":
            assert all(p["proposed"] == 0 for p in pts)
        if name.startswith("always") or name.startswith("tree"):
            assert all(p["proposed"] > 0 for p in pts)


def test_sweep_policies_subset(tmp_path, capsys):
    target = make_tiny_checkpoint(tmp_path / "t", "llama")
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    base = ["bench", "sweep", "--model", str(target), "--draft-model", str(head), "--device", "cpu",
            "--concurrency", "2", "--input-len", "6", "--output-len", "4", "--min-requests", "2",
            "--output-json", str(out), "--output-png", str(png)]
    assert main([*base, "--policies", "goodput,off"]) == 0
    assert list(json.loads(out.read_text())["results"]) == ["goodput", "off"]
    try:
        main([*base, "--policies", "goodput,fastest"])
    except SystemExit as e:
        assert e.code != 0
    else:
        raise AssertionError("an unknown policy name must be refused")
    assert "unknown policy fastest" in capsys.readouterr().err
