"""`gearshift bench spec-tax` and `gearshift bench burst` on CPU: the reports are complete
and their invariants hold (both engines measured at each batch size, B never speculates;
the burst drives the probes to K = 0, speculation resumes, greedy outputs are identical).
The speed and acceptance criteria themselves are for the GPU run, not asserted here.

Data flow (tests only): tiny checkpoints / the default model -> bench functions -> dicts, JSON.
"""

from __future__ import annotations

import json

from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift.bench import burst, spec_tax
from gearshift.cli import build_parser


def test_spec_tax_measures_both_engines_at_each_batch_size(make_llm, tiny_llama_dir, tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    a = make_llm(tiny_llama_dir)
    b = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                 spec_policy="off")
    rows = spec_tax.measure_tax({"A": a, "B": b}, [1, 4], input_len=16, output_len=12,
                                repeats=2, skip=2)
    assert [r["batch_size"] for r in rows] == [1, 4]
    for r in rows:
        for name in ("A", "B"):
            m = r[name]
            # 2 windows of 11 or 12 full-batch decode steps (the prefill samples token 1,
            # or the prompt's last token runs as a decode step), 2 skipped in each
            assert m["steps"] in (2 * (11 - 2), 2 * (12 - 2)) and m["steps"] == r["A"]["steps"]
            assert m["wall_ms_median"] > 0
            assert m["device_ms_median"] is None and m["span_ms_median"] is None  # CPU: no events
            assert [w["first"] for w in m["windows"]] == ([True, False] if name == "A" else [False, True])
        assert r["ratio_wall"] == r["B"]["wall_ms_median"] / r["A"]["wall_ms_median"]
        assert r["ratio_device"] is None and r["within_3pct"]["wall"] in (True, False)
    assert b.engine.stats()["verify_steps"] == 0 and a.engine.spec is None
    assert b.engine.spec.stats["proposed"] == 0


