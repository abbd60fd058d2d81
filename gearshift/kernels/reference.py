"""Plain-torch references of the fused kernels in kernels/ (HF Llama semantics).
They run the model on CPU and are the oracles the Triton kernels are tested against;
this module must not import triton (CPU installs need not have it).

Data flow: kernels/ops.py -> these on non-CUDA tensors.
"""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain torch: exactly layers.RMSNorm.forward."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch, out of place: (rms_norm(x + residual), x + residual)."""
    new_residual = x + residual
    return rms_norm_ref(new_residual, weight, eps), new_residual


def apply_rope_ref(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    positions: torch.Tensor,  # [T] int
    cos: torch.Tensor,  # [max_pos, D/2] fp32
    sin: torch.Tensor,  # [max_pos, D/2] fp32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch, out of place: exactly layers.RotaryEmbedding.forward."""
    cos_t = cos[positions][:, None, :]  # [T, 1, D/2]
    sin_t = sin[positions][:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos_t - x2 * sin_t, x2 * cos_t + x1 * sin_t), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """Plain torch: exactly layers.MLP's activation."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear; with `out` ([rows, N], 2-D x, no bias) the product is written there."""
    if out is not None:
        assert bias is None, "out= takes a product without bias"
        return torch.mm(x, weight.t(), out=out)
    return torch.nn.functional.linear(x, weight, bias)
