"""Coupled verification (speculative/coupled.py) on hand-built inputs: every emitted token is
the plain sampler's own token at its output index, drafts racing with the target's numbers
are accepted exactly when they are that token, the emitted sequence keeps the target's
distribution (chi-square, the toy language model of test_spec_verify.py), and requests of
both schemes share a batch.

Data flow (tests only): logits tables -> DraftTree + node logits -> verify.verify with
SamplingBatch.coupled -> VerifyResult <-> runner/sampler.sample_ref per position.
"""

from __future__ import annotations

import pytest
import torch
from test_spec_verify import (
    ALPHA,
    CASES,
    DEPTH,
    V,
    _lm,
    chi2_pvalue,
    complete,
    joint,
    lookup,
    processed,
    sampling_batch,
    seq_counts,
)

from gearshift.config import ConfigError, EngineConfig
from gearshift.request import SamplingParams, SamplingParamsError
from gearshift.runner import sampler
from gearshift.runner.sampler import race_scores, sample_ref
from gearshift.speculative import coupled
from gearshift.speculative.coupled import draft_scores, draft_tokens, node_batch
from gearshift.speculative.tree import DraftTree, chain_tree
from gearshift.speculative.verify import verify, verify_greedy_ids

N = 20000


def coupled_batch(n: int, temp: float = 1.0, top_p: float = 1.0, step: int = 7,
                  mask: torch.Tensor | None = None, temps: torch.Tensor | None = None):
    sb = sampling_batch(n, temp, top_p, step, temps)
    sb.coupled = torch.ones(n, dtype=torch.bool) if mask is None else mask
    sb.all_coupled = bool((sb.coupled | (sb.temperatures == 0)).all())
    return sb


