"""Fused sampling kernel (kernels/sample.py) against its plain-torch reference
(runner/sampler.py: seeded_uniform, race_scores, sample_ref): uniforms bit for bit, scores
within float rounding, the same tokens, ties to the lowest index, seeded determinism.

Small vocabularies (1000, 5003: not powers of two) and narrow tiles, so the interpreter
stays quick and every row spans several chunks of several tiles.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from gearshift.kernels.sample import (
    launch_plan,
    race_argmax,
    race_score,
    row_key,
    token_uniform,
    unit_float,
)
from gearshift.runner.sampler import (
    U_MAX,
    SamplingBatch,
    race_scores,
    sample_ref,
    seeded_uniform,
    top_k_top_p_filter,
)

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
# (seed 18661, step 3): token 867's hash would round u to 1.0 (E = 0 under -log(u))
EDGE_SEED, EDGE_STEP, EDGE_TOKEN = 18661, 3, 867


@triton.jit
def _uniform_kernel(Seeds, Steps, U, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    key = row_key(tl.load(Seeds + row), tl.load(Steps + row))
    tl.store(U + row * vocab + cols, token_uniform(key, cols), mask=cols < vocab)


@triton.jit
def _unit_float_kernel(X, U, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < n, other=0).to(tl.uint32)
    tl.store(U + i, unit_float(x), mask=i < n)


@triton.jit
def _score_kernel(Logits, Temps, Seeds, Steps, Out, vocab, BLOCK: tl.constexpr,
                  ACCURATE_LOG: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    key = row_key(tl.load(Seeds + row), tl.load(Steps + row))
    x = tl.load(Logits + row * vocab + cols, mask=cols < vocab, other=0.0).to(tl.float32)
    score = race_score(x, tl.load(Temps + row), key, cols, ACCURATE_LOG)
    tl.store(Out + row * vocab + cols, score, mask=cols < vocab)


def rows(n: int, vocab: int, *, seed: int = 0, dtype: torch.dtype = torch.float32):
    """logits [n, V] (scale 3), temperatures with greedy / tiny / usual values, 32-bit
    seeds and steps past 2**32 (the hash sees them modulo 2**32)."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, vocab, generator=gen) * 3).to(dtype)
    temps = torch.tensor([0.0, 1.0, 0.7, 1e-7, 2.0, 1.0, 0.0, 0.3])[torch.arange(n) % 8]
    seeds = torch.randint(0, 2**32, (n,), generator=gen)
    steps = torch.randint(0, 2**33, (n,), generator=gen)
    return [t.to(DEVICE) for t in (logits, temps, seeds, steps)]


def test_uniforms_bit_identical():
    vocab = 1000
    seeds = torch.tensor([0, 1, 2**32 - 1, EDGE_SEED, 123456789], device=DEVICE)
    steps = torch.tensor([0, 2**32 + 5, 7, EDGE_STEP, 2**40 + 3], device=DEVICE)
    u = torch.empty(5, vocab, device=DEVICE)
    _uniform_kernel[(5,)](seeds, steps, u, vocab, BLOCK=1024)
    want = seeded_uniform(seeds, steps, vocab)
    assert torch.equal(u, want)
    assert u[3, EDGE_TOKEN] == U_MAX and (u > 0).all() and (u < 1).all()


