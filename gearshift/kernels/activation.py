"""SiLU(gate) * up of the fused gate_up projection in one Triton kernel (decode hot path).

Data flow: models/layers.py MLP -> gate_up_proj output [T, 2I] -> silu_and_mul -> [T, I]
-> down_proj.

Rounding follows torch's `F.silu(gate) * up` step by step: silu in fp32
(`g / (1 + exp(-g))`, accurate exp and IEEE division as in ATen's CUDA kernel), rounded to
the input dtype, then the product in fp32, rounded again. Grid: (token, column block);
no host sync, so it is CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from gearshift import env
from gearshift.kernels import pdl
from gearshift.kernels.pdl import pdl_enter
from gearshift.kernels.reference import silu_and_mul_ref  # noqa: F401 (re-exported)

_INTERPRET = env.triton_interpret()
_BLOCK = 1024




@triton.jit
def _silu_and_mul_kernel(
    X, Out, inter, stride_xt, stride_ot,
    BLOCK: tl.constexpr, ACCURATE_EXP: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = cols < inter
    gate = tl.load(X + token * stride_xt + cols, mask=mask, other=0.0)
    up = tl.load(X + token * stride_xt + inter + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    if ACCURATE_EXP:
        e = libdevice.exp(-g)  # expf, as ATen (tl.exp would be ex2.approx)
    else:
        e = tl.exp(-g)  # the interpreter has no libdevice
    silu = tl.math.div_rn(g, 1.0 + e).to(gate.dtype)  # F.silu's output, rounded
    out = silu.to(tl.float32) * up.to(tl.float32)
    tl.store(Out + token * stride_ot + cols, out.to(Out.dtype.element_ty), mask=mask)


def silu_and_mul(
    gate_up: torch.Tensor,  # [..., 2 * I], unit stride over the last dim
    *,
    out: torch.Tensor | None = None,  # [..., I]; freshly allocated when None
) -> torch.Tensor:
    """`silu(gate_up[..., :I]) * gate_up[..., I:]`, in the input dtype."""
    width = gate_up.shape[-1]
    assert width % 2 == 0, "gate_up must hold gate and up halves"
    inter = width // 2
    out_shape = (*gate_up.shape[:-1], inter)
    if out is None:
        out = torch.empty(out_shape, dtype=gate_up.dtype, device=gate_up.device)
    assert out.shape == out_shape and out.dtype == gate_up.dtype and out.stride(-1) == 1
    x2 = gate_up if gate_up.dim() == 2 and gate_up.stride(-1) == 1 else None
    if x2 is None:
        x2 = gate_up.reshape(-1, width)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
    out2 = out.view(-1, inter)  # [T, I]
    num_tokens = x2.shape[0]
    if num_tokens == 0 or inter == 0:
        return out
    block = min(_BLOCK, triton.next_power_of_2(inter))
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(inter, block))](
        x2, out2, inter, x2.stride(0), out2.stride(0),
        BLOCK=block, ACCURATE_EXP=gate_up.is_cuda and not _INTERPRET,
        PDL=pdl.enabled(x2.device), **pdl.launch_kwargs(x2.device),
        num_warps=1 if _INTERPRET else 4,
        enable_fp_fusion=True,  # ATen's silu is one nvcc kernel (fmad on): `1 + exp` may fuse
    )
    return out
