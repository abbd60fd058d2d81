"""A product's weights into L2 while a memory-bound kernel before it runs (experiment,
GEARSHIFT_L2_PREFETCH=1; off by default).

Why: in a 64-row decode step the decode attention kernel reads the K/V at ~83% of the
H200's bandwidth (48 µs a layer against ~40), and o_proj after it pays ~5 µs of ramp-up
and tail over its 8 µs of weights. The idle ~17% of 48 µs is about o_proj's 33.5 MB. A
small kernel on a second stream, beside the attention kernel, asks L2 for those weights
(`prefetch.global.L2::evict_last`, no registers, nothing waits); the attention kernel's
K/V loads are marked evict-first so they do not push them out. o_proj then reads L2.

Data flow: DecoderLayer.forward_fused -> `during(weight)` around the attention call:
fork the side stream after the main stream's last launch, prefetch there, join before
the product (in a CUDA graph: a parallel branch). No-op off CUDA or when disabled.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

ENABLED = os.environ.get("GEARSHIFT_L2_PREFETCH", "0") == "1"
_PROGRAMS = 16  # a few programs: prefetches need issue slots, not SMs
_BLOCK = 1024  # lines a program asks for per loop step


@triton.jit
def _prefetch_kernel(W, n_lines, LINE: tl.constexpr, BLOCK: tl.constexpr):
    """prefetch.global.L2::evict_last of every 128-byte line of W (LINE elements each)."""
    step = tl.num_programs(0) * BLOCK
    for start in range(tl.program_id(0) * BLOCK, n_lines, step):
        lines = tl.minimum(start + tl.arange(0, BLOCK), n_lines - 1)
        ptrs = (W + lines.to(tl.int64) * LINE).to(tl.int64)
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; // dummy $0", "=r,l",
                                  [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


def prefetch(weight: torch.Tensor) -> None:
    """Launch the prefetch of `weight` (contiguous) on the current stream."""
    line = 128 // weight.element_size()
    n_lines = triton.cdiv(weight.numel(), line)
    _prefetch_kernel[(_PROGRAMS,)](weight, n_lines, LINE=line, BLOCK=_BLOCK, num_warps=4)


@contextlib.contextmanager
def during(weight: torch.Tensor):
    """Prefetch `weight` into L2 on a side stream while the body's launches run."""
    if not (ENABLED and weight.is_cuda and weight.is_contiguous()):
        yield
        return
    main = torch.cuda.current_stream(weight.device)
    side = _side_stream(weight.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        prefetch(weight)
    yield
    main.wait_stream(side)
