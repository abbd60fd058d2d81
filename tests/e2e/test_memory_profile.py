"""The start-up memory profile's path on the CPU, with a fake device memory: the engine
starts on a provisional KV cache, runs the largest steps (prefill budget, trees and chains,
greedy and sampled, a full decode batch), sizes the cache from the fake budget, reallocates
the target's and the draft's caches and a fresh slot pool, and then serves exactly as an
engine given that many slots.

Data flow (tests only): LLM(kv_cache_tokens=None) -> Engine -> profile_steps(engine,
FakeMemory) -> size_kv -> KvPlan -> generate.
"""

from __future__ import annotations

import pytest
from checkpoints import random_prompts
from eager_graphs import EagerGraphs
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams
from gearshift.config import ConfigError
from gearshift.engine import memory_profile
from gearshift.runner.memory_plan import GIB, profile_slots
from gearshift.runner.model_runner import ModelRunner
from gearshift.speculative.draft_follow import DraftFollower

GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
PROMPTS = random_prompts([3, 17, 40, 9, 25], seed=5)
OUTSIDE = 512 * 2**20  # the fake CUDA context


class FakeMemory:
    """Device counters from the engine's real tensors: weights, draft, the caches; the
    profiled steps add `activations` to the peak."""

    def __init__(self, engine, total: int, activations: int, buffers: int = 2**20) -> None:
        self.engine, self.total, self.act, self.buffers = engine, total, activations, buffers
        self.verify: list[tuple[int, int]] = []  # run_largest_steps' VERIFY steps
        self.prefill_features = False  # a plain step gave the draft the target's features
        self._peak = 0

    def _caches(self) -> int:
        runner, spec = self.engine.runner, self.engine.spec
        tensors = [runner.kv.k, runner.kv.v]
        if spec is not None:
            tensors += [spec.proposer.kv.k, spec.proposer.kv.v, spec.proposer.features]
        return sum(t.numel() * t.element_size() for t in tensors)

    def settle(self) -> None:
        """Nothing to wait for: the fake's counters are exact at once."""

    def allocated(self) -> int:
        return (self.engine.runner.weights_bytes + memory_profile._draft_bytes(self.engine)
                + self.buffers + self._caches())

    def reserved(self) -> int:
        return self.allocated()

    def reset_peak(self) -> None:
        self._peak = self.allocated() + self.act

    def peak(self) -> int:
        return self._peak

    def peak_reserved(self) -> int:
        return self.reserved()

    def free_total(self) -> tuple[int, int]:
        return self.total - self.reserved() - OUTSIDE, self.total


@pytest.fixture
def profiled(monkeypatch):
    """LLM factory whose engines profile on the CPU with FakeMemory(total, activations)."""
    seen = {}
    orig, steps = memory_profile.profile_steps, memory_profile.run_largest_steps

    def factory(make_llm, model_dir, total, activations, **kw):
        def fake(engine, mem=None):
            seen["mem"] = FakeMemory(engine, total, activations)
            return orig(engine, seen["mem"])

        def record(*args):
            top, seen["mem"].verify = steps(*args)
            return top, seen["mem"].verify

        monkeypatch.setattr(ModelRunner, "_profiles_memory",
                            lambda self: self.config.kv_cache_tokens is None)
        monkeypatch.setattr(memory_profile, "profile_steps", fake)
        monkeypatch.setattr(memory_profile, "run_largest_steps", record)
        follow = DraftFollower.after_plain

        def after_plain(self, plan, aux):
            if memory_profile.profile_steps is fake and "mem" in seen and aux is not None:
                seen["mem"].prefill_features = True
            return follow(self, plan, aux)

        monkeypatch.setattr(DraftFollower, "after_plain", after_plain)
        llm = make_llm(model_dir, **{"kv_cache_tokens": None, **kw})
        return llm, seen["mem"]

    return factory


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    return make_eagle3_checkpoint(tmp_path_factory.mktemp("eagle3"), aux_layer_ids=[0, 1, 1])


def _tree(head_dir) -> dict:
    return dict(speculative_algorithm="eagle3", draft_model=str(head_dir), num_draft_tokens=3,
                tree_width=3, tree_budget=8, spec_policy="always", max_num_seqs=6,
                max_num_batched_tokens=64)


