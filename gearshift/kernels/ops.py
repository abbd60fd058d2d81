"""Elementwise ops of the decoder layers, dispatched by device: fused Triton kernels on
CUDA (kernels/), plain torch elsewhere (the references the kernels are tested
against). One place decides, so layers.py reads as the math.

Data flow: models/layers.py -> ops.* -> kernels (CUDA) | torch references (CPU).
"""

from __future__ import annotations

import torch

from gearshift.kernels.reference import (
    apply_rope_ref,
    fused_add_rms_norm_ref,
    linear_ref,
    rms_norm_ref,
    silu_and_mul_ref,
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.is_cuda:
        from gearshift.kernels.norm import rms_norm as kernel

        return kernel(x, weight, eps)
    return rms_norm_ref(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); on CUDA `residual` is updated in place."""
    if x.is_cuda:
        from gearshift.kernels.norm import fused_add_rms_norm as kernel

        return kernel(x, residual, weight, eps)
    return fused_add_rms_norm_ref(x, residual, weight, eps)


def rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
         sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox RoPE; on CUDA q and k (views into the fused qkv output) are rotated in place."""
    if q.is_cuda:
        from gearshift.kernels.rope import apply_rope as kernel

        return kernel(q, k, positions, cos, sin)
    return apply_rope_ref(q, k, positions, cos, sin)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if gate_up.is_cuda:
        from gearshift.kernels.activation import silu_and_mul as kernel

        return kernel(gate_up)
    return silu_and_mul_ref(gate_up)


def gated_linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    """silu_and_mul(layer(x)) for the MLP's fused [gate; up] projection (no bias). On CUDA
    with few rows, one launch of the skinny kernel where it measured faster than cuBLAS +
    the SiLU kernel (kernels/skinny_select.py)."""
    if x.is_cuda:
        from gearshift.kernels.skinny_select import gated_linear as kernel

        return kernel(x, layer.weight)
    return silu_and_mul_ref(linear_ref(x, layer.weight, layer.bias))


def rms_linear(x: torch.Tensor, layer: torch.nn.Linear, norm, gated: bool = False) -> torch.Tensor:
    """layer(rms_norm(x)) (+ SiLU-and-mul when `gated`) where `norm`'s weight has been folded
    into layer.weight (norm.weight: ones). On CUDA one launch where the chooser took the
    TMA kernel with the norm inside."""
    if x.is_cuda:
        from gearshift.kernels.skinny_select import rms_linear as kernel

        return kernel(x, layer.weight, layer.bias, (norm.weight, norm.eps), gated)
    h = linear_ref(rms_norm_ref(x, norm.weight, norm.eps), layer.weight, layer.bias)
    return silu_and_mul_ref(h) if gated else h


def linear_accumulate(x: torch.Tensor, layer: torch.nn.Linear, out: torch.Tensor) -> torch.Tensor:
    """out += layer(x), in place (the residual stream)."""
    if x.is_cuda and layer.bias is None:
        from gearshift.kernels.skinny_select import linear_accumulate as kernel

        return kernel(x, layer.weight, out)
    return out.add_(linear_ref(x, layer.weight, layer.bias))


def linear(x: torch.Tensor, layer: torch.nn.Linear, out: torch.Tensor | None = None) -> torch.Tensor:
    """`layer(x)`; on CUDA with few rows, the skinny Triton GEMM where it measured faster
    than cuBLAS on this GPU (kernels/skinny_select.py). `out` (2-D x, no bias): the
    product's buffer."""
    if x.is_cuda:
        from gearshift.kernels.skinny_select import linear as kernel

        return kernel(x, layer.weight, layer.bias, out)
    return linear_ref(x, layer.weight, layer.bias, out)