def plain_token(logits: torch.Tensor, sb, rows: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """What plain decoding samples for batch rows `rows` at output index steps + depth."""
    return sample_ref(logits, node_batch(sb, rows, depth))


def random_tree(b: int, v: int, gen: torch.Generator) -> DraftTree:
    parents = torch.tensor([-1, 0, 0, 0, 1, 1, 2, 4, 4]).expand(b, 9)
    depths = torch.tensor([0, 1, 1, 1, 2, 2, 2, 3, 3]).expand(b, 9)
    return DraftTree(torch.randint(0, v, (b, 9), generator=gen), parents, depths)


def test_emitted_tokens_are_the_plain_samplers_at_each_output_index():
    """Random trees over a 5-token vocabulary (many matches, duplicate siblings), invalid
    nodes, greedy rows: each emitted token is plain decoding's at its index, accepted
    drafts are path nodes, and where a request stops no valid child holds that token."""
    g = torch.Generator().manual_seed(11)
    b, n, v, depth = 256, 9, 5, 3
    tree = random_tree(b, v, g)
    valid = torch.rand(b, n, generator=g) > 0.15
    valid[:, 0] = True
    logits = torch.randn(b, n, v, generator=g)
    sb = coupled_batch(b, temps=torch.tensor([0.0, 0.7, 1.0, 1.5]).repeat(b // 4))
    res = verify(tree, valid, logits, sb, depth, 3)
    assert (res.num_accepted == 0).any() and (res.num_accepted == depth).any()
    rows = torch.arange(b)
    for j in range(depth + 1):
        at = res.path[:, j]  # the node whose logits sample output index steps + j
        want = plain_token(logits[rows, at], sb, rows, torch.full((b,), j))
        live = res.num_accepted >= j
        assert torch.equal(res.tokens[live, j], want[live])
        if j < depth:
            moved = res.num_accepted > j
            assert torch.equal(tree.tokens[rows, res.path[:, j + 1]][moved], want[moved])
            assert valid[rows, res.path[:, j + 1]][moved].all()
    stop = res.path[rows, res.num_accepted]
    bonus = res.tokens[rows, res.num_accepted]
    kids = (tree.parents == stop[:, None]) & valid & (tree.tokens == bonus[:, None])
    assert not kids.any(), "a valid child equal to the emitted token was not accepted"


def test_coupled_rows_beside_rejection_rows():
    """A batch mixing coupled, rejection-sampled and greedy requests: each row is its own
    scheme's result (the rejection rows as if the batch had no coupled row)."""
    g = torch.Generator().manual_seed(5)
    b, v, depth = 96, 7, 3
    tree = random_tree(b, v, g)
    valid = torch.ones(b, 9, dtype=torch.bool)
    logits = torch.randn(b, 9, v, generator=g)
    temps = torch.tensor([0.0, 1.0, 1.0]).repeat(b // 3)
    mask = torch.tensor([False, True, False]).repeat(b // 3)
    mixed = verify(tree, valid, logits, coupled_batch(b, mask=mask, temps=temps), depth, 3)
    alone = verify(tree, valid, logits, coupled_batch(b, mask=torch.ones(b, dtype=torch.bool),
                                                      temps=temps), depth, 3)
    plain = verify(tree, valid, logits, sampling_batch(b, temps=temps), depth, 3)
    for got, coupled_res, rejected in ((mixed.tokens, alone.tokens, plain.tokens),
                                       (mixed.num_accepted, alone.num_accepted, plain.num_accepted)):
        assert torch.equal(got[mask], coupled_res[mask])
        assert torch.equal(got[~mask], rejected[~mask])
    assert (mixed.chain_accepted[~mask & (temps > 0)] == -1).all()


@pytest.mark.parametrize("temp,top_p", CASES)
def test_coupled_chain_keeps_the_target_distribution(temp, top_p):
    """Chains drafted by the draft's race with the target's numbers (draft_scores), verified
    by coupling: the emitted sequence has the target's joint law, and drafts are accepted
    as often as the Gumbel coupling of p and q promises: between (1 - TV) / (1 + TV) and
    1 - TV, TV the total variation distance between them."""
    target, draft = _lm(7, temp, top_p)
    sb = coupled_batch(N, temp, top_p)
    p = [processed(t, temp, top_p) for t in target]
    drafts = torch.empty(N, 0, dtype=torch.int64)
    for j in range(DEPTH):
        scores = draft_scores(lookup(draft[j], drafts).float()[:, None, :], sb, j, None)
        drafts = torch.cat([drafts, scores[:, 0].argmax(-1, keepdim=True)], 1)
    tree = chain_tree(torch.zeros(N, dtype=torch.int64), drafts)
    logits = torch.stack([lookup(target[j], drafts[:, :j]) for j in range(DEPTH + 1)], 1)
    res = verify(tree, torch.ones(N, DEPTH + 1, dtype=torch.bool), logits.float(), sb, DEPTH, 1)

    hist = torch.bincount(res.num_accepted, minlength=DEPTH + 1)
    assert (hist > N // 20).all(), f"every acceptance length must be exercised: {hist}"
    seq = complete(res.tokens, res.num_accepted, p, torch.Generator().manual_seed(8))
    assert chi2_pvalue(torch.bincount(seq[:, 0], minlength=V), p[0]) > ALPHA
    assert chi2_pvalue(seq_counts(seq, V), joint(p)) > ALPHA
    overlap = float(torch.minimum(p[0], processed(draft[0], temp, top_p)).sum())  # 1 - TV
    rate = float((res.num_accepted > 0).double().mean())  # the first draft's acceptance
    assert overlap / (2 - overlap) - 0.01 < rate < overlap + 0.01


def test_draft_columns_draw_the_target_tokens_numbers():
    """A draft vocabulary (EAGLE-3: column c is target token cols[c]) races with the very
    numbers the target's race gives those tokens."""
    g = torch.Generator().manual_seed(2)
    b, vocab, vd = 6, 50, 12
    cols = torch.randperm(vocab, generator=g)[:vd].sort().values
    full = torch.randn(b, vocab, generator=g)
    sb = coupled_batch(b, temp=0.8)
    want = race_scores(full, sb.temperatures, sb.seeds, sb.steps + 2)[:, cols]
    got = draft_scores(full[:, None, cols], sb, 2, cols)[:, 0]
    assert torch.equal(got, want)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_a_chain_drafts_the_winner_of_its_race(top_p):
    """draft_tokens (a chain's next draft, fused on CUDA) is the argmax of draft_scores,
    greedy rows and a draft vocabulary's columns included."""
    g = torch.Generator().manual_seed(4)
    b, vocab, vd = 8, 60, 20
    cols = torch.randperm(vocab, generator=g)[:vd].sort().values
    logits = torch.randn(b, 1, vd, generator=g) * 3
    temps = torch.tensor([0.0, 1.0, 0.7, 1.2, 0.0, 2.0, 1.0, 0.3])
    sb = coupled_batch(b, top_p=top_p, temps=temps)
    got = draft_tokens(logits, sb, 3, cols)
    assert got.shape == (b, 1)
    assert torch.equal(got[:, 0], draft_scores(logits, sb, 3, cols)[:, 0].argmax(-1))
    assert torch.equal(got[temps == 0, 0], logits[temps == 0, 0].argmax(-1))


def test_greedy_rows_of_a_coupled_batch_follow_the_argmax():
    tree = chain_tree(torch.zeros(4, dtype=torch.int64), torch.tensor([[1, 2]] * 4))
    logits = torch.zeros(4, 3, 5)
    logits[:, 0, 1], logits[:, 1, 2], logits[:, 2, 4] = 9.0, 9.0, 9.0
    sb = coupled_batch(4, temps=torch.zeros(4))
    sb.all_greedy = False  # forces the coupled path
    res = verify(tree, torch.ones(4, 3, dtype=torch.bool), logits, sb, 2, 1)
    want = verify_greedy_ids(tree, torch.ones(4, 3, dtype=torch.bool), logits.argmax(-1), 2)
    assert torch.equal(res.tokens, want.tokens) and res.tokens[0].tolist() == [1, 2, 4]


def test_spec_sampling_is_validated():
    assert SamplingParams(spec_sampling="coupled").spec_sampling == "coupled"
    with pytest.raises(SamplingParamsError, match="spec_sampling"):
        SamplingParams(spec_sampling="exact")
    with pytest.raises(ConfigError, match="spec_sampling"):
        EngineConfig(model="m", spec_sampling="exact")


def test_row_targets_sample_a_block_of_rows_at_a_time(monkeypatch):
    """A large step's verified rows are sampled in blocks (bounded [rows, V] scratch), each
    row still plain decoding's token at its node's output index; other rows 0."""
    g = torch.Generator().manual_seed(3)
    b, v = 8, 50
    tree = random_tree(b, v, g)
    flat = torch.arange(b * 9)[torch.rand(b * 9, generator=g) > 0.2]
    rows_t = torch.arange(flat.shape[0]) + 2  # two rider rows first
    logits_t = torch.randn(flat.shape[0] + 5, v, generator=g)
    sb = coupled_batch(b, temps=torch.tensor([0.0, 0.7, 1.0, 1.5]).repeat(b // 4))
    req, node = flat // 9, flat % 9
    want = plain_token(logits_t[rows_t], sb, req, tree.depths[req, node])
    sizes = []
    real = coupled.node_tokens
    monkeypatch.setattr(coupled, "node_tokens", lambda x, *a: sizes.append(len(x)) or real(x, *a))
    monkeypatch.setattr(sampler, "FILTER_BLOCK_TOKENS", 16 * v)
    got = coupled.row_targets(logits_t, rows_t, flat, tree, sb)
    assert torch.equal(got[rows_t], want) and not got[:2].any() and not got[-3:].any()
    assert max(sizes) == 16 and sum(sizes) == flat.shape[0] and len(sizes) > 2