def test_unit_float_edges_bit_identical():
    edges = [0, 1, 2, 2**23 - 1, 2**24 - 1, 2**24, 2**24 + 1, 2**25 + 3, 2**31 - 1, 2**31,
             2**32 - 385, 2**32 - 129, 2**32 - 128, 2**32 - 1]
    x = torch.cat([torch.tensor(edges), torch.arange(2**32 - 300, 2**32),
                   torch.randint(0, 2**32, (500,), generator=torch.Generator().manual_seed(1))])
    u = torch.empty(x.numel(), device=DEVICE)
    _unit_float_kernel[(1,)](x.to(DEVICE), u, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    want = (x.double() + 0.5).div(2.0**32).float().clamp_max(U_MAX)
    assert torch.equal(u.cpu(), want)


@pytest.mark.parametrize("vocab", [1000, 5003])
def test_scores_match_reference_within_rounding(vocab):
    logits, temps, seeds, steps = rows(8, vocab, seed=vocab)
    out = torch.empty_like(logits)
    _score_kernel[(8,)](logits, temps, seeds, steps, out, vocab,
                        BLOCK=triton.next_power_of_2(vocab), ACCURATE_LOG=HAS_CUDA)
    sampled = temps > 0
    ref = race_scores(logits, temps, seeds, steps)
    torch.testing.assert_close(out[sampled], ref[sampled], rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("vocab,block,programs", [(1000, 64, 12), (5003, 256, 24), (5003, None, None)])
def test_tokens_match_reference(vocab, block, programs, dtype):
    logits, temps, seeds, steps = rows(12, vocab, seed=vocab + 1, dtype=dtype)
    got = race_argmax(logits, temps, seeds, steps, block=block, programs=programs)
    want = race_scores(logits, temps, seeds, steps).argmax(-1)
    assert got.dtype == torch.int64 and torch.equal(got, want)
    greedy = temps == 0
    assert torch.equal(got[greedy], logits.argmax(-1)[greedy])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_draft_columns_race_with_their_target_tokens_numbers(dtype):
    """cols (an EAGLE-3 draft vocabulary: column i is target token cols[i]): the tokens of
    race_scores(..., cols), whose uniforms are keyed by the target's ids."""
    vd, target_vocab = 1000, 5003
    logits, temps, seeds, steps = rows(12, vd, seed=11, dtype=dtype)
    cols = torch.randperm(target_vocab, generator=torch.Generator().manual_seed(1))[:vd]
    cols = cols.sort().values.to(DEVICE)
    got = race_argmax(logits, temps, seeds, steps, cols, block=64, programs=12)
    want = race_scores(logits, temps, seeds, steps, cols).argmax(-1)
    assert torch.equal(got, want)
    plain = race_argmax(logits, temps, seeds, steps, block=64, programs=12)
    sampled = temps > 1e-5
    assert not torch.equal(got[sampled], plain[sampled])  # the columns' own numbers
    assert torch.equal(got[temps == 0], plain[temps == 0])


@pytest.mark.parametrize("greedy_only", [True, False])
def test_greedy_ties_go_to_the_lowest_index(greedy_only):
    vocab = 1000
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(3))
    logits[0, [999, 700, 31]] = 9.0  # ties in different chunks and tiles
    logits[1, [64, 65, 128]] = 9.0  # ties in one tile / at a chunk boundary
    logits[2] = 5.0  # all equal
    logits[3] = float("-inf")  # nothing finite: index 0, as torch.argmax
    logits = logits.to(DEVICE)
    temps = torch.zeros(4, device=DEVICE)
    seeds = steps = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    got = race_argmax(logits, temps, seeds, steps, greedy_only=greedy_only, block=64, programs=16)
    assert got.tolist() == [31, 64, 0, 0] == logits.argmax(-1).tolist()


def test_seeded_determinism_across_batches_and_launch_plans():
    vocab = 5003
    logits, temps, seeds, steps = rows(8, vocab, seed=7)
    temps = torch.ones_like(temps)
    base = race_argmax(logits, temps, seeds, steps, block=128, programs=8)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    shuffled = race_argmax(logits[perm], temps[perm], seeds[perm], steps[perm], block=512, programs=40)
    assert torch.equal(shuffled, base[perm])
    again = race_argmax(logits[2:5], temps[2:5], seeds[2:5], steps[2:5])
    assert torch.equal(again, base[2:5])
    moved = race_argmax(logits, temps, seeds, steps + 1, block=128, programs=8)
    assert not torch.equal(moved, base)  # a new output index draws new noise


def test_top_k_top_p_rows_after_filter():
    vocab, n = 1000, 8
    logits, temps, seeds, steps = rows(n, vocab, seed=11)
    sb = SamplingBatch(temps, torch.full((n,), 0.9, device=DEVICE),
                       torch.tensor([5, -1, 3, 50, -1, 1, 2, -1], device=DEVICE), seeds, steps,
                       all_greedy=False, any_greedy=True, need_top_k=True, need_top_p=True)
    filtered = top_k_top_p_filter(logits, sb)
    got = race_argmax(filtered, temps, seeds, steps, block=128, programs=16)
    assert torch.equal(got, sample_ref(logits, sb))
    assert torch.isfinite(filtered.gather(1, got[:, None])).all()


def test_hash_that_rounds_u_to_one_does_not_win():
    """Before the cap this token had u = 1.0, E = 0, and won at any logit."""
    vocab = 1000
    logits = torch.zeros(3, vocab, device=DEVICE)
    logits[:, EDGE_TOKEN] = -60.0
    temps = torch.ones(3, device=DEVICE)
    seeds = torch.full((3,), EDGE_SEED, device=DEVICE)
    steps = torch.full((3,), EDGE_STEP, device=DEVICE)
    got = race_argmax(logits, temps, seeds, steps, block=256, programs=4)
    assert (got != EDGE_TOKEN).all()
    assert torch.equal(got, race_scores(logits, temps, seeds, steps).argmax(-1))


def test_launch_plan_covers_the_vocabulary():
    vocab = 128256
    for num_rows, programs in [(1, 528), (4, 528), (64, 528), (64, 4), (3, 1)]:
        block, tiles_per_chunk, chunks = launch_plan(num_rows, vocab, programs)
        span = tiles_per_chunk * block
        assert (chunks - 1) * span < vocab <= chunks * span
        assert num_rows * chunks <= max(programs, num_rows) * 2
    assert launch_plan(1, vocab, 528)[0] == 256 and launch_plan(64, vocab, 528) == (1024, 16, 8)


@pytest.mark.skipif(not HAS_CUDA, reason="compiles happen on a GPU (the interpreter compiles nothing)")
def test_after_the_warmup_no_step_compiles():
    """The runner's start-up `warmup` compiles every variant: afterwards rows of any count,
    greedy or sampled, on logits of either warmed dtype (bf16 for plain steps), with a
    draft vocabulary's columns or not, reuse them. Mixed steps ask for logits of 1..N
    rows, and a compile is tenths of a second inside a step."""
    from gearshift.kernels.sample import warmup
    from gearshift.runner.jit_log import triton_compiles

    vocab = 32000
    warmup(vocab, DEVICE, (torch.bfloat16, torch.float32))  # as ModelRunner on a bf16 model
    with triton_compiles() as compiles:
        for rows in (2, 3, 5, 13, 16, 17, 40, 64, 100, 700):
            zeros = torch.zeros(rows, device=DEVICE, dtype=torch.int64)
            for dtype in (torch.bfloat16, torch.float32):  # plain steps; speculative paths
                logits = torch.randn(rows, vocab, device=DEVICE, dtype=dtype)
                for greedy_only in (True, False):
                    race_argmax(logits, torch.rand(rows, device=DEVICE), zeros, zeros,
                                greedy_only=greedy_only)
                # a draft chain's race over a draft vocabulary (speculative/coupled.py)
                cols = torch.arange(3000, device=DEVICE, dtype=torch.int64) * 7
                race_argmax(logits[:, :3000].contiguous(), torch.rand(rows, device=DEVICE),
                            zeros, zeros, cols)
    assert compiles.available and list(compiles) == []
