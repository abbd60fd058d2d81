"""`gearshift bench sweep` end to end on CPU with a tiny target + EAGLE-3 head: every policy
is measured at every concurrency (after an untimed warm-up) in a closed loop of at most c
requests, JSON, PNG, the markdown table and the criteria verdicts are written; the table and
verdicts (sweep_report.py) on hand-made results.

Data flow (tests only): tiny checkpoints -> `gearshift bench sweep` / sweep functions -> JSON,
stdout; fake sweep results -> sweep_report."""

from __future__ import annotations

import json

import pytest
from checkpoints import make_tiny_checkpoint
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift.bench.sweep import CHAIN_POLICIES
from gearshift.cli import main


def test_sweep_cli_writes_every_point(tmp_path, capsys):
    target = make_tiny_checkpoint(tmp_path / "t", "llama")
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    rc = main(["bench", "sweep", "--model", str(target), "--draft-model", str(head),
               "--device", "cpu", "--concurrency", "1,3", "--rounds", "1", "--input-len", "6",
               "--output-len", "6", "--min-requests", "2", "--tree-width", "2", "--tree-budget", "4",
               "--settle", "0",  # goodput settled on the CPU speculates no more: keep its VERIFYs
               "--output-json", str(out), "--output-png", str(png)])
    assert rc == 0 and png.stat().st_size > 0
    data = json.loads(out.read_text())
    results = data["results"]
    printed = capsys.readouterr().out
    assert "| c | goodput | off |" in printed and "| 3 | " in printed  # the markdown table
    assert "goodput >= 1.8 x off at c = 1: " in printed  # and the verdicts under it
    assert [p["concurrency"] for p in data["criteria"]["points"]] == [1, 3]
    assert set(CHAIN_POLICIES) < set(results) and any(k.startswith("tree-") for k in results)
    for name, pts in results.items():
        assert [p["concurrency"] for p in pts] == [1, 3]
        # two passes (interleaved policies) of c * rounds requests each
        assert [p["requests"] for p in pts] == [2, 6]
        assert all(p["output_tok_per_s"] > 0 and len(p["pass_tok_per_s"]) == 2 for p in pts)
        assert [p["max_running"] for p in pts] == [1, 3]  # the closed loop filled c slots
        assert all(len(p["gc_collections"]) == 3 and p["gc_ms"] >= 0 for p in pts)
        assert all(p["graph_keys_captured"] == [] for p in pts)  # CPU: no graphs
        assert all(p["verify_eager_passes"] >= p["verify_steps"] for p in pts)  # so all eager
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
            assert all(r[m][0] > 0 and r[m][1] > 0 for p in pts for r in p["cost_model_ratio"]
                       for m in ("verify", "plain") if m in r)
            # plain steps are observed on the CPU too (their wall time is their cost)
            assert any("plain" in r for p in pts for r in p["cost_model_ratio"])
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
                         (["--passes", "0"], "expected an integer >= 1"),
                         (["--temperature", "-1"], "must be a number >= 0")):
        with pytest.raises(SystemExit) as e:
            main([*base, *bad])
        assert e.value.code != 0 and message in capsys.readouterr().err

def _record_temperatures(monkeypatch) -> list[float]:
    """-> the temperature of every request the sweep's closed loops run, as they run."""
    from gearshift.bench import sweep_point

    seen, loop = [], sweep_point.closed_loop

    def recording(engine, prompts, concurrency, params_of, on_step=None):
        seen.extend(params_of(i).temperature for i in range(len(prompts)))
        return loop(engine, prompts, concurrency, params_of, on_step)

    monkeypatch.setattr(sweep_point, "closed_loop", recording)
    return seen


def test_sweep_samples_at_its_temperature(tmp_path, monkeypatch):
    """--temperature reaches every request of the sweep, its warm-ups included."""
    seen = _record_temperatures(monkeypatch)
    target = make_tiny_checkpoint(tmp_path / "t", "llama")
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    assert main(["bench", "sweep", "--model", str(target), "--draft-model", str(head),
                 "--device", "cpu", "--concurrency", "2", "--input-len", "6", "--output-len",
                 "4", "--min-requests", "2", "--policies", "goodput,off", "--temperature",
                 "0.8", "--output-json", str(tmp_path / "s.json"), "--output-png",
                 str(tmp_path / "s.png")]) == 0
    assert seen and set(seen) == {0.8}


