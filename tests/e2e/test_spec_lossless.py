"""Sampling with speculation is lossless, end to end: a tiny target with a 16-token
vocabulary and a draft model (the target with perturbed weights, acceptance ~0.7), chains
(tree_width=1, K=3) and trees (tree_width=2, K=3, tree_budget=5), temperature 1 and
top-p 0.9, verified by rejection sampling or by coupling (spec_sampling="coupled": the
plain sampler's token at every node). Every request has the same prompt, its own seed and
max_tokens=5: token 1 comes from the prefill's plain sampler, the first decode step is a
K=3 VERIFY for every request (asserted), later steps verify what max_tokens leaves (K=2,
1, 0); with spec_policy="random" every step gives each request its own K in 0..3.

The exact law of (t1, ..., t5) is computed with HF transformers on the same checkpoint by
enumerating every continuation of the prompt (softmax of the logits, top-p applied as in
gearshift.runner.sampler.apply_top_k_top_p: a token is kept when the mass of strictly more
likely tokens is < top_p; then renormalised). Chi-square goodness-of-fit tests (cells with
expected count < 5 pooled, exact chi-square tail) on: t1; t2 given the most common t1; the
joint (t1, t2); and the marginals of t2..t5. Each test has a false-alarm rate of 1e-4, so
the file's 8 x 7 tests have a family-wise false-alarm rate below 6e-3. Seeds are fixed, so
the outcome is deterministic: the rate is the chance that a correct engine fails for this
choice of seeds.

Data flow (tests only): tiny checkpoints -> LLM(speculative_algorithm="draft") -> sampled
tokens -> counts  <->  HF oracle -> exact distributions.
"""

from __future__ import annotations

import pytest
import torch
from checkpoints import load_hf_model, make_perturbed_draft, make_tiny_checkpoint
from spec_stats import chi2_pvalue, joint_law

from gearshift import SamplingParams

ALPHA = 1e-4  # false-alarm rate of each chi-square test
V = 16
PROMPT = [0, 5, 9, 3, 12]
MAX_TOKENS = 5
N = 4000  # requests per configuration
WAVE = 1000  # requests admitted together: their first decode step is one VERIFY step
SEED_MUL = 0x9E3779B1
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1, head_dim=16, with_tokenizer=False)
CONFIGS = {
    "chain-t1": (dict(tree_width=1, spec_sampling="rejection"), 1.0),
    "chain-top_p0.9": (dict(tree_width=1, spec_sampling="rejection"), 0.9),
    "tree-t1": (dict(tree_width=2, tree_budget=5, spec_sampling="rejection"), 1.0),
    "tree-top_p0.9": (dict(tree_width=2, tree_budget=5, spec_sampling="rejection"),
                      0.9),
    # coupled verification (speculative/coupled.py): the plain sampler's tokens, hence its law
    "coupled-chain-top_p0.9": (dict(tree_width=1, spec_sampling="coupled"), 0.9),
    "coupled-tree-t1": (dict(tree_width=2, tree_budget=5, spec_sampling="coupled"), 1.0),
    # a K drawn per request and step (0..3): VERIFY steps mix chains of different lengths
    "mixed-k-chain-top_p0.9": (dict(tree_width=1, spec_sampling="rejection",
                                    spec_policy="random"), 0.9),
    "mixed-k-coupled-chain-t1": (dict(tree_width=1, spec_sampling="coupled",
                                      spec_policy="random"), 1.0),
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target = make_tiny_checkpoint(tmp_path_factory.mktemp("lossless_target"), "llama", seed=1,
                                  **SMALL)
    return target, make_perturbed_draft(target, tmp_path_factory.mktemp("lossless_draft"))


@pytest.fixture(scope="module")
def target_logits(pair) -> torch.Tensor:
    """HF logits for every continuation: [V, V, V, V, 5, V], index (t1..t4, j) = logits for
    t_{j+1} after the prompt and t1..tj (entries for j < 4 repeat along later axes)."""
    model = load_hf_model(pair[0])
    rest = torch.cartesian_prod(*[torch.arange(V)] * 4)  # [V^4, 4]
    ids = torch.cat([torch.tensor(PROMPT).expand(rest.shape[0], -1), rest], 1)
    with torch.no_grad():
        logits = torch.cat([model(chunk).logits[:, len(PROMPT) - 1:] for chunk in ids.split(8192)])
    return logits.double().view(V, V, V, V, 5, V)


def sample_engine(make_llm, pair, opts: dict, top_p: float, salt: int):
    target, draft = pair
    llm = make_llm(target, speculative_algorithm="draft", draft_model=str(draft),
                   max_num_seqs=WAVE, kv_cache_tokens=WAVE * 24,
                   max_num_batched_tokens=WAVE * len(PROMPT),
                   **{"num_draft_tokens": 3, "spec_policy": "always", **opts})
    outs = []
    for start in range(0, N, WAVE):
        params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, top_p=top_p,
                                 seed=((start + i) * SEED_MUL + salt) % 2**32, ignore_eos=True)
                  for i in range(WAVE)]
        outs += llm.generate([PROMPT] * WAVE, params)
    return torch.tensor([o.token_ids for o in outs]), llm.engine.spec_stats()  # [N, 5]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_spec_sampling_matches_target_distribution(make_llm, pair, target_logits, config):
    opts, top_p = CONFIGS[config]
    law = joint_law(target_logits, top_p)  # [V]*5
    toks, stats = sample_engine(make_llm, pair, opts, top_p, salt=list(CONFIGS).index(config))
    assert toks.shape == (N, MAX_TOKENS)
    hist = stats["accept_len_hist"]
    if opts.get("spec_policy") == "random":  # each step mixes K = 0..3 over the requests
        assert stats["mixed_k_steps"] > 0 and sorted(stats["steps_by_k"]) == [0, 1, 2, 3]
    else:
        # every decode step verifies K = 3 drafts (K is not cut to the remaining tokens:
        # commit stops at max_tokens), so each sequence's first decode step is a K = 3 one
        assert set(stats["steps_by_k"]) == {3} and stats["steps_by_k"][3] >= N
    assert all(hist.get(a, 0) > 20 for a in range(4)), f"acceptance lengths: {hist}"

    def counts(*positions: int) -> torch.Tensor:
        flat = torch.zeros(N, dtype=torch.int64)
        for j in positions:
            flat = flat * V + toks[:, j]
        return torch.bincount(flat, minlength=V ** len(positions))

    # (a) the first token (prefill, plain sampler) and (b) t2 | the most common t1
    assert chi2_pvalue(counts(0), law.sum((1, 2, 3, 4))) > ALPHA
    t1 = int(toks[:, 0].mode().values)
    rows = toks[:, 0] == t1
    p2 = law[t1].sum((1, 2, 3))
    assert chi2_pvalue(torch.bincount(toks[rows, 1], minlength=V), p2 / p2.sum()) > ALPHA
    assert chi2_pvalue(counts(0, 1), law.sum((2, 3, 4))) > ALPHA
    # marginals of every position the VERIFY steps produced
    for j in range(1, MAX_TOKENS):
        others = tuple(i for i in range(MAX_TOKENS) if i != j)
        assert chi2_pvalue(counts(j), law.sum(others)) > ALPHA, f"position {j + 1}"
