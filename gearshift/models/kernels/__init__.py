"""Fused Triton kernels for the model's elementwise/normalisation hot path, each with the
plain-torch reference it must match (use the references on CPU).

Data flow: models/layers.py -> rms_norm / fused_add_rms_norm (norms and residual stream),
apply_rope (q/k in place inside the fused qkv buffer), silu_and_mul (gated MLP).
"""

from __future__ import annotations

from gearshift.models.kernels.activation import silu_and_mul, silu_and_mul_ref
from gearshift.models.kernels.norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)
from gearshift.models.kernels.rope import apply_rope, apply_rope_ref

__all__ = [
    "apply_rope",
    "apply_rope_ref",
    "fused_add_rms_norm",
    "fused_add_rms_norm_ref",
    "rms_norm",
    "rms_norm_ref",
    "silu_and_mul",
    "silu_and_mul_ref",
]
