"""`gearshift bench sweep` end to end on CPU with a tiny target + EAGLE-3 head: every policy
is measured at every concurrency (after an untimed warm-up), JSON and PNG are written."""

from __future__ import annotations

import json

import pytest
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
               "--output-len", "6", "--min-requests", "2", "--tree-topk", "2", "--tree-tokens", "4",
               "--settle", "0",  # goodput settled on the CPU speculates no more: keep its VERIFYs
               "--output-json", str(out), "--output-png", str(png)])
    assert rc == 0 and png.stat().st_size > 0
    results = json.loads(out.read_text())["results"]
    assert set(CHAIN_POLICIES) < set(results) and any(k.startswith("tree-") for k in results)
    for name, pts in results.items():
        assert [p["concurrency"] for p in pts] == [1, 3]
        # two passes (interleaved policies) of c * rounds requests each
        assert [p["requests"] for p in pts] == [2, 6]
        assert all(p["output_tok_per_s"] > 0 and len(p["pass_tok_per_s"]) == 2 for p in pts)
        assert all(len(p["gc_collections"]) == 3 and p["gc_ms"] >= 0 for p in pts)
        assert all(p["graph_keys_captured"] == [] for p in pts)  # CPU: no graphs
        assert all(p["device_ms_median_by_mode"] == {} for p in pts)  # CPU: no CUDA events
        for p in pts:  # per pass: the longest steps, longest first; compiles (none on CPU)
            assert len(p["slowest_steps"]) == 2 and all(len(s) <= 5 for s in p["slowest_steps"])
            for s in p["slowest_steps"]:
                assert [x[0] for x in s] == sorted((x[0] for x in s), reverse=True)
                assert all(x[1] in ("decode", "extend", "verify") and x[2] >= 1 for x in s)
            assert all(c in (None, []) for c in p["triton_compiles"])
        for p in pts:  # the point's time by step mode adds up to (about) its elapsed time
            assert sum(p["step_s_by_mode"].values()) == pytest.approx(p["elapsed_s"], rel=0.05)
            assert all(len(v) >= 1 for v in p["step_ms_median_by_mode"].values())
        if name == "goodput":  # its cost model's bias, measured / predicted, per pass
            assert all(r["verify"][0] > 0 and r["verify"][1] > 0
                       for p in pts for r in p["cost_model_ratio"] if "verify" in r)
            assert any("verify" in r for p in pts for r in p["cost_model_ratio"])
        else:
            assert all(r == {} for p in pts for r in p["cost_model_ratio"])
        for p in pts:  # VERIFY time by gear adds up to the VERIFY time
            gears = p["verify_s_by_gear"]
            assert sum(g[0] for g in gears.values()) == pytest.approx(
                p["step_s_by_mode"].get("verify", 0.0))
            assert sum(g[1] for g in gears.values()) == p["verify_steps"]
        if name == "always-2":
            assert all(set(p["verify_s_by_gear"]) == {"2"} for p in pts)
        if name.startswith("tree"):  # gear max K + 1 = 5
            assert all(set(p["verify_s_by_gear"]) == {"5"} for p in pts)
        # every point reports the draft's catch-ups (requests start behind by their prompt)
        assert all(p["catch_up_rows"] >= 0 and p["catch_up_ms"] >= 0 for p in pts)
        if name.startswith("always"):
            assert all(p["catch_up_rows"] > 0 for p in pts)
        if name == "off":
            assert all(p["proposed"] == 0 and p["catch_up_rows"] == 0 for p in pts)
            assert all("verify" not in p["step_s_by_mode"] for p in pts)
        if name.startswith("always") or name.startswith("tree"):
            assert all(p["proposed"] > 0 for p in pts)
        # one tree-capable engine: chain policies verify chains, `tree` verifies trees
        if name.startswith("tree"):
            assert all(p["request_steps_tree"] > 0 for p in pts)
            assert all(0 <= p["tree_top1_accepted"] <= p["tree_accepted"] for p in pts)
        elif name != "goodput":
            assert all(p["request_steps_tree"] == 0 for p in pts)


def test_sweep_policies_subset(tmp_path, capsys):
    target = make_tiny_checkpoint(tmp_path / "t", "llama")
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    base = ["bench", "sweep", "--model", str(target), "--draft-model", str(head), "--device", "cpu",
            "--concurrency", "2", "--input-len", "6", "--output-len", "4", "--min-requests", "2",
            "--output-json", str(out), "--output-png", str(png)]
    assert main([*base, "--policies", "goodput,off"]) == 0
    assert list(json.loads(out.read_text())["results"]) == ["goodput", "off"]
    for bad, message in ((["--policies", "goodput,fastest"], "unknown policy fastest"),
                         (["--passes", "0"], "expected an integer >= 1")):
        with pytest.raises(SystemExit) as e:
            main([*base, *bad])
        assert e.value.code != 0 and message in capsys.readouterr().err

