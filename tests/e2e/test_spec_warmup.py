"""Speculation warm-up (engine/warmup.py): every (padded batch, K) step shape runs once at
start-up, so graphs exist before serving and goodput starts from measured step times; the
engine is left exactly as it was (no requests, slots, counters), and output is unchanged."""

from __future__ import annotations

import itertools

import pytest
import torch
from checkpoints import random_prompts
from eager_graphs import install
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams
from gearshift.engine.warmup import warm_up_speculation
from gearshift.policy.base import PolicyView
from gearshift.policy.static import AlwaysPolicy


def test_warm_up_captures_every_shape_and_measures_costs(make_llm, tiny_llama_dir, tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([5, 17, 3], seed=4)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, params)]
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3)  # goodput
    eng = llm.engine
    graphs = install(llm)
    free = eng.slots.num_free
    measured = warm_up_speculation(eng, sizes=[1, 2, 4])
    assert sorted(measured) == [0, 1, 2, 3]
    assert all([p[0] for p in pts] == [1.0, 2.0, 4.0] and all(p[1] > 0 for p in pts)
               for pts in measured.values())
    for k in (1, 2, 3):  # the proposal graph of every (padded batch, K) exists
        assert {key[2] for key in graphs.keys if key[:2] == ("eagle3", "expand") and key[3] == k} \
            == {1, 2, 4}
    # goodput starts from them (past them: the start-up's larger sizes, rescaled)
    assert eng.policy.cost.base[2][:3] == measured[2]
    assert eng.measured_costs == measured
    # nothing left behind: no requests, every slot free, counters as before
    assert not eng.has_unfinished_requests() and eng.slots.num_free == free
    assert eng.stats()["steps"] == 0 and llm.spec_stats()["proposed"] == 0
    assert not any(eng.runner.graph_stats().values())
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref


def test_warm_up_skips_sizes_that_do_not_fit(make_llm, tiny_llama_dir, tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2, kv_cache_tokens=400, max_num_seqs=8)
    install(llm)
    measured = warm_up_speculation(llm.engine, sizes=[1, 8, 64])
    assert [p[0] for p in measured[0]] == [1.0, 8.0]  # 64 > max_num_seqs
    assert llm.engine.slots.num_free == llm.engine.slots.total


def _extend_verifying(make_llm, tiny_llama_dir, tmp_path, policy: str):
    """An EAGLE-3 engine (K = 3) on the graph stand-in whose chains verify as graphed causal
    extends at any batch. -> (llm, graphs)."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, spec_policy=policy)
    graphs = install(llm)
    llm.engine.runner.split_k_below = 0
    return llm, graphs


def test_verify_graphs_share_one_output_buffer(make_llm, tiny_llama_dir, tmp_path):
    """Every VERIFY shape writes its logits and features into the same persistent buffers
    (captured largest first by the warm-up), instead of keeping [T, vocab] per shape."""
    llm, graphs = _extend_verifying(make_llm, tiny_llama_dir, tmp_path, "always")
    eng = llm.engine
    outputs = []
    orig = graphs.run

    def spy(key, fn, inputs):
        out = orig(key, fn, inputs)
        if key[0] == "target":
            outputs.append((key, out[0].untyped_storage().data_ptr(),
                            out[1].untyped_storage().data_ptr()))
        return out

    graphs.run = spy
    warm_up_speculation(eng, sizes=[1, 2, 4])
    llm.generate(random_prompts([5, 9, 3], seed=2),
                 SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    assert len({k for k, _, _ in outputs}) >= 6  # (batch, K) shapes
    assert len({p for _, p, _ in outputs}) == 1 and len({p for _, _, p in outputs}) == 1
    assert eng.runner._outputs["logits_mm"].shape == eng.runner._outputs["logits"].shape


def test_warm_up_times_steps_without_garbage_collection(make_llm, tiny_llama_dir, tmp_path):
    """A full collection (tens of ms) inside a timed warm-up step would be read as that gear's
    cost: automatic collection is off while the warm-up runs, and back on afterwards."""
    import gc

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2)
    install(llm)
    eng = llm.engine
    seen = []
    step = eng.step
    eng.step = lambda: seen.append(gc.isenabled()) or step()
    assert gc.isenabled()
    warm_up_speculation(eng, sizes=[1, 2])
    assert seen and not any(seen) and gc.isenabled()


def test_warm_up_measures_the_tree_gear_of_a_tree_engine(make_llm, tiny_llama_dir, tmp_path):
    """An engine that verifies trees (tree_width > 1) warms up chains K = 1..max, the tree
    (gear max + 1: its proposal graphs are captured with width 4) and plain decode; goodput
    then serves with trees and chains, output unchanged."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([5, 17, 3], seed=4)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, params)]
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2, tree_width=4, tree_budget=8)  # goodput
    eng = llm.engine
    graphs = install(llm)
    measured = warm_up_speculation(eng, sizes=[1, 2])
    assert sorted(measured) == [0, 1, 2, 3]  # 3 = the tree
    expand = {(key[3], key[4]) for key in graphs.keys if key[:2] == ("eagle3", "expand")}
    assert {(1, 1), (2, 1), (2, 4)} <= expand  # (K, width): chains and the tree
    policy = eng.policy  # goodput prices the tree from the warm-up and may pick it
    assert policy.cost.base[3][:len(measured[3])] == measured[3]
    assert policy.top_gear(PolicyView([], 0, 2, None, 4)) == 3
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    assert not eng.has_unfinished_requests() and eng.slots.num_available == eng.slots.total


