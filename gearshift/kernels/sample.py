"""Sampling in one pass over the logits (CUDA): greedy argmax and the seeded Gumbel-max
race of runner/sampler.py, fused into a split reduction.

Data flow: ModelRunner.run -> sampler.sample (CUDA) -> race_argmax: logits [B, V] (after
the optional top-k / top-p filter) -> token ids [B] int64.

Each token's score is that of sampler.race_scores: the logit for greedy rows (T = 0), else
logit / max(T, 1e-5) - log(-log(u)), with u the counter-based uniform of
sampler.seeded_uniform, hashed here in uint32 arithmetic and converted through float64
exactly as torch does, so u is bit-identical (with `cols`, an EAGLE-3 draft vocabulary:
column i draws token cols[i]'s uniform, as race_scores(..., cols) does). Only log may
round differently from torch (libdevice on CUDA, numpy under the interpreter), so the
kernel and the reference pick the same token except at float-rounding near-ties.

    logits row b   |----- chunk 0 -----|----- chunk 1 -----| ... |-- chunk C-1 --|
                    tile tile ... tile    (BLOCK columns a tile)
    stage 1, grid (B, C):  best (score, index) of each chunk -> part_val, part_idx [B, C]
    stage 2, grid (B,):    the best of the row's chunks      -> tokens [B]

Ties go to the lowest index at every level (lanes walk their columns in order and keep the
first maximum; equal maxima across lanes or chunks resolve to the smallest index), as in
torch.argmax. NaN scores never win (torch.argmax would pick them). Nothing syncs with the
host and the grid depends only on shapes: calls are CUDA-graph safe.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from gearshift import env
from gearshift.kernels import counter_rng as rng

_INTERPRET = env.triton_interpret()
HASH_MUL: tl.constexpr = tl.constexpr(rng.HASH_MUL)
STEP_OFFSET: tl.constexpr = tl.constexpr(rng.STEP_OFFSET)
U_MAX: tl.constexpr = tl.constexpr(rng.U_MAX)
MIN_TEMPERATURE: tl.constexpr = tl.constexpr(rng.MIN_TEMPERATURE)
NO_INDEX: tl.constexpr = tl.constexpr(2**31 - 1)


@triton.jit
def hash32(x):
    """sampler.hash32 on uint32 (multiplication wraps modulo 2**32, as its `& 0xFFFFFFFF`)."""
    x = ((x >> 16) ^ x) * HASH_MUL
    x = ((x >> 16) ^ x) * HASH_MUL
    return (x >> 16) ^ x


@triton.jit
def row_key(seed, step):
    """int64 seed in [0, 2**32) and output index -> the row's uint32 key."""
    return hash32(seed.to(tl.uint32) ^ hash32(step.to(tl.uint32) + STEP_OFFSET))


@triton.jit
def unit_float(x):
    """uint32 hash -> float32 in (0, 1): (x + 0.5) / 2**32, exact in float64, rounded once."""
    return tl.minimum(((x.to(tl.float64) + 0.5) * 2.0**-32).to(tl.float32), U_MAX)


@triton.jit
def token_uniform(key, cols):
    """uint32 row key, int32 token ids -> float32 u of seeded_uniform, bit for bit."""
    return unit_float(hash32(key ^ hash32(cols.to(tl.uint32))))


@triton.jit
def race_score(x, temp, key, cols, ACCURATE_LOG: tl.constexpr):
    """fp32 logits x of one row's columns -> logit / T - log(E), E = -log(u) ~ Exp(1)."""
    u = token_uniform(key, cols)
    if ACCURATE_LOG:  # logf: tl.log is lg2.approx, whose error near u = 1 is absolute, not relative
        gumbel = libdevice.log(-libdevice.log(u))
    else:  # the interpreter has no libdevice; numpy's log is accurate
        gumbel = tl.log(-tl.log(u))
    return tl.math.div_rn(x, tl.maximum(temp, MIN_TEMPERATURE)) - gumbel