def _total_for(llm, slots: int, activations: int) -> int:
    """A card on which `slots` slots fit beside everything else at utilization 0.9."""
    b = llm.engine.runner.memory_plan.budget
    rest = b.weights + b.draft + b.buffers + activations + b.outside_torch
    return int((rest + (slots + 1) * b.bytes_per_slot) / 0.9) + 1


def test_profile_sizes_the_caches_and_the_engine_serves_alike(make_llm, profiled,
                                                              tiny_llama_dir, head_dir):
    first, _ = profiled(make_llm, tiny_llama_dir, total=GIB, activations=2**20,
                        **_tree(head_dir))
    total = _total_for(first, 3000, 2**20)
    llm, mem = profiled(make_llm, tiny_llama_dir, total=total, activations=2**20,
                        **_tree(head_dir))
    eng, plan = llm.engine, llm.engine.runner.memory_plan
    # greedy, sampled, nucleus: a tree step (8 nodes) and a chain step (K + 1) at 6 requests
    assert [tokens for tokens, _ in mem.verify] == [48, 24] * 3
    assert mem.prefill_features  # the draft's pass over the prefill had the target's features
    b = plan.budget
    assert b.activations == 2**20 and b.outside_torch == OUTSIDE and b.graph_pools == 0
    assert b.warmup_peak == 0  # no graphs: no capture pass
    assert b.min_slots == profile_slots(eng.config, eng.runner.max_positions)
    # one slot: the target's K/V (2 layers) + the head's K/V + its stored features, fp32
    cfg, head = eng.model_config, eng.spec.proposer.head.config
    assert b.bytes_per_slot == 4 * (2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim
                                    + 2 * head.num_kv_heads * head.head_dim + head.hidden_size)
    assert plan.slots == 3000
    assert eng.slots.total == eng.runner.num_slots == 3000 and eng.slots.num_free == 3000
    assert eng.runner.kv.k.shape[1] == eng.spec.proposer.kv.k.shape[1] == 3001
    assert eng.spec.proposer.features.shape[0] == 3001
    assert eng.max_model_len == min(eng.runner.max_positions, 3000)
    assert not eng.runner.step_counts  # the profile's steps are no run's
    assert eng.spec_stats()["proposed"] == 0
    got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    ref = make_llm(tiny_llama_dir, **{**_tree(head_dir), "kv_cache_tokens": 3000})
    assert got == [o.token_ids for o in ref.generate(PROMPTS, GREEDY)]
    assert llm.spec_stats()["proposed"] > 0


def test_a_larger_peak_leaves_a_smaller_cache(make_llm, profiled, tiny_llama_dir, head_dir):
    first, _ = profiled(make_llm, tiny_llama_dir, total=GIB, activations=2**20,
                        **_tree(head_dir))
    total = _total_for(first, 4000, 2**20)
    small, _ = profiled(make_llm, tiny_llama_dir, total=total, activations=2**20,
                        **_tree(head_dir))
    slot = small.engine.runner.memory_plan.budget.bytes_per_slot
    large, _ = profiled(make_llm, tiny_llama_dir, total=total, activations=2**20 + 500 * slot,
                        **_tree(head_dir))
    assert small.engine.slots.total == 4000
    assert large.engine.slots.total == 3500


def test_a_configuration_that_cannot_fit_fails_at_start_up(make_llm, profiled, tiny_llama_dir,
                                                           head_dir):
    with pytest.raises(ConfigError) as e:
        profiled(make_llm, tiny_llama_dir, total=GIB, activations=GIB, **_tree(head_dir))
    msg = str(e.value)
    assert "activations peak 1.0" in msg and "--gpu-memory-utilization" in msg
    assert "--max-num-seqs" in msg


