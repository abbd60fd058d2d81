"""Sampling under a grammar keeps the masked target distribution with speculation on: the
setting of test_penalties_lossless.py (a 16-token target, its perturbed copy as the draft,
temperature 1, every request's first decode step a K = 3 VERIFY step), with a grammar
whose allowed tokens depend on the previous token, so each verified node needs the mask of
its own path. The exact law of (t1, ..., t5) masks the HF logits of every continuation with
the automaton below, computed here without xgrammar; chi-square tests at a false-alarm
rate of 1e-4 each. With coupled verification, seeded constrained text equals plain
decoding's.

    tokens 3..15 are the characters a..m (0, 1, 2: BOS, EOS, PAD)
    state 0 allows a-f (a-c -> 1, d-f -> 2);  1 allows g-j, a (g, h -> 0, else -> 2);
    state 2 allows k-m, b, c (k, l -> 1, else -> 0); the grammar never ends (EOS never
    allowed), so every request emits five tokens

Data flow (tests only): LLM(speculative_algorithm="draft", structured_output=grammar) ->
sampled tokens -> counts <-> HF logits -> automaton masks -> exact law.
"""

from __future__ import annotations

import pytest
import torch
from checkpoints import load_hf_model, make_perturbed_draft, make_tiny_checkpoint
from spec_stats import chi2_pvalue, joint_law

from gearshift import SamplingParams, StructuredOutput

ALPHA = 1e-4
V = 16
PROMPT = [0, 5, 9, 3, 12]
N, WAVE = 4000, 1000
CHARS = "abcdefghijklm"  # token 3 + i is CHARS[i]
# state -> {character: next state}
AUTOMATON = {0: {"a": 1, "b": 1, "c": 1, "d": 2, "e": 2, "f": 2},
             1: {"g": 0, "h": 0, "i": 2, "j": 2, "a": 2},
             2: {"k": 1, "l": 1, "m": 0, "b": 0, "c": 0}}
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1, head_dim=16, with_tokenizer=False)
CONFIGS = {"chain": dict(tree_width=1), "tree": dict(tree_width=2, tree_budget=5)}


def grammar() -> str:
    """The automaton in EBNF; "z" is no token's text, so the grammar never completes."""
    rules = [f's{s} ::= ' + " | ".join(f'"{c}" s{t}' for c, t in moves.items()) + ' | "z"'
             for s, moves in AUTOMATON.items()]
    return "\n".join(["root ::= s0", *rules])


def save_char_tokenizer(path) -> None:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|begin|>": 0, "<|end|>": 1, "<|pad|>": 2} | {c: 3 + i for i, c in enumerate(CHARS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(["<|begin|>", "<|end|>", "<|pad|>"])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin|>", eos_token="<|end|>",
                            pad_token="<|pad|>").save_pretrained(path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target = make_tiny_checkpoint(tmp_path_factory.mktemp("gr_target"), "llama", seed=2, **SMALL)
    save_char_tokenizer(target)
    return target, make_perturbed_draft(target, tmp_path_factory.mktemp("gr_draft"))


@pytest.fixture(scope="module")
def masked_logits(pair) -> torch.Tensor:
    """[V, V, V, V, 5, V]: index (t1..t4, j) = the logits for t_{j+1} after the prompt and
    t1..tj, -inf where the automaton refuses (float64; unreachable contexts unmasked)."""
    model = load_hf_model(pair[0])
    rest = torch.cartesian_prod(*[torch.arange(V)] * 4)  # [V^4, 4]
    ids = torch.cat([torch.tensor(PROMPT).expand(rest.shape[0], -1), rest], 1)
    with torch.no_grad():
        logits = torch.cat([model(c).logits[:, len(PROMPT) - 1:] for c in ids.split(8192)])
    x = logits.double()  # [V^4, 5, V]
    allowed = torch.zeros(3, V, dtype=torch.bool)  # state -> token
    step = torch.full((3, V), -1)  # state, token -> next state (-1: refused)
    for s, moves in AUTOMATON.items():
        for c, t in moves.items():
            allowed[s, 3 + CHARS.index(c)] = True
            step[s, 3 + CHARS.index(c)] = t
    state = torch.zeros(rest.shape[0], dtype=torch.long)
    for j in range(5):
        live = state >= 0
        x[live, j] = x[live, j].masked_fill(~allowed[state[live]], float("-inf"))
        if j < 4:
            state = torch.where(live, step[state.clamp_min(0), rest[:, j]], -1)
    return x.view(V, V, V, V, 5, V)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_constrained_sampling_keeps_the_masked_target_law(make_llm, pair, masked_logits, config):
    law = joint_law(masked_logits, 1.0)  # [V]*5
    target, draft = pair
    llm = make_llm(target, speculative_algorithm="draft", draft_model=str(draft),
                   num_draft_tokens=3, spec_policy="always", max_num_seqs=WAVE,
                   kv_cache_tokens=WAVE * 24, max_num_batched_tokens=WAVE * len(PROMPT),
                   **CONFIGS[config])
    so = StructuredOutput(grammar=grammar())
    outs = []
    salt = list(CONFIGS).index(config) + 31
    for start in range(0, N, WAVE):
        params = [SamplingParams(max_tokens=5, temperature=1.0, structured_output=so,
                                 seed=((start + i) * 0x9E3779B1 + salt) % 2**32)
                  for i in range(WAVE)]
        outs += llm.generate([PROMPT] * WAVE, params, use_tqdm=False)
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
    assert chi2_pvalue(counts(2, 3), law.sum((0, 1, 4))) > ALPHA


@pytest.mark.parametrize("config", list(CONFIGS))
def test_coupled_constrained_text_equals_plain_seeded_text(make_llm, pair, config):
    """Coupled verification under a grammar: each node samples under its own path's mask,
    so seeded outputs are plain decoding's token for token."""
    target, draft = pair
    so = StructuredOutput(grammar=grammar())
    params = [SamplingParams(max_tokens=12, temperature=t, structured_output=so, seed=i)
              for i, t in enumerate([1.0, 0.7, 1.3, 0.0] * 8)]
    prompts = [PROMPT] * len(params)
    ref = [o.token_ids for o in make_llm(target).generate(prompts, params, use_tqdm=False)]
    llm = make_llm(target, speculative_algorithm="draft", draft_model=str(draft),
                   num_draft_tokens=3, spec_policy="always", spec_sampling="coupled",
                   **CONFIGS[config])
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == ref
    assert llm.spec_stats()["accepted"] > 0
