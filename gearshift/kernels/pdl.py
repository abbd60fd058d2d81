"""Programmatic dependent launch (PDL, compute capability >= 9) for the step's Triton kernels.

Without it each kernel of a CUDA graph starts only after the one before has completed and
flushed its writes, so every launch pays its ramp (thread blocks launched, first loads in
flight) after the previous kernel's tail, in which most SMs already sit idle. A kernel
launched with PDL (`launch_kwargs`: Triton's launch_pdl, the driver's programmatic stream
serialization) may start as soon as every program of the kernel before it has executed
griddepcontrol.launch_dependents; its programs then block in griddepcontrol.wait until
that kernel has completed and its memory is visible. Work that reads nothing another
kernel writes goes before the wait: the skinny GEMM prefetches the head of its weight rows
into L2 (weights are never written during a step), so the weight stream starts under the
previous kernel's tail.

    kernel i:    [wait][.......... work ..........][trigger][tail]
    kernel i+1:                                  (launched)[prefetch W][wait][work ...]

Rules for a kernel launched with PDL (`pdl_enter` keeps them at its top):
- every program waits before its first global read of data another kernel writes and
  before its first global write (the kernel before may still be reading that memory),
  then triggers (a program that never triggers only delays the next launch to its end);
- a kernel launched with PDL must contain the wait. Kernels without PDL (cuBLAS, torch)
  need nothing: they wait for completion as always, and a PDL kernel after them waits in
  its own wait. A wait covers every earlier kernel, since each of them waited for its
  predecessor before it could complete.

Where the trigger goes was measured on whole decode steps against PDL off: every kernel
triggering at its top let whole chains of kernels launch at once and prefetch together,
slower than no PDL; waiting first and triggering at the top still placed the next
kernel's programs while this one filled the SMs. What helps is what the helpers below do:
short kernels wait, then trigger (`pdl_enter`); GEMMs and decode attention trigger after
their main loop (`pdl_trigger`); the skinny GEMM prefetches the weights of its first
pipeline stages before its wait.

GEARSHIFT_PDL (gearshift/env.py), read at import: `auto` (default) and `on` launch with
PDL on CUDA devices of compute capability >= 9, `off` never.

Data flow: skinny_gemm / norm / activation / rope (kernels/) and kernels/
decode launch with `launch_kwargs(device)` and pass `PDL=enabled(device)` to their jit
functions, which call `pdl_enter` (short kernels) or `pdl_wait` + `pdl_trigger` (GEMMs,
decode attention) and `prefetch_rows_l2` below.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # Triton >= 3.3

from gearshift import env

_INTERPRET = env.triton_interpret()
_MODE = env.PDL.get()


@functools.cache
def _device_enabled(device: torch.device) -> bool:
    if _MODE == "off" or _INTERPRET or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def enabled(device: torch.device | str) -> bool:
    """Do kernels on `device` launch with PDL (GEARSHIFT_PDL, the GPU)?"""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _device_enabled(device)


def launch_kwargs(device: torch.device | str) -> dict:
    """Extra launch options of a kernel that follows the rules above."""
    return {"launch_pdl": True} if enabled(device) else {}


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """Wait for the previous kernel, then let the next one launch (no-op without PDL).
    Waiting first keeps at most one kernel launched ahead of the one running: triggering
    first let whole chains of kernels launch at once and prefetch together, slower than
    no PDL at all."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernel (no-op without PDL); the kernel triggers later."""
    if PDL:
        gdc_wait()


@triton.jit
def pdl_trigger(PDL: tl.constexpr):
    """Let the next kernel launch (no-op without PDL). The long kernels (GEMMs, decode
    attention) trigger after their main loop: launched earlier, the next kernel's programs
    are placed on the SMs with room while this one still fills most of them, and start
    unevenly spread once it ends."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def prefetch_rows_l2(base, rows, stride_row, NUM_COLS: tl.constexpr, LINE: tl.constexpr):
    """Ask L2 for columns 0..NUM_COLS-1 of `rows` ([R] row indices) of the row-major matrix
    at `base` (`stride_row` elements a row; LINE: elements per 128-byte line): one
    prefetch.global.L2 per line, nothing waits for it."""
    lines = tl.arange(0, NUM_COLS // LINE) * LINE
    ptrs = base + rows.to(tl.int64)[:, None] * stride_row + lines[None, :]
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // dummy $0", "=r,l", [ptrs.to(tl.int64)],
                              dtype=tl.int32, is_pure=False, pack=1)
