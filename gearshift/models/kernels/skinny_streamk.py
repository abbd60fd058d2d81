"""Stream-K for the skinny TMA GEMM (`SkinnyConfig(stream_k=True)`): a fixed number of
persistent programs, one per SM by default, each streaming an equal share of the weights.

Why: a memory-bound product is only as fast as its SMs stream, and the one-program-a-tile
grid leaves SMs idle. At 64 rows the 8B's qkv runs 96 programs of 64 columns on 132 SMs,
o_proj and down 64-128, and gate_up 224 (1.7 waves at one program an SM: the second wave
runs on 92). Each GEMM also reads ~5 us over its floor (sessions 16-17, docs/benchmarks).
Split-K (session 17's candidates, measured in session 18) made more, shorter programs and
lost: 1.45-2.9 waves and a pipeline fill every K range. Here the grid is one wave.

The work is a line of units, (column tile, K block) in tile-major order: U = tiles x KB.
Program c takes units [c U / P, (c + 1) U / P) in one pipelined loop, so its TMA loads
run on across tile boundaries. A tile whose K blocks all fall in one program is finished
there (tile_epilogue). A tile cut between programs: each part stores its fp32 partials
(and the norm's row sums of squares) in a persistent workspace, at most two parts a
program (slot 0: the part its range starts in, slot 1: the part it ends in); after its
loop each takes a ticket for the tile, and the last to arrive sums the parts in program
order (deterministic for a given grid) and runs the epilogue, then zeroes the ticket for
the next call or graph replay.

    KB = 4 K blocks a tile, 3 tiles (U = 12 units), P = 5 programs:
    unit      0  1  2  3 | 4  5  6  7 | 8  9 10 11
    program   0  0  1  1 | 2  2  2  3 | 3  4  4  4
    tile 0: parts of programs 0 and 1 (both slot 0); tile 1: 2 (slot 0) and 3 (slot 0);
    tile 2: 3 (slot 1) and 4 (slot 0). A program's loop never stops at a tile boundary.

Rows: one row block (M <= BLOCK_M), the decode sizes the chooser serves.

Data flow: skinny_gemm.skinny_linear (config.stream_k) -> launch_streamk ->
_skinny_streamk_kernel (-> skinny_gemm.tile_epilogue, _fixup).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gearshift.attention.kernels.decode import num_sms
from gearshift.models.kernels.pdl import pdl_trigger
from gearshift.models.kernels.skinny_gemm import SkinnyConfig, _enter, tile_epilogue


@triton.jit
def _owner(u, U, P):
    """The program whose range holds unit u (program c covers [c U / P, (c + 1) U / P))."""
    return ((u + 1) * P + U - 1) // U - 1


@triton.jit
def _store_part(Work, index, acc, acc_up, sq_rows, GATED: tl.constexpr, RMS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's fp32 partials of one tile at Work[index] (index = 2 program + slot)."""
    per: tl.constexpr = BLOCK_M * BLOCK_N * (2 if GATED else 1) + BLOCK_M
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    base = Work + index.to(tl.int64) * per
    tl.store(base + offs, acc)
    if GATED:
        tl.store(base + BLOCK_M * BLOCK_N + offs, acc_up)
    if RMS:
        tl.store(base + per - BLOCK_M + tl.arange(0, BLOCK_M), sq_rows)