def test_spec_tax_cli_writes_json(tiny_llama_dir, tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    out = tmp_path / "tax.json"
    args = build_parser().parse_args([
        "bench", "spec-tax", "--model", str(tiny_llama_dir), "--draft-model", str(head),
        "--device", "cpu", "--dtype", "float32", "--attention-backend", "torch",
        "--batch-sizes", "1,3", "--input-len", "8", "--output-len", "8", "--repeats", "1",
        "--skip-steps", "1", "--output-json", str(out)])
    assert args.func(args) == 0
    r = json.loads(out.read_text())
    assert r["bench"] == "spec-tax" and r["b_verify_steps"] == 0
    assert [x["batch_size"] for x in r["results"]] == [1, 3]
    assert all(x["A"]["steps"] == x["B"]["steps"] in (6, 7) for x in r["results"])
    assert r["env"]["max_num_seqs"] == 3 and r["env"]["kv_slots"] == 3 * (8 + 8 + 8) + 256
    assert r["env"]["draft"] == {"speculative_algorithm": "eagle3", "draft_model": str(head)}
    assert r["args"]["batch_sizes"] == [1, 3] and "func" not in r["args"]


def test_burst_drives_probes_to_k0_and_speculation_resumes(make_llm):
    """The shipped default pair (real acceptance: a random tiny head accepts ~nothing, so
    goodput would never speculate). The cost model is frozen at its CPU roofline prior, so
    the policy's choices do not follow this machine's noisy wall times."""
    from gearshift.bench.sweep import make_prompts
    from gearshift.models.default import default_target_dir

    n_burst = 24
    llm = make_llm(default_target_dir(), speculative_algorithm="eagle3", max_num_seqs=2 + n_burst)
    llm.engine.policy.observe = lambda *a: None
    llm.engine.policy.explore_every = 10**9  # no exploration steps: same choices per run
    prompts = make_prompts(llm.tokenizer, llm.engine.model_config.vocab_size, 2 + n_burst, 48, 0)
    r = burst.burst_experiment(llm, prompts[:2], [p[:24] for p in prompts[2:]], max_tokens=120,
                                  burst_tokens=16, inject_at=24, window=(72, 120))
    b = r["burst"]
    assert b["size"] == n_burst and min(b["inject_tokens"]) >= 24
    assert b["max_batch"] == 2 + n_burst
    assert b["probe_steps_k0"] > 0 and b["k_hist"][0] == b["probe_steps_k0"]
    assert b["finished_before_window"] and max(b["end_tokens"]) < 72
    assert all(t is not None and t >= e for t, e in zip(b["resumed_at_tokens"], b["end_tokens"]))
    assert r["outputs_identical"] and r["first_divergence"] == [None, None]
    assert r["reference_outputs_identical"]
    for name in ("reference", "after_burst", "reference_2"):
        w = r[name]
        assert w["verify_steps"] > 0 and 0 < w["proposed"] and 0 <= w["accepted"] <= w["proposed"]
        assert w["acceptance_rate"] == w["accepted"] / w["proposed"]
        assert sum(w["k_hist"].values()) == w["verify_steps"] and 0 not in w["k_hist"]
        assert sum(p["proposed"] for p in w["per_probe"]) == w["proposed"]
    # frozen costs: the policy's choices depend on acceptance only, so two reference runs
    # (before and after the burst) make the same steps
    assert r["reference"] == r["reference_2"] and r["reference_noise"]["abs_diff"] == 0
    c = r["comparison"]["acceptance_rate"]
    assert c["abs_diff"] == c["after_burst"] - c["reference"]
    assert set(r["checks"]) >= {"k0_during_burst", "outputs_identical", "within_2pct_abs",
                                "within_2pct_rel"} and r["checks"]["k0_during_burst"]
    # the draft followed every token committed at K = 0: where both runs verified from the
    # same position, it proposed the very same chain
    sp = r["shared_positions"]
    assert sp["steps"] > 0 and sp["identical_drafts"] == sp["steps"]
    tm = r["text_matched"]  # identical outputs: every probe counts, the all-probe rates
    assert tm["probes"] == [0, 1] and tm["acceptance_rate"] == c
    assert tm["acceptance_rate_k_matched"] == r["comparison"]["acceptance_rate_k_matched"]
    assert "text_k_matched_within_2pct_rel" in r["checks"]
    assert set(r["step_records"]) == {"reference", "after_burst", "reference_2"}
    # a saved JSON's records give back the same window statistics (scripts/burst_text_matched.py)
    assert burst.window_stats(burst.expand(r["step_records"]["reference"]), 72, 120) == r["reference"]
    json.dumps(r)  # the report is JSON-serialisable as it stands
    # the tap's bookkeeping against the truth: greedy verification accepts exactly the drafts
    # that match the committed output
    run = burst.probe_run(llm, prompts[:2], 40)
    verify_steps = [(s, out) for rows, out in zip(run["steps"].values(), run["outputs"])
                    for s in rows if s["k"] and s["pos"] + s["k"] < len(out)]  # not cut at the end
    assert verify_steps
    for s, out in verify_steps:
        want = out[s["pos"]:s["pos"] + s["k"]]
        match = next((i for i, (d, t) in enumerate(zip(s["drafts"], want)) if d != t), len(want))
        assert len(s["drafts"]) == s["k"] == s["proposed"] and s["accepted"] == match
        assert s["emitted"] == s["accepted"] + 1


def test_text_matched_acceptance_leaves_out_probes_whose_text_forked():
    """Probe 1 forks at token 13 in one run and loops (every draft accepted): the all-probe
    rates differ by a third, the rates over the probes that wrote the same text do not. A
    fork inside the window's last K tokens still changes what its last drafts met. The
    K-matched rate weighs each run's per-K rate by the second run's proposals per K."""
    def run(*probes):  # per probe: (K, accepted) verify steps at positions 0, 10, 20, ...
        return {f"p{i}": [{"pos": 10 * j, "k": k, "proposed": k, "accepted": a}
                          for j, (k, a) in enumerate(steps)] for i, steps in enumerate(probes)}
    ref = run([(4, 2), (4, 3)], [(4, 4), (4, 4)], [(2, 1), (2, 1)])
    other = run([(4, 3), (4, 2)], [(4, 1), (4, 0)], [(4, 2), (4, 2)])
    r = burst.text_matched(ref, other, [None, 13, 98], 0, 100)
    assert r["probes"] == [0] and r["acceptance_rate"]["reference"] == r["acceptance_rate"][
        "after_burst"] == 5 / 8 and r["acceptance_rate"]["rel_diff"] == 0
    r = burst.text_matched(ref, other, [None, 13, 104], 0, 100)
    assert r["probes"] == [0, 2] and r["acceptance_rate"]["reference"] == 7 / 12
    assert r["acceptance_rate"]["after_burst"] == 9 / 16
    # K-matched: other's proposals are all at K = 4, so both runs' K = 4 rates
    assert r["acceptance_rate_k_matched"]["reference"] == 5 / 8
    assert r["acceptance_rate_k_matched"]["after_burst"] == 9 / 16
    assert burst.text_matched(ref, other, [5, 13, 7], 0, 100)["acceptance_rate"]["rel_diff"] is None


def test_burst_cli_registered_with_issue_defaults():
    args = build_parser().parse_args(["bench", "burst", "--draft-model", "HEAD"])
    assert args.func is burst.run_burst and args.speculative_algorithm == "eagle3"
    assert (args.probes, args.burst_size, args.inject_at, args.window) == (16, 256, 64, [320, 576])
    args = build_parser().parse_args(["bench", "spec-tax"])
    assert args.func is spec_tax.run_tax and args.batch_sizes == [1, 32, 128]
