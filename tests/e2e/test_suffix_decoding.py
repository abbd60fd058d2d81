"""Suffix decoding end to end on the embedded default model (CPU): greedy output equals plain
decoding token for token (chains up to K = 32, trees, a K per request and step, preemption,
chunked prefill, the prefix cache on and off, drafts from the output cache), and coupled
seeded output equals plain seeded output; copying prompts get long drafts accepted.

Data flow (tests only): the default model -> LLM (no speculation) = reference token ids <->
LLM(speculative_algorithm="suffix", ...) token ids, spec_stats() and the proposer's counters.
"""

from __future__ import annotations

import pytest
from copy_prompts import prompts

from gearshift import SamplingParams
from gearshift.models.default import default_target_dir


@pytest.fixture(scope="module")
def model() -> str:
    return str(default_target_dir())


def run(llm, ps, params) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(ps, params, use_tqdm=False)]


GREEDY = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
VARIANTS = {
    "chain-16": dict(num_draft_tokens=16, spec_policy="always"),
    "chain-32-random": dict(num_draft_tokens=32, spec_policy="random"),
    # the default policy: the start-up warm-up times every K with full drafts first
    "goodput-8": dict(num_draft_tokens=8, max_num_seqs=4),
    "tree": dict(num_draft_tokens=8, tree_width=3, tree_budget=12, spec_policy="always"),
    "tree-random": dict(num_draft_tokens=6, tree_width=2, tree_budget=8,
                        spec_policy="random"),
    "preempt": dict(num_draft_tokens=16, spec_policy="always", kv_cache_tokens=256,
                    max_num_batched_tokens=64),
    "no-prefix-cache": dict(num_draft_tokens=8, spec_policy="always",
                            enable_prefix_caching=False, max_num_batched_tokens=32),
    "no-output-cache": dict(num_draft_tokens=8, spec_policy="always", suffix_cache_tokens=0),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_suffix_decoding_equals_plain(make_llm, model, variant):
    plain = make_llm(model)
    ps = prompts(plain.tokenizer)
    ref = run(plain, ps, GREEDY)
    llm = make_llm(model, speculative_algorithm="suffix", **VARIANTS[variant])
    assert run(llm, ps, GREEDY) == ref
    stats = llm.spec_stats()
    assert stats["algorithm"] == "suffix"
    assert stats["accepted"] > 40 and stats["accepted"] <= stats["proposed"]
    if variant == "goodput-8":
        assert max(llm.engine.measured_costs) == 8 and stats["policy"] == "goodput"
        assert llm.engine.spec.proposer.full_drafts is False
    if variant == "preempt":
        assert llm.stats()["preemptions"] > 0, "the pool was meant to be too small"
    if variant.startswith("tree"):
        assert stats["tree_steps"] > 0
    if variant == "chain-16":  # copying: drafts longer than any model proposer's K
        assert max(stats["accept_len_hist"]) > 8
    own = stats["proposers"]["suffix"]  # drafts by source, as /metrics shows them
    assert own["draft_tokens"] == stats["proposed"] and own["from_request"] > 0
    assert own["drafts"] == own["from_request"] + own["from_cache"] + own["empty"]


def test_a_prefix_cache_hit_and_the_output_cache_keep_the_output(make_llm, model):
    """The same prompts twice on one engine: the second wave starts from cached KV and finds
    the first wave's outputs in the output cache (drafts from it), with the same text."""
    plain = make_llm(model)
    ps = prompts(plain.tokenizer)
    ref = run(plain, ps, GREEDY)
    llm = make_llm(model, speculative_algorithm="suffix", num_draft_tokens=16,
                   spec_policy="always")
    assert run(llm, ps, GREEDY) == ref
    first = dict(llm.engine.spec.proposer.stats)
    assert run(llm, ps, GREEDY) == ref
    assert llm.engine.prefix_cache_stats()["hit_tokens"] > 100
    proposer = llm.engine.spec.proposer
    assert len(proposer.cache) >= len(ps) - 1  # outputs seen finished by a later step
    assert proposer.stats["from_cache"] > first["from_cache"]


SAMPLED = [SamplingParams(max_tokens=40, temperature=t, top_p=p, seed=50 + i, ignore_eos=True)
           for i, (t, p) in enumerate([(0.7, 1.0), (1.0, 0.9), (0.3, 1.0), (0.0, 1.0)])]


@pytest.mark.parametrize("variant", ["chain", "tree"])
def test_coupled_suffix_decoding_keeps_the_seeded_text(make_llm, model, variant):
    plain = make_llm(model)
    ps = prompts(plain.tokenizer)
    ref = run(plain, ps, SAMPLED)
    tree = dict(tree_width=2, tree_budget=8) if variant == "tree" else {}
    llm = make_llm(model, speculative_algorithm="suffix", num_draft_tokens=8,
                   spec_policy="always", spec_sampling="coupled", **tree)
    assert run(llm, ps, SAMPLED) == ref
    assert llm.spec_stats()["accepted"] > 10
    # rejection sampling verifies the same drafts (point masses) and keeps only the law
    rej = make_llm(model, speculative_algorithm="suffix", num_draft_tokens=8,
                   spec_policy="always", spec_sampling="rejection", **tree)
    outs = rej.generate(ps, SAMPLED, use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [40] * len(ps)
    assert rej.spec_stats()["accepted"] > 10


def test_bad_suffix_settings_are_refused():
    from gearshift.config import ConfigError, EngineConfig

    with pytest.raises(ConfigError, match="num_draft_tokens must be in \\[1, 32\\]"):
        EngineConfig(model="-", speculative_algorithm="suffix", num_draft_tokens=33)
    with pytest.raises(ConfigError, match="num_draft_tokens must be in \\[1, 16\\]"):
        EngineConfig(model="-", speculative_algorithm="eagle3", num_draft_tokens=17)
    with pytest.raises(ConfigError, match="suffix_cache_tokens"):
        EngineConfig(model="-", speculative_algorithm="suffix", suffix_cache_tokens=-1)