def test_sweep_interleaves_policies_and_reverses_alternate_passes(monkeypatch):
    """Each concurrency runs every policy once per pass (pass 2 in reverse order, on the next
    prompts; the first policy rotates with log2(c), as in any split of the sweep), a point
    sums its passes, and untimed settle passes at the first concurrency come first."""
    from types import SimpleNamespace

    from gearshift.bench import sweep as sw

    calls = []

    def fake_point(engine, prompts, c, output_len):
        calls.append((engine.policy, c, tuple(p[0] for p in prompts)))
        tpot = [1.0] * len(prompts)
        return {"concurrency": c, "requests": len(prompts), "output_tokens": 10 * len(prompts),
                "output_tok_per_s": 5.0, "elapsed_s": 2.0 * len(prompts), "tpot_ms": tpot,
                "proposed": 4, "accepted": 1, "graphs_captured": 0, "decode_steps": 1,
                "verify_steps": 2, "extend_steps": 3, "request_steps_by_k": {2: 1},
                "request_steps_tree": 1, "tree_accepted": 3, "tree_top1_accepted": 2,
                "catch_up_rows": 7, "catch_up_ms": 0.25,
                "device_ms_median_by_mode": {"verify": 2.0 + c},
                "verify_s_by_gear": {"4": [0.5, 2]},
                "gear_switches": 0, "unscored_plans": 3,
                "graph_keys_captured": [["verify", str(c), "5"]] if c == 4 else [],
                "gc_collections": [1, 0, 0], "gc_ms": 0.5}

    monkeypatch.setattr(sw, "run_point", fake_point)
    engine = SimpleNamespace(scheduler=SimpleNamespace(policy=None))
    args = SimpleNamespace(concurrency=[1, 4], rounds=1, passes=2, min_requests=2, output_len=8,
                           settle=1)
    bar = SimpleNamespace(update=lambda n: None)
    prompts = [[i] for i in range(8)]
    res = sw.sweep(engine, {"a": "A", "b": "B", "c": "C"}, prompts, args, bar)
    assert [(p, c) for p, c, _ in calls] == [
        ("A", 1), ("B", 1), ("C", 1),  # settle: untimed, not in any point
        ("A", 1), ("B", 1), ("C", 1), ("C", 1), ("B", 1), ("A", 1),
        ("C", 4), ("A", 4), ("B", 4), ("B", 4), ("A", 4), ("C", 4)]  # rotated by log2(4)
    assert [ids for p, c, ids in calls if p == "A"] == [(0,), (0,), (1,), (0, 1, 2, 3),
                                                        (4, 5, 6, 7)]
    assert all(len(pts) == 2 and len(pts[0]["pass_tok_per_s"]) == 2 for pts in res.values())
    # the half of a sweep that starts at c = 4 starts it as the whole sweep does
    calls.clear()
    sw.sweep(engine, {"a": "A", "b": "B", "c": "C"}, prompts,
             SimpleNamespace(**{**vars(args), "concurrency": [4], "settle": 0}), bar)
    assert [p for p, c, _ in calls] == ["C", "A", "B", "B", "A", "C"]
    point = res["b"][1]
    assert point["requests"] == 8 and point["elapsed_s"] == 16.0
    assert point["output_tok_per_s"] == 80 / 16.0 and point["pass_tok_per_s"] == [5.0, 5.0]
    assert point["acceptance_rate"] == 0.25 and point["request_steps_by_k"] == {2: 2}
    assert point["gc_collections"] == [2, 0, 0] and point["verify_steps"] == 4
    assert point["graph_keys_captured"] == [["verify", "4", "5"]] * 2  # both passes'
    assert (point["tree_accepted"], point["tree_top1_accepted"]) == (6, 4)
    assert (point["catch_up_rows"], point["catch_up_ms"]) == (14, 0.5)  # summed over passes
    assert point["unscored_plans"] == 6
    assert point["device_ms_median_by_mode"] == {"verify": [6.0, 6.0]}  # one per pass
    assert point["verify_s_by_gear"] == {"4": [1.0, 4]}
    assert res["b"][0]["graph_keys_captured"] == []


def _prior(path, table: dict) -> str:
    """A sweep JSON with {policy: {c: tok/s}}."""
    path.write_text(json.dumps({"results": {
        name: [{"concurrency": c, "output_tok_per_s": v} for c, v in pts.items()]
        for name, pts in table.items()}}))
    return str(path)


def test_every_pass_reaches_the_concurrency_and_refills_it():
    """A pass runs c * rounds requests however many passes there are: a point at c = 128 with
    5 rounds and 8 passes was one wave of 80 requests per pass (never 128 running)."""
    from types import SimpleNamespace

    from gearshift.bench.sweep import per_pass

    for rounds, passes in ((5, 8), (2, 4), (1, 2), (3, 1)):
        args = SimpleNamespace(rounds=rounds, passes=passes, min_requests=16)
        for c in (1, 2, 16, 128, 256):
            assert per_pass(c, args) >= c * rounds
    # a short point still gets min_requests in all
    assert per_pass(1, SimpleNamespace(rounds=1, passes=2, min_requests=16)) == 8


