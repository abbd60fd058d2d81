"""Greedy speculative decoding equals plain greedy decoding token for token, for every
proposer x chain / tree x mixed prompt lengths x multi-chunk prefill x preemption, and
with the `random` policy flipping K every step (opted-out requests never speculate).
The idle KV invariant is checked for every engine (make_llm fixture)."""

from __future__ import annotations

import pytest
from checkpoints import make_tiny_checkpoint, random_prompts
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
PROMPTS = random_prompts([3, 17, 40, 9, 25], seed=7)


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory):
    """A different tiny model with the target's vocabulary (low but non-zero acceptance)."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("draft"), "llama", num_hidden_layers=1,
                                seed=3)


@pytest.fixture(scope="session")
def head_dir(tmp_path_factory):
    """A tiny random EAGLE-3 head for the 2-layer tiny Llama (aux ids inside its layers)."""
    return make_eagle3_checkpoint(tmp_path_factory.mktemp("eagle3"), aux_layer_ids=[0, 1, 1])


def _spec_variants(draft_dir, head_dir, tiny_llama_dir):
    return {
        "ngram": dict(speculative_algorithm="ngram", num_draft_tokens=3),
        "suffix-chain": dict(speculative_algorithm="suffix", num_draft_tokens=6),
        "suffix-tree": dict(speculative_algorithm="suffix", num_draft_tokens=4, draft_topk=2,
                            num_verify_tokens=6),
        "draft-chain": dict(speculative_algorithm="draft", draft_model=str(draft_dir),
                            num_draft_tokens=3),
        "draft-tree": dict(speculative_algorithm="draft", draft_model=str(draft_dir),
                           num_draft_tokens=3, tree_width=2, tree_budget=6),
        "self-draft-chain": dict(speculative_algorithm="draft", draft_model=str(tiny_llama_dir),
                                 num_draft_tokens=4),
        "eagle3-chain": dict(speculative_algorithm="eagle3", draft_model=str(head_dir),
                             num_draft_tokens=3),
        "eagle3-tree": dict(speculative_algorithm="eagle3", draft_model=str(head_dir),
                            num_draft_tokens=3, tree_width=3, tree_budget=8),
    }


VARIANTS = ["ngram", "suffix-chain", "suffix-tree", "draft-chain", "draft-tree",
            "self-draft-chain", "eagle3-chain", "eagle3-tree"]
ENGINES = {
    "plain": {},
    "chunked": dict(max_num_batched_tokens=16),
    "preempt": dict(kv_cache_tokens=160, max_num_batched_tokens=64),
}


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("variant", VARIANTS)
def test_spec_greedy_equals_plain(make_llm, tiny_llama_dir, draft_dir, head_dir, variant, engine):
    opts = ENGINES[engine]
    ref = [o.token_ids for o in make_llm(tiny_llama_dir, **opts).generate(PROMPTS, GREEDY)]
    spec_opts = _spec_variants(draft_dir, head_dir, tiny_llama_dir)[variant]
    # "always": goodput on a CPU (the default policy) learns from wall times and may stop
    # speculating within a few steps, earlier on a loaded machine (the ngram variant once
    # proposed nothing in CI); this test is about output equality when speculating
    llm = make_llm(tiny_llama_dir, **opts, **spec_opts, spec_policy="always")
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == ref
    stats = llm.spec_stats()
    assert stats["proposed"] > 0 and sum(stats["steps_by_k"].values()) > 0
    assert all(o.spec is not None and o.spec.accepted <= o.spec.proposed for o in outs)
    # each output's counters include its last VERIFY step (counted before that step commits)
    assert sum(o.spec.proposed for o in outs) == stats["proposed"]
    assert sum(o.spec.accepted for o in outs) == stats["accepted"]
    if variant == "self-draft-chain":  # the target drafting for itself is always right
        assert stats["acceptance_rate"] == 1.0
    if engine == "preempt":
        assert llm.stats()["preemptions"] > 0


@pytest.mark.parametrize("variant", ["draft-chain", "draft-tree", "eagle3-chain", "eagle3-tree",
                                     "ngram"])
def test_random_policy_flips_k_and_stays_exact(make_llm, tiny_llama_dir, draft_dir, head_dir,
                                               variant):
    prompts = random_prompts([5, 12, 30, 2, 19, 8, 44, 3], seed=11)
    params = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True,
                             speculative=i % 3 != 0) for i in range(len(prompts))]
    ref = make_llm(tiny_llama_dir, max_num_batched_tokens=24).generate(prompts, params)
    spec_opts = _spec_variants(draft_dir, head_dir, tiny_llama_dir)[variant]
    llm = make_llm(tiny_llama_dir, max_num_batched_tokens=24,
                   **{**spec_opts, "spec_policy": "random", "num_draft_tokens": 4})
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    for o, p in zip(outs, params):
        if not p.speculative:
            assert o.spec.proposed == 0 and o.spec.verify_steps == 0
            assert set(o.spec.k_hist) == {0}
        # one K per decode step (a prompt's last token alone counts as one), each >= 1 token
        assert 0 < sum(o.spec.k_hist.values()) <= len(o.token_ids)
        assert o.spec.verify_steps == sum(n for k, n in o.spec.k_hist.items() if k)
    stats = llm.engine.spec_stats()
    ks = stats["steps_by_k"]
    assert len([k for k in ks if k > 0]) >= 2 and ks.get(0, 0) > 0  # K really varied
    assert stats["mixed_k_steps"] > 0  # steps whose requests drafted different K
    assert any(len([k for k in o.spec.k_hist if k]) >= 2 for o in outs)
    if variant.endswith("-tree"):  # a tree engine's steps verify chains or trees, step by step
        assert stats["tree_steps"] > 0 and stats["chain_steps"] > 0
        # tree steps are tree evidence and, from their top-1 chains, paired chain evidence
        tree_num, tree_den, chain_num, chain_den = llm.engine.spec.acceptance.tree_population()
        assert tree_den > 0 and 0 < chain_den and chain_num <= tree_num + 1e-9
        assert 0 <= stats["tree_top1_accepted"] <= stats["tree_accepted"] <= stats["accepted"]
    else:
        assert stats["tree_steps"] == 0


@pytest.mark.parametrize("tree", [False, True])
def test_drafts_never_run_past_the_context_limit(make_llm, tiny_llama_dir, tree):
    """A request at the context limit shares a VERIFY step with one that drafts deeper:
    its junk draft rows stay inside RoPE's range and it never accepts beyond its own K."""
    opts = dict(max_model_len=64)
    prompts = [[3] * 54, [4] * 5]
    params = [SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)]
    ref = [o.token_ids for o in make_llm(tiny_llama_dir, **opts).generate(prompts, params)]
    spec = dict(speculative_algorithm="draft", draft_model=str(tiny_llama_dir),
                num_draft_tokens=3, spec_policy="always")
    if tree:
        spec.update(tree_width=2, tree_budget=5)
    outs = make_llm(tiny_llama_dir, **opts, **spec).generate(prompts, params)
    assert [o.token_ids for o in outs] == ref