def test_serving_replays_what_the_warm_up_captured(make_llm, tiny_llama_dir, tmp_path):
    """Split-K or causal-extend verification of chains is decided on the padded batch (the
    graph's shape): 3 requests padded to 4 rows replay the graphs the warm-up captured at
    4. Deciding on the 3 real requests would take the split-K path there and capture a new
    graph in the middle of a run."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, spec_policy="always")
    graphs = install(llm)
    eng = llm.engine
    kv_heads = eng.runner.model.config.num_kv_heads
    eng.runner.split_k_below = 4 * kv_heads  # split-K below 4 rows, extend from 4 on
    assert eng.spec.split_k_chains(2) and not eng.spec.split_k_chains(3)  # 3 -> 4 rows
    warm_up_speculation(eng, sizes=[1, 2, 4])
    captured = set(graphs.keys)
    prompts = random_prompts([5, 9, 3], seed=2)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, params)
    assert llm.spec_stats()["proposed"] > 0
    assert set(graphs.keys) == captured


@pytest.mark.parametrize("split_k", [False, True])
def test_mixed_k_serving_replays_what_the_warm_up_captured(make_llm, tiny_llama_dir, tmp_path,
                                                           split_k):
    """The warm-up also runs every mixed-K shape (each deepest K and token bucket): serving
    with a K per request (the random policy) then captures no graph of its own. With
    split-K verification (few rows) the chains verify as a padded tree: its greedy
    verification graph must not depend on how many nodes the requests' K add up to."""
    llm, graphs = _extend_verifying(make_llm, tiny_llama_dir, tmp_path, "random")
    eng = llm.engine
    if split_k:
        eng.runner.split_k_below = 1 << 20
    warm_up_speculation(eng, sizes=[1, 2, 4, 8])
    captured = set(graphs.keys)
    mixed = {k[2] for k in captured if k[:2] == ("target", "verify-mixed")}
    assert mixed == (set() if split_k else {3, 5, 9})
    prompts = random_prompts([5, 9, 3, 12, 7, 4], seed=2)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, params)
    assert llm.spec_stats()["mixed_k_steps"] > 0
    assert set(graphs.keys) == captured


