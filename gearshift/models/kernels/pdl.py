"""Programmatic dependent launch (PDL; Hopper and later) for the step's Triton kernels.

Why: in a step's CUDA graph each kernel starts only after the one before it has finished,
so between two kernels the GPU drains and refills. Session 14 measured what that costs at
the 8B's 64-row decode shapes: the RMSNorm kernel + cuBLAS gate_up + the SiLU kernel took
8.5 us more than cuBLAS alone, of which the two small kernels themselves are ~5 us
(scripts/bench_fused_gemm.py). With PDL a kernel is launched while its predecessor is still
running: its programs are placed on the SMs as they free up and wait (`gdc_wait`, the
first statement, so the predecessor's writes are visible to every load) instead of
being launched after the predecessor's last program exits. Every kernel also signals at
its start (`gdc_launch_dependents`) that the next PDL kernel may launch.

Ordering is the stream's either way: a kernel waits for its predecessor's completion
before reading anything. cuBLAS kernels take no part (torch launches them plainly); a
PDL kernel after one still gets its launch overlapped with that kernel's end.

GEARSHIFT_PDL: `1` (default: on where the GPU and Triton support it) or `0` (off).

Data flow: kernel launch sites -> `launch_options(device)` (the launch flag) and the
kernels' `PDL` constexpr -> `gdc_prologue()` at their start.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
try:  # Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: PDL stays off
    gdc_launch_dependents = gdc_wait = None


def _triton_supports_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return gdc_wait is not None and "launch_pdl" in CUDAOptions.__dataclass_fields__


@functools.lru_cache(maxsize=8)
def enabled(device: torch.device | str) -> bool:
    """PDL for kernels launched on `device`: CUDA capability >= 9, a Triton that has it,
    not the interpreter, GEARSHIFT_PDL not 0."""
    device = torch.device(device)
    if (_INTERPRET or device.type != "cuda" or os.environ.get("GEARSHIFT_PDL", "1") == "0"
            or not _triton_supports_pdl()):
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(device: torch.device | str) -> dict:
    """Keyword arguments for a kernel launch: the `PDL` constexpr and, when on, the flag."""
    on = enabled(device)
    return {"PDL": on, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def gdc_prologue(PDL: tl.constexpr):
    """First statement of a PDL kernel: wait for the predecessor's writes, then let the
    successor launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