def test_random_policy_thousands_of_steps(make_llm, tiny_llama_dir, draft_dir):
    """The random-K soak on the CPU: >= 2000 engine steps with K changing every step (0 included),
    a small KV pool (preemption) and opted-out requests: exact, and nothing leaks."""
    prompts = random_prompts([4 + (7 * i) % 37 for i in range(36)], seed=5)
    params = [SamplingParams(max_tokens=80 + (i % 5) * 20, temperature=0.0, ignore_eos=True,
                             speculative=i % 4 != 0) for i in range(len(prompts))]
    opts = dict(max_num_seqs=2, max_num_batched_tokens=32, kv_cache_tokens=300)
    ref = make_llm(tiny_llama_dir, **opts).generate(prompts, params)
    llm = make_llm(tiny_llama_dir, **opts, speculative_algorithm="draft",
                   draft_model=str(draft_dir), num_draft_tokens=4, spec_policy="random")
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert llm.stats()["steps"] >= 2000
    assert all(o.spec.proposed == 0 for o, p in zip(outs, params) if not p.speculative)
    assert sorted(llm.spec_stats()["steps_by_k"]) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("algo", ["eagle3", "draft"])
def test_prefill_chunks_ride_along_with_verification(make_llm, tiny_llama_dir, draft_dir,
                                                     head_dir, algo):
    """Under constant arrivals most steps carry a prefill chunk: decoding requests still
    speculate in those steps (chains), and the chunk extends in the same causal pass."""
    prompts = random_prompts([3, 5, 60, 44, 70, 9], seed=13)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    opts = dict(max_num_batched_tokens=16, max_num_seqs=6)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir, **opts).generate(prompts, params)]
    draft = head_dir if algo == "eagle3" else draft_dir
    llm = make_llm(tiny_llama_dir, **opts, speculative_algorithm=algo, draft_model=str(draft),
                   num_draft_tokens=3, spec_policy="always")
    mixed = []
    orig = llm.engine.scheduler.schedule

    def schedule():
        plan = orig()
        if plan.draft_lens and any(n > 1 for n in plan.extend_lens):
            mixed.append(plan)
        return plan

    llm.engine.scheduler.schedule = schedule
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == ref
    assert mixed, "no VERIFY step carried a prefill chunk"


def test_random_policy_on_a_tree_engine_samples_to_completion(make_llm, tiny_llama_dir, head_dir):
    """Sampled requests (temperature 1, top-p) on a tree engine whose steps switch between
    chains (rejection sampling), trees (multi-draft scheme) and plain decode: every request
    runs to its length, both shapes were verified, and every slot comes back."""
    prompts = random_prompts([5, 12, 30, 2, 19, 8], seed=3)
    params = [SamplingParams(max_tokens=30, temperature=1.0, top_p=0.9, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head_dir),
                   num_draft_tokens=3, tree_width=3, tree_budget=8, spec_policy="random",
                   spec_sampling="rejection")
    outs = llm.generate(prompts, params)
    assert all(len(o.token_ids) == 30 and o.finish_reason == "length" for o in outs)
    stats = llm.spec_stats()
    assert stats["tree_steps"] > 0 and stats["chain_steps"] > 0
    mem = llm.memory_stats()
    assert mem["kv_slots_free"] + mem["kv_slots_cached"] == mem["kv_slots_total"]