def test_a_burst_of_chunked_prompts_replays_what_the_warm_up_captured(make_llm, tiny_llama_dir,
                                                                       tmp_path):
    """Eight prompts at once, prefilled in chunks beside the decoders: on graphs no chunk
    rides in a VERIFY step (such steps are plain, the decoders at K = 0), and no graph is
    captured after the warm-up (a chunk's length is no draft shape)."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, spec_policy="always", max_num_seqs=8,
                   max_num_batched_tokens=64)
    graphs = install(llm)
    eng = llm.engine
    warm_up_speculation(eng, sizes=[1, 2, 4, 8])
    captured = set(graphs.keys)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(random_prompts([30] * 8, seed=3)):
        eng.add_request(f"r{i}", prompt, params)
    schedule, ride = eng.scheduler.schedule, []

    def spy():
        plan = schedule()
        ride.append(plan.speculating and not all(plan.decoding))
        return plan

    eng.scheduler.schedule = spy
    while eng.has_unfinished_requests():
        eng.step()
    assert llm.spec_stats()["proposed"] > 0
    assert set(graphs.keys) == captured
    assert not any(ride)


@pytest.mark.parametrize("topk", [1, 2])
def test_sampled_requests_replay_what_the_warm_up_captured(make_llm, tiny_llama_dir, tmp_path,
                                                           topk):
    """Sampled requests, alone or beside greedy ones, with or without top-k / top-p, at
    every K (and the tree): the warm-up captured their draft expansions and verifications,
    so none is captured while they run."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, tree_width=topk, max_num_seqs=8)
    graphs = install(llm)
    eng = llm.engine
    warm_up_speculation(eng, sizes=[1, 2, 4, 8])
    captured = set(graphs.keys)
    kinds = [dict(temperature=0.8), dict(temperature=1.0, top_p=0.9),
             dict(temperature=0.7, top_k=20), dict(temperature=0.0)]
    for burst, mix in enumerate([[0] * 8, [1, 3] * 4, [2] * 3, [0, 2, 3, 1, 3]]):
        for i, kind in enumerate(mix):
            eng.add_request(f"b{burst}r{i}", random_prompts([6 + i], seed=i)[0],
                            SamplingParams(max_tokens=10, seed=i, ignore_eos=True, **kinds[kind]))
        gears = itertools.cycle([(k, 1) for k in (3, 1, 2)] + [(3, topk)] * (topk > 1))
        while eng.has_unfinished_requests():
            eng.set_policy(AlwaysPolicy(*next(gears)))
            eng.step()
    assert llm.spec_stats()["proposed"] > 0
    assert sorted(map(str, set(graphs.keys) - captured)) == []


def test_a_warm_up_after_start_up_is_not_counted_as_serving(make_llm, tiny_llama_dir, tmp_path):
    """`bench sweep` warms speculation up on an engine already started (and watching): what
    that warm-up captures is not a late capture, and the watch counts again after it."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2)
    graphs = install(llm)
    eng = llm.engine
    eng.watch.start(eng.runner)  # as Engine.__init__ does, now that the stand-in has graphs
    warm_up_speculation(eng, sizes=[1, 2])
    assert graphs.keys and eng.stats()["late"]["graph_captures"] == 0
    eng.runner.shape_graphs.run(("new",), lambda s: s["x"] + 1, {"x": torch.zeros(2)})
    assert eng.stats()["late"]["graph_captures"] == 1


def test_running_out_of_gpu_memory_in_the_warm_up_is_a_clear_error(make_llm, tiny_llama_dir,
                                                                   tmp_path, monkeypatch):
    """A GPU too small for max_num_seqs shows in the warm-up's largest steps: the start-up
    fails with what to change (a ConfigError: the CLI's message and exit code 2), not an
    allocator traceback."""
    from gearshift.config import ConfigError

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2)
    install(llm)
    eng = llm.engine
    step, calls = eng.step, []

    def short_of_memory():
        calls.append(1)
        if len(calls) == 5:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 5.69 GiB")
        return step()

    monkeypatch.setattr(eng, "step", short_of_memory)
    with pytest.raises(ConfigError, match="out of memory in the speculation warm-up at 4 "
                                          "requests.*--max-num-seqs") as e:
        warm_up_speculation(eng, sizes=[1, 2, 4])
    assert isinstance(e.value.__cause__, torch.OutOfMemoryError)
    assert "at 4 requests a step (greedy, " in str(e.value)  # the phase that ran out
    monkeypatch.undo()  # the real step again: drain what the failed warm-up left running
    for req in [*eng.scheduler.running, *eng.scheduler.waiting]:
        eng.abort_request(req.request_id)
    while eng.has_unfinished_requests():
        eng.step()


def test_a_deep_draft_warms_up_inside_a_short_context(make_llm, tiny_llama_dir):
    """K = 12 (suffix decoding): the warm-up's steps commit more tokens than the context
    holds (max_model_len 512), so it admits its batch afresh instead of asking for a
    request longer than the context; every mixed-K shape still runs."""
    llm = make_llm(tiny_llama_dir, speculative_algorithm="suffix", num_draft_tokens=12,
                   kv_cache_tokens=8192)
    eng = llm.engine
    assert eng.max_model_len == 512
    graphs = install(llm)
    eng.runner.split_k_below = 0  # chains verify as causal extends: the mixed-K shapes
    measured = warm_up_speculation(eng, sizes=[1, 2])
    assert sorted(measured) == list(range(13))
    buckets = {key[3] for key in graphs.keys if key[:3] == ("target", "verify-mixed", 3)}
    assert buckets == {2 * j for j in range(2, 14)}  # every token bucket of 2 rows, K <= 12
    assert not eng.has_unfinished_requests() and eng.slots.num_free == eng.slots.total
