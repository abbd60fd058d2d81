"""Sampling with penalties under speculation keeps the penalised target distribution: the
setting of test_spec_lossless.py (a 16-token target, its perturbed copy as the draft,
temperature 1, every request's first decode step a K = 3 VERIFY step), with repetition,
presence and frequency penalties and a logit bias. The exact law of (t1, ..., t5) applies
the same rules to the HF logits of every continuation (counts of the prompt and of
t1..tj at position j + 1); chi-square tests at a false-alarm rate of 1e-4 each.

Data flow (tests only): LLM(speculative_algorithm="draft") -> sampled tokens -> counts <->
HF logits -> penalties -> exact law.
"""

from __future__ import annotations

import pytest
import torch
from checkpoints import load_hf_model, make_perturbed_draft, make_tiny_checkpoint
from spec_stats import chi2_pvalue, joint_law

from gearshift import SamplingParams

ALPHA = 1e-4
V = 16
PROMPT = [0, 5, 9, 3, 12]
N, WAVE = 4000, 1000
PENALTIES = dict(repetition_penalty=1.6, presence_penalty=0.6, frequency_penalty=0.4,
                 logit_bias={7: 1.5, 11: -2.0})
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1, head_dim=16, with_tokenizer=False)
CONFIGS = {"chain": (dict(tree_width=1), 1.0), "chain-top_p0.9": (dict(tree_width=1), 0.9),
           "tree": (dict(tree_width=2, tree_budget=5), 1.0)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target = make_tiny_checkpoint(tmp_path_factory.mktemp("pen_target"), "llama", seed=2, **SMALL)
    return target, make_perturbed_draft(target, tmp_path_factory.mktemp("pen_draft"))


@pytest.fixture(scope="module")
def penalised_logits(pair) -> torch.Tensor:
    """[V, V, V, V, 5, V]: index (t1..t4, j) = the penalised logits for t_{j+1} after the
    prompt and t1..tj (float64)."""
    model = load_hf_model(pair[0])
    rest = torch.cartesian_prod(*[torch.arange(V)] * 4)  # [V^4, 4]
    ids = torch.cat([torch.tensor(PROMPT).expand(rest.shape[0], -1), rest], 1)
    with torch.no_grad():
        logits = torch.cat([model(c).logits[:, len(PROMPT) - 1:] for c in ids.split(8192)])
    x = logits.double()  # [V^4, 5, V]
    onehot = torch.nn.functional.one_hot(rest, V).double()  # [V^4, 4, V]
    gen = torch.cat([torch.zeros_like(onehot[:, :1]), onehot.cumsum(1)], 1)  # before j: [V^4, 5, V]
    for tok, b in PENALTIES["logit_bias"].items():
        x[..., tok] += b
    in_prompt = torch.zeros(V, dtype=torch.bool)
    in_prompt[PROMPT] = True
    rep = PENALTIES["repetition_penalty"]
    x = torch.where(in_prompt | (gen > 0), torch.where(x > 0, x / rep, x * rep), x)
    x = x - PENALTIES["frequency_penalty"] * gen - PENALTIES["presence_penalty"] * (gen > 0)
    return x.view(V, V, V, V, 5, V)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_penalised_sampling_keeps_the_penalised_target_law(make_llm, pair, penalised_logits,
                                                           config):
    opts, top_p = CONFIGS[config]
    law = joint_law(penalised_logits, top_p)  # [V]*5
    target, draft = pair
    llm = make_llm(target, speculative_algorithm="draft", draft_model=str(draft),
                   num_draft_tokens=3, spec_policy="always", max_num_seqs=WAVE,
                   kv_cache_tokens=WAVE * 24, max_num_batched_tokens=WAVE * len(PROMPT), **opts)
    outs = []
    salt = list(CONFIGS).index(config) + 17
    for start in range(0, N, WAVE):
        params = [SamplingParams(max_tokens=5, temperature=1.0, top_p=top_p, ignore_eos=True,
                                 seed=((start + i) * 0x9E3779B1 + salt) % 2**32, **PENALTIES)
                  for i in range(WAVE)]
        outs += llm.generate([PROMPT] * WAVE, params)
    toks = torch.tensor([o.token_ids for o in outs])  # [N, 5]
    stats = llm.spec_stats()
    assert set(stats["steps_by_k"]) == {3} and stats["steps_by_k"][3] >= N
    assert all(stats["accept_len_hist"].get(a, 0) > 20 for a in range(4))

    def counts(*positions: int) -> torch.Tensor:
        flat = torch.zeros(N, dtype=torch.int64)
        for j in positions:
            flat = flat * V + toks[:, j]
        return torch.bincount(flat, minlength=V ** len(positions))

    assert chi2_pvalue(counts(0), law.sum((1, 2, 3, 4))) > ALPHA
    assert chi2_pvalue(counts(0, 1), law.sum((2, 3, 4))) > ALPHA
    for j in range(1, 5):
        others = tuple(i for i in range(5) if i != j)
        assert chi2_pvalue(counts(j), law.sum(others)) > ALPHA, f"position {j + 1}"
    assert chi2_pvalue(counts(1, 2), law.sum((0, 3, 4))) > ALPHA
