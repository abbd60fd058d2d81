"""Sampler (plain-torch path, what CPU runs): exact distribution (chi-square), the race's
equivalence with the exponential race on probabilities, determinism by seed, top-k /
top-p masks. The fused CUDA kernel is checked against this path in tests/kernels."""

from __future__ import annotations

import math

import torch

from gearshift.runner import sampler
from gearshift.runner.sampler import (
    U_MAX,
    SamplingBatch,
    apply_top_k_top_p,
    race_scores,
    sample,
    sample_ref,
    seeded_uniform,
    top_k_top_p_drop,
    top_k_top_p_filter,
)

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 1.5])


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


def test_plain_temperature_and_top_k_distributions():
    n = 20000
    logits = LOGITS.repeat(n, 1)
    toks = sample(logits, batch(n, temp=0.7, seeds=torch.arange(n) * 31 + 3))
    assert chi2_ok(torch.bincount(toks, minlength=6).float(), torch.softmax(LOGITS / 0.7, -1), n)
    toks = sample(logits, batch(n, temp=1.3, top_k=3, seeds=torch.arange(n) + 77))
    ref = torch.softmax(LOGITS / 1.3, -1) * torch.tensor([1.0, 1, 0, 0, 0, 1])
    assert chi2_ok(torch.bincount(toks, minlength=6).float(), ref / ref.sum(), n)


def test_race_picks_the_former_exponential_race_token():
    """argmax(logit / T - log E) == argmax(softmax(logit / T) / E) for the same E (the
    former sampler, in its float32 arithmetic): the log of the latter minus log Z, a
    monotone map, so only float-rounding near-ties could differ (none in these rows)."""
    logits = torch.randn(64, 3000, generator=torch.Generator().manual_seed(0)) * 4
    temps = torch.rand(64, generator=torch.Generator().manual_seed(1)) + 0.2
    seeds, steps = torch.arange(64) * 1009, torch.arange(64) % 5
    exp = -torch.log(seeded_uniform(seeds, steps, 3000))  # E ~ Exp(1)
    former = (torch.softmax(logits / temps[:, None], -1) / exp).argmax(-1)
    assert torch.equal(race_scores(logits, temps, seeds, steps).argmax(-1), former)


def test_hash_rounding_u_to_one_neither_wins_nor_breaks_the_uniform():
    """(seed 18661, step 3) hashes token 867 to u = 1.0 before the cap: E was 0 and it won
    at any logit (0 / 0 = NaN once top-k zeroed it); capped, E = 6e-8."""
    u = seeded_uniform(torch.tensor([18661]), torch.tensor([3]), 1000)
    assert u[0, 867] == U_MAX and u.max() < 1
    logits = torch.zeros(4, 1000)
    logits[:, 867] = -60.0
    sb = batch(4, seeds=torch.full((4,), 18661), steps=torch.full((4,), 3))
    assert (sample(logits, sb) != 867).all()
    sb.top_k[:] = 10
    sb.need_top_k = True
    assert (sample(logits, sb) != 867).all()


def test_filter_leaves_greedy_rows_and_kept_tokens_alone():
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(2))
    sb = batch(4, top_k=3)
    sb.temperatures[0] = 0.0
    sb.any_greedy = True
    out = top_k_top_p_filter(logits, sb)
    assert torch.equal(out[0], logits[0])
    kept = torch.isfinite(out[1:])
    assert kept.sum(-1).tolist() == [3, 3, 3]
    assert torch.equal(out[1:][kept], logits[1:][kept])
    assert torch.equal(kept, logits[1:] >= logits[1:].topk(3).values[:, -1:])


def test_low_precision_logits_and_dispatch():
    logits = torch.randn(8, 257, generator=torch.Generator().manual_seed(4))
    sb = batch(8, seeds=torch.arange(8) + 100, steps=torch.arange(8))
    want = sample_ref(logits, sb)
    assert torch.equal(sample(logits, sb), want)
    for dtype in (torch.float16, torch.bfloat16):
        low = logits.to(dtype)
        assert torch.equal(sample(low, sb), race_scores(low.float(), sb.temperatures, sb.seeds,
                                                        sb.steps).argmax(-1))
    greedy = batch(8, temp=0.0)
    assert torch.equal(sample(logits.half(), greedy), logits.half().argmax(-1))


def test_top_p_one_rows_never_depend_on_the_rest_of_the_batch():
    """A row at top_p = 1 keeps every token, whether or not another row asks for top-p
    (a cumulative sum rounding up to 1 must not cut its rarest tokens in one batch only)."""
    probs = torch.softmax(torch.cat([torch.full((1, 1), 40.0), torch.zeros(1, 4095)], 1), -1)
    probs = probs.expand(2, -1)
    drop = top_k_top_p_drop(probs, torch.tensor([-1, -1]), torch.tensor([1.0, 0.5]), False, True)
    assert not drop[0].any() and drop[1, 1:].all()


def test_the_filter_sorts_a_block_of_rows_at_a_time(monkeypatch):
    """A large batch is filtered in blocks of rows (bounded scratch: a sort of every row of
    a 256-request VERIFY step at once ran a GPU out of memory), with the same result."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(10, 64, generator=g) * 3
    sb = batch(10, top_k=5)
    sb.top_p = torch.rand(10, generator=g) * 0.5 + 0.3
    sb.need_top_p = True
    sb.temperatures[3] = 0.0
    sb.any_greedy = True
    whole = top_k_top_p_filter(logits, sb)
    probs = torch.softmax(logits, -1)
    whole_drop = top_k_top_p_drop(probs, sb.top_k, sb.top_p, True, True)
    sizes = []
    real_block = sampler._drop_block

    def spy(p, *args):
        sizes.append(p.shape[0])
        return real_block(p, *args)

    monkeypatch.setattr(sampler, "_drop_block", spy)
    monkeypatch.setattr(sampler, "FILTER_BLOCK_TOKENS", 3 * 64)
    assert torch.equal(top_k_top_p_filter(logits, sb), whole)
    assert torch.equal(top_k_top_p_drop(probs, sb.top_k, sb.top_p, True, True), whole_drop)
    assert sizes == [3, 3, 3, 1] * 2
    assert torch.isinf(whole).any() and torch.equal(whole[3], logits[3])
