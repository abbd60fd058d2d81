"""Coupled speculation keeps a seeded request's text: with spec_sampling="coupled", seeded
sampled outputs equal plain decoding's token for token, for draft-model chains and trees
(a perturbed draft, and the target as its own draft so that whole chains are accepted),
EAGLE-3 chains and trees, n-gram lookup and the random policy; with top-k, top-p,
penalties, logit_bias and min_tokens; beside rejection-sampled requests in one batch; in
any batch composition, under preemption, with and without overlap scheduling. Rejection
sampling gives other text from the same seeds (so every comparison here can fail), and an
unseeded request reports the seed it drew, which replays its text.

Data flow (tests only): tiny checkpoints -> LLM (no speculation) = reference token ids
<-> LLM(speculative_algorithm=..., spec_sampling=...) token ids.
"""

from __future__ import annotations

import pytest
from checkpoints import make_perturbed_draft, random_prompts
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams

PROMPTS = random_prompts([5, 17, 9, 30, 12, 6, 21], seed=3)
# (temperature, top_k, top_p, extra): every sampling feature a plain step applies
SETTINGS = [
    (0.8, -1, 1.0, {}),
    (1.0, 20, 1.0, {}),
    (0.7, -1, 0.9, {}),
    (0.0, -1, 1.0, {}),
    (1.2, -1, 1.0, dict(repetition_penalty=1.3, frequency_penalty=0.5)),
    (0.9, 10, 0.8, dict(presence_penalty=0.4, logit_bias={7: 3.0, 8: 2.0})),
    (1.0, -1, 1.0, dict(min_tokens=12, stop_token_ids=[3, 4, 5, 6, 7, 8, 9, 10])),
]


@pytest.fixture(scope="module")
def drafts(tiny_llama_dir, tmp_path_factory):
    return {"perturbed": make_perturbed_draft(tiny_llama_dir, tmp_path_factory.mktemp("pd")),
            "eagle3": make_eagle3_checkpoint(tmp_path_factory.mktemp("h"),
                                             aux_layer_ids=[0, 1, 1])}


def spec_options(name: str, drafts: dict, target) -> dict:
    draft = dict(speculative_algorithm="draft", draft_model=str(drafts["perturbed"]))
    own = dict(speculative_algorithm="draft", draft_model=str(target))
    eagle = dict(speculative_algorithm="eagle3", draft_model=str(drafts["eagle3"]))
    tree = dict(tree_width=2, tree_budget=6)
    return {
        "draft-chain": draft, "draft-tree": {**draft, **tree},
        "own-chain": own, "own-tree": {**own, **tree},
        "eagle3-chain": eagle, "eagle3-tree": {**eagle, **tree},
        "ngram": dict(speculative_algorithm="ngram"),
        "random-policy": {**draft, "spec_policy": "random"},
    }[name]


def params(mode: str | None = None, seed: int = 100, max_tokens: int = 20,
           bias: dict | None = None) -> list[SamplingParams]:
    out = []
    for i, (temp, top_k, top_p, extra) in enumerate(SETTINGS):
        if bias:
            extra = {**extra, "logit_bias": bias}
        out.append(SamplingParams(max_tokens=max_tokens, temperature=temp, top_k=top_k,
                                  top_p=top_p, seed=seed + i, spec_sampling=mode,
                                  ignore_eos="min_tokens" not in extra, **extra))
    return out


def generate(llm, prompts, ps) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, ps, use_tqdm=False)]


def spec_llm(make_llm, target, name: str, drafts: dict, **kw):
    return make_llm(target, **{"num_draft_tokens": 3, "spec_policy": "always",
                               **spec_options(name, drafts, target), **kw})


@pytest.mark.parametrize("name", ["draft-chain", "draft-tree", "own-chain", "own-tree",
                                  "eagle3-chain", "eagle3-tree", "random-policy"])
def test_coupled_text_equals_plain_seeded_text(make_llm, tiny_llama_dir, drafts, name):
    ref = generate(make_llm(tiny_llama_dir), PROMPTS, params())
    llm = spec_llm(make_llm, tiny_llama_dir, name, drafts, spec_sampling="coupled")
    assert generate(llm, PROMPTS, params()) == ref
    stats = llm.engine.spec_stats()
    assert stats["proposed"] > 0 and stats["sampling"] == "coupled"
    hist = stats["accept_len_hist"]
    if name == "own-chain":  # the target drafting with its own numbers: all accepted
        assert set(hist) == {3} and stats["accepted"] == stats["proposed"]
    if name == "own-tree":  # ... unless the tree's budget cut the winning path short
        assert min(hist) >= 1 and stats["accepted"] > 2 * sum(hist.values())
    # rejection sampling keeps the distribution but not the text of the same seeds
    llm = spec_llm(make_llm, tiny_llama_dir, name, drafts, spec_sampling="rejection")
    got = generate(llm, PROMPTS, params())
    assert [g == r for g, r in zip(got, ref)].count(False) >= 3