def test_sweep_mixed_workload_mixes_greedy_and_sampled_requests(tmp_path, monkeypatch):
    """--workload mixed: --greedy-fraction of the requests greedy, interleaved, the others
    at --sampled-temperature, warm-ups included."""
    from gearshift.bench import sweep_point

    of = sweep_point.mixed_temperatures(0.5, 1.2)
    assert [of(i) for i in range(6)] == [1.2, 0.0] * 3
    assert [sweep_point.mixed_temperatures(0.25, 1.0)(i) for i in range(8)].count(0.0) == 2
    seen = _record_temperatures(monkeypatch)
    target = make_tiny_checkpoint(tmp_path / "t", "llama")
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    out = tmp_path / "s.json"
    assert main(["bench", "sweep", "--model", str(target), "--draft-model", str(head),
                 "--device", "cpu", "--concurrency", "2", "--input-len", "6", "--output-len",
                 "4", "--min-requests", "4", "--policies", "goodput,goodput-request",
                 "--workload", "mixed", "--sampled-temperature", "1.3",
                 "--output-json", str(out), "--output-png", str(tmp_path / "s.png")]) == 0
    # each closed loop alternates from a sampled request (odd loops: one more of those)
    assert set(seen) == {0.0, 1.3} and len(seen) // 3 < seen.count(0.0) <= len(seen) // 2
    data = json.loads(out.read_text())
    assert list(data["results"]) == ["goodput", "goodput-request"]
    assert data["args"]["workload"] == "mixed"


def test_sweep_interleaves_policies_and_reverses_alternate_passes(monkeypatch):
    """Each concurrency runs every policy once per pass (pass 2 in reverse order, on the next
    prompts; the first policy rotates with log2(c), as in any split of the sweep), a point
    sums its passes, and untimed settle passes at the first concurrency come first."""
    from types import SimpleNamespace

    from gearshift.bench import sweep as sw

    calls = []

    def fake_point(engine, prompts, c, output_len, temperature):
        calls.append((engine.policy, c, tuple(p[0] for p in prompts)))
        tpot = [1.0] * len(prompts)
        return {"concurrency": c, "requests": len(prompts), "output_tokens": 10 * len(prompts),
                "output_tok_per_s": 5.0, "elapsed_s": 2.0 * len(prompts), "tpot_ms": tpot,
                "proposed": 4, "accepted": 1, "graphs_captured": 0, "decode_steps": 1,
                "verify_steps": 2, "extend_steps": 3, "request_steps_by_k": {2: 1},
                "request_steps_tree": 1, "tree_accepted": 3, "tree_top1_accepted": 2,
                "catch_up_rows": 7, "catch_up_ms": 0.25, "verify_eager_passes": 0,
                "device_ms_median_by_mode": {"verify": 2.0 + c},
                "verify_s_by_gear": {"4": [0.5, 2]},
                "gear_switches": 0, "unscored_plans": 3,
                "graph_keys_captured": [["verify", str(c), "5"]] if c == 4 else [],
                "gc_collections": [1, 0, 0], "gc_ms": 0.5}

    monkeypatch.setattr(sw, "run_point", fake_point)
    engine = SimpleNamespace(policy=None)
    engine.set_policy = lambda policy: setattr(engine, "policy", policy)
    args = SimpleNamespace(concurrency=[1, 4], rounds=1, passes=2, min_requests=2, output_len=8,
                           settle=1, temperature=0.0)
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


def test_closed_loop_keeps_at_most_c_requests_in_the_engine(make_llm, tiny_llama_dir):
    """The sweep's closed loop adds the next prompt when one finishes: never more than c
    requests in the engine (none queued), c running once it filled, every prompt served."""
    from gearshift.bench.sweep_point import closed_loop
    from gearshift.request import SamplingParams

    llm = make_llm(tiny_llama_dir)
    engine = llm.engine
    prompts = [[5 + i, 6, 7, 8] for i in range(7)]
    seen, done = [], []

    def on_step(outs):
        seen.append((engine.num_running(), engine.num_waiting()))
        done.extend(o.request_id for o in outs if o.finished)

    closed_loop(engine, prompts, 3,
                lambda i: SamplingParams(max_tokens=2 + i % 3, temperature=0.0, ignore_eos=True),
                on_step)
    assert len(done) == 7 and not engine.has_unfinished_requests()
    assert all(running + waiting <= 3 for running, waiting in seen)
    assert max(running for running, _ in seen) == 3


def _point(c: int, tps: float, acc: float | None = 0.5, passes=None, **extra) -> dict:
    return {"concurrency": c, "output_tok_per_s": tps, "acceptance_rate": acc,
            "pass_tok_per_s": passes or [tps, tps], **extra}


