"""Penalties and constraints end to end, greedy: every penalty's output equals a plain-torch
reference of its rule over the HF oracle (tests/penalty_reference.py), without speculation
and with every proposer (n-gram, EAGLE-3 chain and tree, a draft model, the target
drafting for itself), requests with different penalties (and none) sharing batches,
chunked prefill, preemption (a recomputed request's counts are rebuilt from its tokens).

Data flow (tests only): tiny checkpoint -> LLM.generate(penalised params) <-> HF logits ->
penalised() -> argmax, token by token.
"""

from __future__ import annotations

import pytest
from checkpoints import EOS_ID, load_hf_model, random_prompts
from eagle3_checkpoints import make_eagle3_checkpoint
from penalty_reference import penalised_greedy

from gearshift import SamplingParams

N = 24
PROMPTS = random_prompts([4, 11, 27], seed=21) + [[40, 41, 42, 40, 41, 42, 40, 41]]
PENALTIES = {
    "none": {},
    "repetition": dict(repetition_penalty=1.8),
    "repetition<1": dict(repetition_penalty=0.5),  # repeats more: the n-gram proposer matches
    "repeat-more": dict(presence_penalty=-1.0, frequency_penalty=-0.8),
    "presence-frequency": dict(presence_penalty=1.5, frequency_penalty=0.7),
    "bias": dict(logit_bias={100: 6.0, 200: 4.0, 300: -100.0}),
    "min_tokens": dict(logit_bias={EOS_ID: 40.0}, min_tokens=6, ignore_eos=False),
    "min_tokens-stop-id": dict(logit_bias={77: 40.0}, min_tokens=4, stop_token_ids=[77]),
    "all": dict(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2,
                logit_bias={5: 3.0}, min_tokens=3),
}


def _params(name: str) -> SamplingParams:
    return SamplingParams(**{"max_tokens": N, "temperature": 0.0, "ignore_eos": True,
                             **PENALTIES[name]})


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    return make_eagle3_checkpoint(tmp_path_factory.mktemp("eagle3"), aux_layer_ids=[0, 1, 1])


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    """{(penalty, prompt index): tokens} by the plain-torch rule on the HF model."""
    hf = load_hf_model(tiny_llama_dir)
    return {(name, i): penalised_greedy(hf, p, _params(name), (EOS_ID,))
            for name in PENALTIES for i, p in enumerate(PROMPTS)}


def _run(llm) -> dict:
    """Every penalty x every prompt as one generate call: mixed batches."""
    keys = [(name, i) for name in PENALTIES for i in range(len(PROMPTS))]
    outs = llm.generate([PROMPTS[i] for _, i in keys], [_params(name) for name, _ in keys])
    return {k: o for k, o in zip(keys, outs)}


def _check(got: dict, reference: dict) -> None:
    for key, out in got.items():
        assert out.token_ids == reference[key], key
    # the rules matter: most penalised outputs differ from the unpenalised ones
    changed = sum(reference[k] != reference[("none", k[1])] for k in reference if k[0] != "none")
    assert changed >= (len(PENALTIES) - 1) * len(PROMPTS) - 3
    for i in range(len(PROMPTS)):  # min_tokens: EOS / the stop id, exactly once it is allowed
        assert got[("min_tokens", i)].token_ids[-1] == EOS_ID
        assert len(got[("min_tokens", i)].token_ids) == 7
        assert got[("min_tokens", i)].finish_reason == "stop"
        assert got[("min_tokens-stop-id", i)].token_ids == reference[("min_tokens-stop-id", i)]
        assert len(got[("min_tokens-stop-id", i)].token_ids) == 5


@pytest.mark.parametrize("engine", [
    {}, dict(max_num_batched_tokens=16), dict(kv_cache_tokens=160, max_num_seqs=6),
    dict(overlap_schedule=False)])
def test_plain_decoding_follows_each_rule(make_llm, tiny_llama_dir, reference, engine):
    llm = make_llm(tiny_llama_dir, **engine)
    _check(_run(llm), reference)
    if "kv_cache_tokens" in engine:
        assert llm.stats()["preemptions"] > 0


def _spec(name: str, tiny_llama_dir, head_dir) -> dict:
    return {
        "ngram": dict(speculative_algorithm="ngram", num_draft_tokens=3),
        "eagle3-chain": dict(speculative_algorithm="eagle3", draft_model=str(head_dir),
                             num_draft_tokens=3),
        "eagle3-tree": dict(speculative_algorithm="eagle3", draft_model=str(head_dir),
                            num_draft_tokens=3, tree_width=3, tree_budget=8),
        "self-draft-chain": dict(speculative_algorithm="draft", draft_model=str(tiny_llama_dir),
                                 num_draft_tokens=4),
        "self-draft-tree": dict(speculative_algorithm="draft", draft_model=str(tiny_llama_dir),
                                num_draft_tokens=3, tree_width=2, tree_budget=6),
    }[name]


@pytest.mark.parametrize("variant", ["ngram", "eagle3-chain", "eagle3-tree", "self-draft-chain",
                                     "self-draft-tree"])
def test_speculative_decoding_follows_each_rule(make_llm, tiny_llama_dir, head_dir, reference,
                                                variant):
    llm = make_llm(tiny_llama_dir, spec_policy="always",
                   **_spec(variant, tiny_llama_dir, head_dir))
    _check(_run(llm), reference)
    stats = llm.spec_stats()
    assert stats["proposed"] > 0
    if variant == "self-draft-chain":  # the draft applies the same penalties: all accepted
        assert stats["acceptance_rate"] == 1.0
    if variant == "ngram":
        assert stats["accepted"] > 0


@pytest.mark.parametrize("engine", [dict(max_num_batched_tokens=16),
                                    dict(kv_cache_tokens=200, max_num_seqs=6)])
def test_random_policy_with_penalties(make_llm, tiny_llama_dir, reference, engine):
    """K changes every step (plain steps and VERIFY steps of every length in turn), with
    chunked prefill riding along in VERIFY steps, or preemption."""
    llm = make_llm(tiny_llama_dir, spec_policy="random", speculative_algorithm="draft",
                   draft_model=str(tiny_llama_dir), num_draft_tokens=4, **engine)
    _check(_run(llm), reference)
    assert sorted(llm.spec_stats()["steps_by_k"])[:2] == [0, 1]


@pytest.mark.parametrize("variant", ["eagle3-chain", "eagle3-tree", "self-draft-chain"])
def test_graphed_speculative_paths(make_llm, tiny_llama_dir, head_dir, reference, variant):
    """The CUDA-graph paths (padded batches, graphed target pass and greedy verification;
    run eagerly on a CPU stand-in) apply the same rules."""
    from eager_graphs import install

    llm = make_llm(tiny_llama_dir, spec_policy="always",
                   **_spec(variant, tiny_llama_dir, head_dir))
    graphs = install(llm)
    _check(_run(llm), reference)
    assert any(k[0] == "target" for k in graphs.keys)
    assert any(k[0] == "verify-greedy" for k in graphs.keys)