def test_ngram_drafts_are_accepted_exactly_when_they_are_the_plain_token(make_llm,
                                                                         tiny_llama_dir):
    """Prompts repeating token 40, which logit_bias makes likely: n-gram lookup proposes
    runs of it, accepted while the target's sample is 40 too."""
    prompts = [[11] + [40] * 8, [12, 40] * 5, [40] * 4 + [13, 14], [40, 15] * 4] * 2
    ps = params(bias={40: 12.0})[:4] + params(seed=7, bias={40: 12.0})[2:6]
    ref = generate(make_llm(tiny_llama_dir), prompts, ps)
    llm = make_llm(tiny_llama_dir, speculative_algorithm="ngram", num_draft_tokens=3,
                   spec_policy="always", spec_sampling="coupled")
    assert generate(llm, prompts, ps) == ref
    stats = llm.engine.spec_stats()
    assert stats["accepted"] > 10 and stats["accepted"] < stats["proposed"]


def test_coupled_requests_beside_rejection_requests(make_llm, tiny_llama_dir, drafts):
    """The engine's default is rejection; every other request asks to couple."""
    ref = generate(make_llm(tiny_llama_dir), PROMPTS, params())
    mixed = [p if i % 2 else SamplingParams(**{**_fields(p), "spec_sampling": "coupled"})
             for i, p in enumerate(params())]
    for name in ("draft-chain", "draft-tree", "own-chain"):
        llm = spec_llm(make_llm, tiny_llama_dir, name, drafts, spec_sampling="rejection")
        got = generate(llm, PROMPTS, mixed)
        assert got[::2] == ref[::2], name
        assert got[1::2] != ref[1::2], name


@pytest.mark.parametrize("overlap", [True, False])
def test_any_batch_and_preemption_give_the_same_text(make_llm, tiny_llama_dir, drafts, overlap):
    """Each request alone, all together in reverse order, and all together in a pool so small
    that requests are preempted and recomputed, under the random policy (plain steps, which
    overlap, between VERIFY steps of every K)."""
    ps = params(max_tokens=40)
    ref = generate(make_llm(tiny_llama_dir), PROMPTS, ps)
    kw = dict(spec_sampling="coupled", overlap_schedule=overlap)
    alone = spec_llm(make_llm, tiny_llama_dir, "random-policy", drafts, max_num_seqs=1, **kw)
    assert [generate(alone, [p], [q])[0] for p, q in zip(PROMPTS, ps)] == ref
    llm = spec_llm(make_llm, tiny_llama_dir, "random-policy", drafts, **kw)
    assert generate(llm, PROMPTS[::-1], ps[::-1]) == ref[::-1]
    small = spec_llm(make_llm, tiny_llama_dir, "random-policy", drafts, kv_cache_tokens=160,
                     max_num_batched_tokens=64, **kw)
    assert generate(small, PROMPTS, ps) == ref
    assert small.stats()["preemptions"] > 0, "the pool was meant to be too small"


def test_unseeded_request_reports_a_seed_that_replays(make_llm, tiny_llama_dir, drafts):
    llm = spec_llm(make_llm, tiny_llama_dir, "draft-tree", drafts, spec_sampling="coupled")
    first = llm.generate(PROMPTS[:3], SamplingParams(max_tokens=16, ignore_eos=True),
                         use_tqdm=False)
    seeds = [o.seed for o in first]
    assert all(isinstance(s, int) for s in seeds) and len(set(seeds)) == 3
    replay = make_llm(tiny_llama_dir).generate(
        PROMPTS[:3], [SamplingParams(max_tokens=16, ignore_eos=True, seed=s) for s in seeds],
        use_tqdm=False)
    assert [o.token_ids for o in replay] == [o.token_ids for o in first]
    assert [o.seed for o in replay] == seeds


def _fields(p: SamplingParams) -> dict:
    return {f: getattr(p, f) for f in p.__slots__}