@triton.jit
def _fixup(tile, KB, U, P, Work, Count, B, Out, M, N, K, stride_om, eps,
           HAS_BIAS: tl.constexpr, GATED: tl.constexpr, RMS: tl.constexpr,
           ACCUMULATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Called by every program holding a part of `tile` once its part is stored: a ticket;
    the last one sums the parts in program order and writes the tile's output."""
    first = _owner(tile * KB, U, P)
    last = _owner(tile * KB + KB - 1, U, P)
    tl.debug_barrier()  # every thread's partial is stored before the release below
    ticket = tl.atomic_add(Count + tile, 1, sem="acq_rel", scope="gpu")
    if ticket == last - first:
        per: tl.constexpr = BLOCK_M * BLOCK_N * (2 if GATED else 1) + BLOCK_M
        offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        offs_m = tl.arange(0, BLOCK_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        sq_rows = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for p in range(first, last + 1):
            # slot 0 if program p's range starts inside (or at the start of) this tile
            slot = tl.where(p * U // P >= tile * KB, 0, 1)
            base = Work + (2 * p + slot).to(tl.int64) * per
            # .cg: at L2, never an L1 line another SM's store left stale
            acc += tl.load(base + offs, cache_modifier=".cg")
            if GATED:
                acc_up += tl.load(base + BLOCK_M * BLOCK_N + offs, cache_modifier=".cg")
            if RMS:
                sq_rows += tl.load(base + per - BLOCK_M + offs_m, cache_modifier=".cg")
        tl.atomic_xchg(Count + tile, 0)  # zero again for the next call / graph replay
        tile_epilogue(acc, acc_up, sq_rows, 0, tile * BLOCK_N, M, N, K, B, Out, stride_om, eps,
                      HAS_BIAS, GATED, RMS, ACCUMULATE, BLOCK_M, BLOCK_N)


@triton.jit
def _skinny_streamk_kernel(
    x_desc, w_desc, B, Out, M, N, K, stride_om, eps,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, RMS: tl.constexpr, ACCUMULATE: tl.constexpr,
    W, stride_wn, PDL: tl.constexpr, PREFETCH: tl.constexpr, LINE: tl.constexpr,
    Work, Count,
):
    # The products of skinny_gemm._skinny_tma_kernel (GATED, RMS, ACCUMULATE, bias), M <=
    # BLOCK_M; units and parts as in the module docstring.
    P = tl.num_programs(0)
    c = tl.program_id(0)
    KB = tl.cdiv(K, BLOCK_K)
    U = tl.cdiv(N, BLOCK_N) * KB
    u0 = c * U // P
    u1 = (c + 1) * U // P
    k_first = tl.minimum((u0 % KB) * BLOCK_K, tl.maximum(K - PREFETCH, 0))
    _enter(W + k_first, (u0 // KB) * BLOCK_N + tl.arange(0, BLOCK_N), N, stride_wn, GATED,
           PDL, PREFETCH, LINE)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sq = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    seg = u0  # the first unit of the part being summed
    for u in tl.range(u0, u1, num_stages=NUM_STAGES):
        tile = u // KB
        k0 = (u - tile * KB) * BLOCK_K
        x = x_desc.load([0, k0])  # [BLOCK_M, BLOCK_K]
        acc = tl.dot(x, tl.trans(w_desc.load([tile * BLOCK_N, k0])), acc)
        if GATED:
            acc_up = tl.dot(x, tl.trans(w_desc.load([N + tile * BLOCK_N, k0])), acc_up)
        if RMS:
            xf = x.to(tl.float32)
            sq += xf * xf
        if u == tile * KB + KB - 1:  # the tile's last K block
            if seg == tile * KB:  # all of the tile in this program: its output
                tile_epilogue(acc, acc_up, tl.sum(sq, 1), 0, tile * BLOCK_N, M, N, K, B, Out,
                              stride_om, eps, HAS_BIAS, GATED, RMS, ACCUMULATE, BLOCK_M, BLOCK_N)
            else:  # the end of a tile begun in an earlier program: this range's first part
                _store_part(Work, 2 * c, acc, acc_up, tl.sum(sq, 1), GATED, RMS, BLOCK_M, BLOCK_N)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            sq = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
            seg = u + 1
    pdl_trigger(PDL)
    head_cut = u0 % KB != 0  # the range starts inside a tile
    tail_cut = u1 % KB != 0  # ... ends inside one: that part is still in the accumulators
    if tail_cut:
        _store_part(Work, 2 * c + tl.where(seg == u0, 0, 1), acc, acc_up, tl.sum(sq, 1),
                    GATED, RMS, BLOCK_M, BLOCK_N)
    if head_cut:
        _fixup(u0 // KB, KB, U, P, Work, Count, B, Out, M, N, K, stride_om, eps,
               HAS_BIAS, GATED, RMS, ACCUMULATE, BLOCK_M, BLOCK_N)
    if tail_cut and (not head_cut or (u1 - 1) // KB != u0 // KB):
        _fixup((u1 - 1) // KB, KB, U, P, Work, Count, B, Out, M, N, K, stride_om, eps,
               HAS_BIAS, GATED, RMS, ACCUMULATE, BLOCK_M, BLOCK_N)


def launch_streamk(args: tuple, consts: dict, config: SkinnyConfig, m: int, n: int, k: int,
                   gated: bool, device: torch.device, programs: int | None) -> None:
    """Run _skinny_streamk_kernel on skinny_linear's TMA arguments with `programs` programs
    (default: the device's SM count; never more than there are units)."""
    assert m <= config.block_m, "stream-K serves one row block"
    tiles = triton.cdiv(n, config.block_n)
    units = tiles * triton.cdiv(k, config.block_k)
    grid = max(1, min(programs or num_sms(device), units))
    per = config.block_m * config.block_n * (2 if gated else 1) + config.block_m
    work, count = streamk_buffers(device, 2 * grid * per, tiles)
    _skinny_streamk_kernel[(grid,)](*args, Work=work, Count=count, **consts)


_BUFFERS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # device -> (work, count)
_RETIRED: list[torch.Tensor] = []  # outgrown buffers, kept for graphs that captured them


def streamk_buffers(device: torch.device, work_numel: int,
                    tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The stream-K scratch of `device`: fp32 partials (>= work_numel) and int32 tickets
    (>= tiles, all zero; every call leaves them zero). One pair serves every call: calls on
    one stream run one after another (under PDL a kernel waits before touching memory).
    Grown, never freed, so CUDA graphs captured against an older pair stay valid; grow
    them before capture (the chooser's timing at first use does)."""
    device = torch.device(device)
    work, count = _BUFFERS.get(device, (None, None))
    if work is None or work.numel() < work_numel or count.numel() < tiles:
        if work is not None:
            _RETIRED.extend((work, count))
        work = torch.empty(max(work_numel, 0 if work is None else work.numel(), 1),
                           dtype=torch.float32, device=device)
        count = torch.zeros(max(tiles, 0 if count is None else count.numel(), 1),
                            dtype=torch.int32, device=device)
        _BUFFERS[device] = work, count
    return work, count