def test_a_hybrid_engine_counts_its_model_drafts_weights(make_llm, profiled, tiny_llama_dir,
                                                          head_dir):
    """eagle3+suffix: the draft's weights are EAGLE-3's, as alone (suffix decoding has none);
    the profile also runs its largest VERIFY step, every request's suffix chain at the
    deepest depth (16: 6 x 17 tokens, past the tree's 6 x 8)."""
    alone, _ = profiled(make_llm, tiny_llama_dir, total=GIB, activations=2**20,
                        **_tree(head_dir))
    hybrid, mem = profiled(make_llm, tiny_llama_dir, total=GIB, activations=2**20,
                           **{**_tree(head_dir), "speculative_algorithm": "eagle3+suffix"})
    assert hybrid.engine.spec.max_verify_tokens() == 6 * 17
    assert max(t for t, _ in mem.verify) == 6 * 17
    draft = alone.engine.runner.memory_plan.budget.draft
    assert draft > 0 and hybrid.engine.runner.memory_plan.budget.draft == draft
    assert hybrid.engine.slots.total == alone.engine.slots.total


def test_plain_engines_profile_too(make_llm, profiled, tiny_llama_dir):
    first, mem = profiled(make_llm, tiny_llama_dir, total=GIB, activations=2**20)
    assert first.engine.spec is None and mem.verify == []  # no VERIFY steps: one peak overall
    total = _total_for(first, 2000, 2**20)
    llm, _ = profiled(make_llm, tiny_llama_dir, total=total, activations=2**20)
    assert llm.engine.slots.total == 2000
    ref = make_llm(tiny_llama_dir, kv_cache_tokens=2000)
    assert ([o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
            == [o.token_ids for o in ref.generate(PROMPTS, GREEDY)])


def test_graph_pools_are_measured_over_every_capture_then_dropped(
        make_llm, profiled, monkeypatch, tiny_llama_dir, head_dir):
    """With graphs (stood in for on the CPU): the capture pass runs the speculation
    warm-up's every shape once (even with the warm-up itself off), leaving the policy's
    costs alone; the memory the graphs keep (here 64 MiB) is the graph pools' share, the
    pass's peak (96 MiB: eager steps and fragmentation beside them) counts where it is
    larger than activations + pools, and the graphs are gone before the cache moves."""
    installed = []

    def hot_path(runner, capture=()):  # decode graphs up to max_num_seqs, as captured
        runner.shape_graphs, runner.decode_sizes = EagerGraphs(), [1, 2, 4, 6]
        runner.capture = capture
        installed.append(runner.shape_graphs)

    graphs = lambda self: self.engine.runner.shape_graphs is not None  # noqa: E731
    monkeypatch.setattr(memory_profile, "captures_graphs", lambda config: True)
    monkeypatch.setattr(ModelRunner, "prepare_hot_path", hot_path)
    monkeypatch.setattr(FakeMemory, "reserved",
                        lambda self: self.allocated() + (64 * 2**20 if graphs(self) else 0))
    monkeypatch.setattr(FakeMemory, "peak_reserved",
                        lambda self: self.reserved() + (32 * 2**20 if graphs(self) else 0))
    opts = {**_tree(head_dir), "max_num_batched_tokens": 32, "extend_graph_max_tokens": 32,
            "spec_warmup": False, "spec_policy": "goodput"}
    llm, mem = profiled(make_llm, tiny_llama_dir, total=GIB, activations=2**20, **opts)
    eng = llm.engine
    b = eng.runner.memory_plan.budget
    assert b.graph_pools == 64 * 2**20 and b.warmup_peak == 96 * 2**20
    assert b.before_kv == b.weights + b.draft + b.buffers + b.outside_torch + 96 * 2**20
    keys = [str(k) for k in installed[0].entries]  # the shapes that ran on the stand-in
    for shape in ("verify-tree", "verify-greedy", "'expand'", "draft_extend"):
        assert any(shape in k for k in keys), shape
    assert [t for t, _ in mem.verify] == [48, 24] * 3  # the largest steps: the eager pass only
    assert len(installed) == 2  # the capture pass's graphs, then the engine's on the real cache
    assert eng.slots.total == eng.runner.memory_plan.slots == eng.slots.num_free
    assert eng.measured_costs is None  # capture only: no step was priced
    assert not eng.runner.step_counts and eng.spec_stats()["proposed"] == 0
    got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    ref = make_llm(tiny_llama_dir, **{**_tree(head_dir), "kv_cache_tokens": eng.slots.total})
    assert got == [o.token_ids for o in ref.generate(PROMPTS, GREEDY)]
