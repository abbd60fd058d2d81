"""L2 prefetch of the weights the next kernels will stream, on a side stream.

Why: a decode step at small batch is a chain of weight-streaming GEMMs and latency-bound
small kernels (RMSNorm, RoPE, decode attention over a short context). While a small
kernel runs, and between two launches, DRAM is idle. A prefetch kernel forked onto a side
stream at such a point pulls the head of the next GEMM's weight into L2, so that GEMM
starts with part of its bytes on chip. The prefetch writes nothing: results are the same
with it or without it, only the timing moves.

Data flow: models/layers.py (DecoderLayer with a `WeightPrefetch` attached by
ModelRunner on CUDA) -> WeightPrefetch.fork(point) at fixed points of the layer ->
prefetch_l2 on the side stream (`prefetch.global.L2` per 128-byte line) ->
WeightPrefetch.join() at the end of the model's forward (the side stream rejoins the main
one, as CUDA-graph capture requires).

The fork points and amounts are static per forward shape (rows <= `max_rows`), so the
captured graphs hold the same prefetches every replay.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LINE_BYTES = 128  # an L2 line: what one prefetch hint names
SECTOR_BYTES = 32  # what one load brings from DRAM


@triton.jit
def _l2_prefetch_kernel(Ptr, Sink, n_lines, LINE_ELEMS: tl.constexpr, BLOCK: tl.constexpr,
                        EVICT_LAST: tl.constexpr, LOAD: tl.constexpr):
    # program p prefetches lines p*BLOCK.., then (p + programs)*BLOCK.., ... (clamped: the
    # last line may be prefetched twice; a prefetch has no effect on results)
    # LOAD: real loads of one element per line (so the line is fetched, not just hinted),
    # kept alive by a store to Sink that never happens (the sum is never NaN... unless
    # the weights hold NaN, when Sink takes a value nobody reads)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(tl.program_id(0) * BLOCK, n_lines, step):
        lines = tl.minimum(start + tl.arange(0, BLOCK), n_lines - 1).to(tl.int64)
        ptrs = Ptr + lines * LINE_ELEMS
        if LOAD:
            if EVICT_LAST:
                acc += tl.load(ptrs, eviction_policy="evict_last").to(tl.float32)
            else:
                acc += tl.load(ptrs).to(tl.float32)
        elif EVICT_LAST:
            tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;",
                                      "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;",
                                      "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)
    if LOAD:
        total = tl.sum(acc, 0)
        if total != total:
            tl.store(Sink + tl.program_id(0), total)


_SINKS: dict[torch.device, torch.Tensor] = {}


def prefetch_l2(t: torch.Tensor, nbytes: int | None = None, *, programs: int = 32,
                evict_last: bool = False, load: bool = False) -> None:
    """Prefetch the first `nbytes` (None: all) of contiguous CUDA tensor `t` into L2 on the
    current stream. Writes nothing."""
    assert t.is_cuda and t.is_contiguous()
    total = t.numel() * t.element_size()
    nbytes = total if nbytes is None else min(nbytes, total)
    granule = SECTOR_BYTES if load else LINE_BYTES  # a load fetches one 32-byte sector
    n_lines = nbytes // granule
    if n_lines <= 0:
        return
    flat = t.view(-1)
    line_elems = granule // t.element_size()
    block = 512
    grid = (max(1, min(programs, triton.cdiv(n_lines, block))),)
    sink = _SINKS.get(t.device)
    if sink is None:
        sink = _SINKS[t.device] = torch.zeros(1024, dtype=torch.float32, device=t.device)
    _l2_prefetch_kernel[grid](flat, sink, n_lines, LINE_ELEMS=line_elems, BLOCK=block,
                              EVICT_LAST=evict_last, LOAD=load, num_warps=4)
