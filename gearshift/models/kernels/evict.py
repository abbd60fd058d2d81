"""L2 eviction that behaves like a layer's kernel under PDL, for timing GEMMs in context.

The skinny chooser (skinny_select.py) times each candidate after evicting L2 by reading a
256 MB buffer. With `flush.sum()` as that read, the candidate follows a kernel that never
lets the next one launch early, so a kernel that launches under PDL (kernels/pdl.py)
cannot show what it gains inside a decode step, where it starts during the previous
kernel's tail and prefetches its weights into L2 there. `stream_sum` is the same read as a
Triton kernel that waits for the kernel before it, streams its share of the buffer and
then lets the next kernel launch (`pdl_trigger` after the loop, as the GEMMs and decode
attention do), so a candidate timed after it overlaps the tail as it would in the step.

Session 19 measured the bias this removes: taking the kernel within 10% of cuBLAS instead
of 3% ahead (skinny_select.PDL_KERNEL_MARGIN) gained 0.1-0.4% offline on the H200.
`GEARSHIFT_SKINNY_TIMING=context` times with this kernel and the 3% margin (an experiment
prepared for session 20; the default stays `alone`).

Data flow: SkinnyChooser._time -> graph_ms(fn, flush, evict=stream_sum) -> one launch
per call, sums into `out` ([programs] fp32, so the read cannot be dropped).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gearshift.models.kernels import pdl
from gearshift.models.kernels.pdl import pdl_trigger, pdl_wait

_BLOCK = 4096  # elements a program reads per step


@triton.jit
def _stream_sum_kernel(X, Out, n, per_program, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    start = tl.program_id(0).to(tl.int64) * per_program
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, per_program, BLOCK):
        offs = start + off + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=(offs < n) & (off + tl.arange(0, BLOCK) < per_program),
                       other=0.0).to(tl.float32)
    pdl_trigger(PDL)
    tl.store(Out + tl.program_id(0), tl.sum(acc, 0))


def stream_sum(x: torch.Tensor, out: torch.Tensor | None = None, programs: int = 528) -> torch.Tensor:
    """Per-program partial sums of the flat `x` ([programs] fp32; their sum is x.sum()):
    every element read once, the next kernel let in after each program's loop (under PDL)."""
    flat = x.reshape(-1)
    n = flat.numel()
    per_program = triton.cdiv(triton.cdiv(n, programs), _BLOCK) * _BLOCK
    programs = max(1, triton.cdiv(n, per_program))
    if out is None or out.numel() < programs:
        out = torch.empty(programs, dtype=torch.float32, device=x.device)
    use_pdl = pdl.enabled(x.device)
    _stream_sum_kernel[(programs,)](flat, out, n, per_program, BLOCK=_BLOCK, PDL=use_pdl,
                                    **pdl.launch_kwargs(x.device))
    return out[:programs]
