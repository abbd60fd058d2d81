"""Sampler: exact distribution (chi-square), determinism by seed, top-k / top-p masks."""

from __future__ import annotations

import math

import torch

from gearshift.runner.sampler import SamplingBatch, apply_top_k_top_p, sample, seeded_uniform


def batch(n, temp=1.0, top_p=1.0, top_k=-1, seeds=None, steps=None):
    seeds = torch.arange(n) if seeds is None else seeds
    steps = torch.zeros(n, dtype=torch.int64) if steps is None else steps
    return SamplingBatch(torch.full((n,), temp), torch.full((n,), top_p),
                         torch.full((n,), top_k, dtype=torch.int64), seeds, steps,
                         all_greedy=temp == 0, any_greedy=temp == 0, need_top_k=top_k > 0,
                         need_top_p=top_p < 1)


def chi2_ok(counts: torch.Tensor, probs: torch.Tensor, n: int) -> bool:
    """Chi-square goodness of fit; threshold is the 1e-4 upper quantile (false alarm 1e-4),
    via the Wilson-Hilferty approximation."""
    keep = probs > 0
    exp = probs[keep] * n
    stat = ((counts[keep] - exp) ** 2 / exp).sum().item()
    k = int(keep.sum()) - 1
    z = 3.719  # N(0,1) upper 1e-4 quantile
    crit = k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3
    return stat < crit


def test_sampling_matches_softmax_distribution():
    n = 20000
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 1.5]).repeat(n, 1)
    toks = sample(logits, batch(n, seeds=torch.arange(n) * 7919))
    counts = torch.bincount(toks, minlength=6).float()
    assert chi2_ok(counts, torch.softmax(logits[0], -1), n)


def test_temperature_and_top_p_top_k_distributions():
    n = 20000
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 1.5]).repeat(n, 1)
    toks = sample(logits, batch(n, temp=0.5, top_p=0.8, seeds=torch.arange(n) + 11))
    p = torch.softmax(logits[0] / 0.5, -1)
    ref = apply_top_k_top_p(p[None], torch.tensor([-1]), torch.tensor([0.8]), False, True)[0]
    ref = ref / ref.sum()
    assert (ref > 0).sum() < 6  # the nucleus dropped something
    assert chi2_ok(torch.bincount(toks, minlength=6).float(), ref, n)
    toks = sample(logits, batch(n, top_k=2, seeds=torch.arange(n) + 5))
    assert set(toks.tolist()) == {0, 5}


def test_same_seed_same_token_any_batch_position():
    logits = torch.randn(1, 50).repeat(4, 1)
    sb = batch(4, seeds=torch.tensor([42, 1, 42, 3]), steps=torch.tensor([7, 7, 7, 7]))
    toks = sample(logits, sb)
    assert toks[0] == toks[2]
    u1 = seeded_uniform(torch.tensor([42]), torch.tensor([7]), 50)
    u2 = seeded_uniform(torch.tensor([42]), torch.tensor([8]), 50)
    assert not torch.equal(u1, u2) and (u1 > 0).all() and (u1 < 1).all()


def test_greedy_rows_in_mixed_batch_and_top_k_one():
    logits = torch.randn(6, 30)
    sb = batch(6)
    sb.temperatures = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    sb.any_greedy = True
    toks = sample(logits, sb)
    assert torch.equal(toks[::2], logits.argmax(-1)[::2])
    assert torch.equal(sample(logits, batch(6, top_k=1)), logits.argmax(-1))