def test_focus_keeps_goodput_and_the_closest_policies_per_concurrency(tmp_path):
    from gearshift.bench.sweep_focus import focus_subsets

    labels = ["goodput", "off", "always-2", "always-4", "tree"]
    a = _prior(tmp_path / "a.json", {"goodput": {1: 9, 64: 9}, "off": {1: 2, 64: 10},
                                     "always-2": {1: 6, 64: 9}, "always-4": {1: 8, 64: 7},
                                     "tree": {1: 9, 64: 3}})
    b = _prior(tmp_path / "b.json", {"off": {1: 2, 64: 9}, "always-2": {1: 7, 64: 10},
                                     "always-4": {1: 9, 64: 7}, "tree": {1: 8, 64: 3}})
    got = focus_subsets([a, b], 2, [1, 64, 256], labels)
    assert got[1] == ["goodput", "always-4", "tree"]  # mean ratio to the best: 0.94, 0.94
    assert got[64] == ["goodput", "off", "always-2"]
    assert got[256] == labels  # not measured before: everything runs
    assert focus_subsets([a], 1, [64], labels)[64] == ["goodput", "off"]


def test_focus_run_measures_only_the_kept_policies(tmp_path, capsys):
    import subprocess
    import sys
    from pathlib import Path

    target = make_tiny_checkpoint(tmp_path / "t", "llama")
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prior = _prior(tmp_path / "prior.json", {"off": {1: 5}, "always-2": {1: 9},
                                             "always-4": {1: 8}, "threshold": {1: 1}})
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    base = ["bench", "sweep", "--model", str(target), "--draft-model", str(head),
            "--device", "cpu", "--rounds", "1", "--input-len", "6", "--output-len", "4",
            "--min-requests", "2", "--tree-topk", "1", "--output-json", str(out),
            "--output-png", str(png)]
    assert main([*base, "--concurrency", "1,2", "--focus", prior]) == 0
    data = json.loads(out.read_text())
    ran = {name: [p["concurrency"] for p in pts] for name, pts in data["results"].items()}
    assert ran["goodput"] == [1, 2] and ran["always-2"] == [1, 2] and ran["always-4"] == [1, 2]
    assert ran["off"] == [2] and ran["threshold"] == [2]  # c = 2 was not in the prior
    assert data["env"]["focus"]["1"] == ["goodput", "always-2", "always-4"]
    script = Path(__file__).resolve().parents[2] / "scripts" / "sweep_table.py"
    table = subprocess.run([sys.executable, str(script), str(out)],
                           capture_output=True, text=True, check=True).stdout
    assert "| 1 | " in table and " - |" in table  # a gap where a policy did not run
    assert "per pass: median, min" in table  # goodput / the best other, paired per pass
    for bad, message in ((str(tmp_path / "missing.json"), "cannot read sweep JSON"),
                         (str(target / "config.json"), "is not a sweep JSON")):
        with pytest.raises(SystemExit) as e:
            main([*base, "--concurrency", "1", "--focus", bad])
        assert e.value.code != 0 and message in capsys.readouterr().err


def test_sweep_table_merges_the_halves_of_a_sweep(tmp_path):
    """Two device calls measure c <= 16 and c >= 32: the table (geomeans against every
    policy) comes from both; a concurrency in both files is refused."""
    import subprocess
    import sys
    from pathlib import Path

    def point(c, v):
        return {"concurrency": c, "output_tok_per_s": v, "acceptance_rate": 0.5,
                "pass_tok_per_s": [v, v]}

    low, high = tmp_path / "low.json", tmp_path / "high.json"
    low.write_text(json.dumps({"results": {"goodput": [point(1, 4.0)], "off": [point(1, 2.0)]}}))
    high.write_text(json.dumps({"results": {"goodput": [point(32, 9.0)],
                                            "off": [point(32, 10.0)]}}))
    script = Path(__file__).resolve().parents[2] / "scripts" / "sweep_table.py"
    merged = tmp_path / "all.json"
    table = subprocess.run([sys.executable, str(script), str(high), str(low), "--merged",
                            str(merged)], capture_output=True, text=True, check=True).stdout
    assert "| 1 | 4 (0.50) | 2 (0.50) |" in table and "| 32 | 9 (0.50) | 10 (0.50) |" in table
    assert "goodput geomean / other policies: off 1.342" in table  # sqrt(4 * 9 / (2 * 10))
    res = json.loads(merged.read_text())["results"]
    assert [p["concurrency"] for p in res["goodput"]] == [1, 32]
    dup = subprocess.run([sys.executable, str(script), str(low), str(low)], capture_output=True,
                         text=True)
    assert dup.returncode != 0 and "in more than one file" in dup.stderr