# The integer arguments are not specialised (Triton would otherwise compile a variant per
# divisibility class of each) and BLOCK_C depends on the vocabulary and tile only, so a
# step with a new number of rows compiles nothing (mixed steps ask for 1..N rows, and a
# compile inside a step costs tenths of a second).
@triton.jit(do_not_specialize=["vocab", "stride_row", "tiles_per_chunk", "num_chunks"])
def _chunk_best_kernel(
    Logits, Temps, Seeds, Steps, Cols, PartVal, PartIdx,
    vocab, stride_row, tiles_per_chunk, num_chunks,
    GREEDY_ONLY: tl.constexpr, HAS_COLS: tl.constexpr, ACCURATE_LOG: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk * tiles_per_chunk * BLOCK
    lanes = tl.arange(0, BLOCK)  # [BLOCK]
    best = tl.full([BLOCK], float("-inf"), tl.float32)  # [BLOCK] best score per lane
    best_idx = start + lanes  # [BLOCK] int32; a row of -inf resolves to its first column
    if not GREEDY_ONLY:
        temp = tl.load(Temps + row)
        key = row_key(tl.load(Seeds + row), tl.load(Steps + row))
    for t in range(tiles_per_chunk):
        cols = start + t * BLOCK + lanes  # [BLOCK]
        x = tl.load(Logits + row * stride_row + cols, mask=cols < vocab,
                    other=float("-inf")).to(tl.float32)
        if not GREEDY_ONLY:
            if temp != 0.0:
                if HAS_COLS:
                    ids = tl.load(Cols + cols, mask=cols < vocab, other=0)
                else:
                    ids = cols
                x = race_score(x, temp, key, ids, ACCURATE_LOG)
        take = x > best  # strict: a lane keeps its first maximum
        best = tl.where(take, x, best)
        best_idx = tl.where(take, cols, best_idx)
    top = tl.max(best, axis=0)
    tl.store(PartVal + row * num_chunks + chunk, top)
    tl.store(PartIdx + row * num_chunks + chunk, tl.min(tl.where(best == top, best_idx, NO_INDEX), axis=0))


@triton.jit(do_not_specialize=["num_chunks"])
def _row_best_kernel(PartVal, PartIdx, Tokens, num_chunks, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)  # [BLOCK_C]
    mask = c < num_chunks
    val = tl.load(PartVal + row * num_chunks + c, mask=mask, other=float("-inf"))
    idx = tl.load(PartIdx + row * num_chunks + c, mask=mask, other=NO_INDEX)
    top = tl.max(val, axis=0)
    tl.store(Tokens + row, tl.min(tl.where(val == top, idx, NO_INDEX), axis=0).to(tl.int64))


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


NARROW, WIDE = 256, 1024  # the stage-1 tile widths (columns)


def launch_plan(num_rows: int, vocab: int, programs: int, block: int | None = None) -> tuple[int, int, int]:
    """(BLOCK, tiles per chunk, chunks per row): about `programs` stage-1 programs in all,
    WIDE tiles unless that leaves too few programs (one row: NARROW)."""
    if block is None:
        block = WIDE if num_rows * triton.cdiv(vocab, WIDE) >= programs else NARROW
    tiles = triton.cdiv(vocab, block)
    tiles_per_chunk = max(1, triton.cdiv(num_rows * tiles, programs))
    return block, tiles_per_chunk, triton.cdiv(tiles, tiles_per_chunk)


def race_argmax(
    logits: torch.Tensor,  # [B, V] fp32 / bf16 / fp16
    temperatures: torch.Tensor,  # [B] float32; 0 = greedy
    seeds: torch.Tensor,  # [B] int64, values in [0, 2**32)
    steps: torch.Tensor,  # [B] int64 output index
    cols: torch.Tensor | None = None,  # [V] int64: column i's token id (None: i)
    *,
    greedy_only: bool = False,  # every row greedy: skip the race entirely
    block: int | None = None,  # tile width override (tests)
    programs: int | None = None,  # stage-1 program target override (tests)
) -> torch.Tensor:
    """Token ids [B] int64: argmax of sampler.race_scores per row, in two launches."""
    num_rows, vocab = logits.shape
    assert temperatures.dtype == torch.float32, "temperatures must be float32"
    assert seeds.dtype == steps.dtype == torch.int64, "seeds and steps must be int64"
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if programs is None:
        programs = 4 * _num_sms(logits.device)
    block, tiles_per_chunk, num_chunks = launch_plan(num_rows, vocab, programs, block)
    part_val = torch.empty(num_rows, num_chunks, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(num_rows, num_chunks, dtype=torch.int32, device=logits.device)
    tokens = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return tokens
    has_cols = cols is not None and not greedy_only
    if has_cols:
        assert cols.dtype == torch.int64 and cols.shape == (vocab,), "cols must be [V] int64"
    _chunk_best_kernel[(num_rows, num_chunks)](
        logits, temperatures, seeds, steps, cols if has_cols else seeds, part_val, part_idx,
        vocab, logits.stride(0), tiles_per_chunk, num_chunks,
        GREEDY_ONLY=greedy_only, HAS_COLS=has_cols, ACCURATE_LOG=not _INTERPRET, BLOCK=block,
        num_warps=1 if _INTERPRET else max(2, block // 256),
    )
    _row_best_kernel[(num_rows,)](
        part_val, part_idx, tokens, num_chunks,
        BLOCK_C=triton.next_power_of_2(triton.cdiv(vocab, block)),  # >= num_chunks
        num_warps=1 if _INTERPRET else 4,
    )
    return tokens


def warmup(vocab: int, device: torch.device | str,
           dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> None:
    """Compile every variant a step can ask for (greedy-only or not, either tile width, a
    draft vocabulary's columns or not) on logits of each of `dtypes` (the model's own:
    plain steps and draft chains; fp32: the speculative paths), before serving: with the
    integer arguments unspecialised these are all of them, so no step compiles (tenths of
    a second each)."""
    ones, zeros = torch.ones(1, device=device), torch.zeros(1, device=device, dtype=torch.int64)
    cols = torch.zeros(vocab, device=device, dtype=torch.int64)
    for dtype in dict.fromkeys(dtypes):
        logits = torch.zeros(1, vocab, device=device, dtype=dtype)
        for block in (NARROW, WIDE):
            for greedy_only in (True, False):
                race_argmax(logits, ones, zeros, zeros, greedy_only=greedy_only, block=block)
            race_argmax(logits, ones, zeros, zeros, cols, block=block)