def test_sweep_report_table_and_verdicts():
    """goodput / best other per concurrency, paired per pass, goodput's K mix (tree steps
    apart), geometric means of the policies measured everywhere, "-" where a cut sweep has no
    point, and both criteria with their thresholds."""
    from gearshift.bench.sweep_report import markdown_table, verdict_lines, verdicts

    results = {
        "goodput": [_point(1, 420.0, 0.2, [400.0, 440.0], request_steps_by_k={4: 10},
                           request_steps_tree=6),
                    _point(64, 9_900.0, 0.6, [9_800.0, 10_000.0])],
        "off": [_point(1, 200.0, None), _point(64, 10_000.0, None, [10_000.0, 9_900.0])],
        "tree": [_point(1, 410.0, 0.15, [420.0, 400.0])],  # cut before c = 64
    }
    v = verdicts(results)
    assert [p["best_other"] for p in v["points"]] == ["tree", "off"]
    assert v["points"][0]["goodput_over_best"] == 420.0 / 410.0
    assert v["points"][0]["paired_median"] == (400 / 420 + 440 / 400) / 2
    assert v["points"][1]["paired_min"] == 0.98
    assert v["min_goodput_over_best"] == 0.99 and v["goodput_within_best"] is True
    assert v["goodput_over_off_c1"] == 2.1 and v["goodput_beats_off_c1"] is True
    assert set(v["geomean"]) == {"goodput", "off"}  # the cut policy has no geomean
    table = markdown_table(results)
    assert "| c | goodput | off | tree | best other | goodput / best |" in table
    assert "| 1 | 420 (0.20) | 200 | 410 (0.15) | tree | **1.024** |" in table
    assert "| 64 | 9,900 (0.60) | 10,000 | - | off | **0.990** | 0.995, 0.980 |" in table
    assert "4: 4, tree: 6" in table
    assert verdict_lines(v) == [
        "goodput >= 0.97 x the best other policy at every concurrency: PASS (min 0.990)",
        "goodput >= 1.8 x off at c = 1: PASS (2.10)"]
    slow = {**results, "goodput": [_point(1, 300.0), _point(64, 9_000.0)]}
    assert verdict_lines(verdicts(slow)) == [
        "goodput >= 0.97 x the best other policy at every concurrency: FAIL (min 0.732)",
        "goodput >= 1.8 x off at c = 1: FAIL (1.50)"]
    no_c1 = verdicts({q: pts[1:] for q, pts in results.items()})
    assert no_c1["goodput_over_off_c1"] is None and no_c1["goodput_beats_off_c1"] is None


def test_a_point_counts_the_steps_run_with_c_requests_in_flight(make_llm, tiny_llama_dir):
    """The loop's tail (no prompt left to admit, fewer than c running) is measured apart:
    3 slots, 4 prompts of 6 tokens: the fourth runs alone after the first three."""
    from gearshift.bench.sweep_point import merge_passes, run_point

    engine = make_llm(tiny_llama_dir).engine
    prompts = [[5 + i, 6, 7, 8] for i in range(4)]
    tail = run_point(engine, prompts, 3, 6)
    assert tail["output_tokens"] == 24 and tail["at_c_tokens"] == 18
    assert 0 < tail["at_c_s"] < tail["elapsed_s"]
    lockstep = run_point(engine, prompts[:3], 3, 6)
    assert lockstep["at_c_tokens"] == lockstep["output_tokens"] == 18
    merged = merge_passes([tail, lockstep])
    assert merged["at_c_tokens"] == 36
    assert merged["at_c_tok_per_s"] == 36 / (tail["at_c_s"] + lockstep["at_c_s"])


def test_a_point_starts_with_a_cold_prefix_cache(make_llm, tiny_llama_dir):
    """The untimed warm-up runs the point's first prompts: their cached prefixes would make
    the timed run's prefills free. Each point meets a cold cache instead."""
    from gearshift.bench.sweep_point import merge_passes, run_point

    engine = make_llm(tiny_llama_dir).engine
    prompts = [[5 + i, 6 + i, 7, 8] for i in range(4)]
    point = run_point(engine, prompts, 3, 6)
    assert point["prefix_hit_tokens"] == 0
    again = run_point(engine, prompts + [[5, 6, 7, 8, 9]], 3, 6)
    assert again["prefix_hit_tokens"] == 4  # the last prompt extends the first
    assert merge_passes([point, again])["prefix_hit_tokens"] == 4


def test_the_report_sets_goodput_against_the_best_at_c():
    """Beside the criteria: goodput / the best other policy on the steps at concurrency c,
    and the share of goodput's time they took ("-" for points without them)."""
    from gearshift.bench.sweep_report import markdown_table, verdicts

    results = {"goodput": [_point(32, 900.0, at_c_tok_per_s=1_100.0, at_c_s=0.75,
                                  elapsed_s=1.0)],
               "off": [_point(32, 1_000.0, None, at_c_tok_per_s=1_000.0, at_c_s=1.0,
                              elapsed_s=1.0)]}
    p = verdicts(results)["points"][0]
    assert p["goodput_over_best"] == 0.9 and p["at_c_over_best"] == 1.1
    assert p["at_c_share"] == 0.75
    assert "| at c: goodput / best (its time at c) |" in markdown_table(results)
    assert "| 1.100 (75%) |" in markdown_table(results)
    old = {q: [_point(32, pts[0]["output_tok_per_s"])] for q, pts in results.items()}
    assert verdicts(old)["points"][0]["at_c_over_best"] is None
    assert markdown_table(old).splitlines()[2].endswith("| - |")
