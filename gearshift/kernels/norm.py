"""RMSNorm and residual-add + RMSNorm as one Triton kernel each (decode hot path).

Data flow: models/layers.py -> rms_norm (input / q / k norms) and fused_add_rms_norm
(the residual stream between sublayers) -> the next projection's input.

Semantics are HF Llama's, bit for bit where the arithmetic allows:

    y   = x.float() * rsqrt(mean(x.float() ** 2, -1) + eps)      # fp32
    out = weight * y.to(x.dtype)                                   # cast BEFORE the weight

Rows are addressed through a 3-D view `[A, B, N]` (row r = a * B + b), so a per-head
q/k slice of a fused qkv output (`[T, heads, D]`, token stride = fused width) needs no copy.
One program normalises BLOCK_M rows of next_pow2(N) columns held in registers; the grid
depends only on shapes and nothing syncs with the host, so calls are CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gearshift import env
from gearshift.kernels import pdl
from gearshift.kernels.pdl import pdl_enter
from gearshift.kernels.reference import fused_add_rms_norm_ref, rms_norm_ref  # noqa: F401 (re-exported)

_INTERPRET = env.triton_interpret()
_MAX_COLS = 32768  # one row must fit in one program's registers






@triton.jit
def _rms_norm_kernel(
    X, R, W, Out,
    num_rows, rows_per_group, num_cols, inv_num_cols, eps,
    stride_xa, stride_xb,
    stride_ra, stride_rb,
    stride_oa, stride_ob,
    HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    cols = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    col_mask = cols < num_cols
    mask = (rows < num_rows)[:, None] & col_mask[None, :]
    rows = rows.to(tl.int64)
    group, member = rows // rows_per_group, rows % rows_per_group

    x_ptrs = X + (group * stride_xa + member * stride_xb)[:, None] + cols[None, :]
    x = tl.load(x_ptrs, mask=mask, other=0.0)  # [BLOCK_M, BLOCK_N], input dtype
    if HAS_RESIDUAL:
        r_ptrs = R + (group * stride_ra + member * stride_rb)[:, None] + cols[None, :]
        r = tl.load(r_ptrs, mask=mask, other=0.0)
        # torch `x + residual`: add in fp32, round once to the input dtype.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(R.dtype.element_ty)
        tl.store(r_ptrs, x, mask=mask)

    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=1) * inv_num_cols  # [BLOCK_M]
    y = xf * tl.math.rsqrt(mean_sq + eps)[:, None]
    y = y.to(X.dtype.element_ty).to(tl.float32)  # round to the input dtype before the weight
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)  # [BLOCK_N]
    out = (w[None, :] * y).to(Out.dtype.element_ty)
    o_ptrs = Out + (group * stride_oa + member * stride_ob)[:, None] + cols[None, :]
    tl.store(o_ptrs, out, mask=mask)


def _rows_view(t: torch.Tensor) -> torch.Tensor | None:
    """A view `[A, B, N]` of t with unit column stride, or None when no view exists."""
    if t.dim() == 0 or (t.stride(-1) != 1 and t.shape[-1] > 1):
        return None
    if t.dim() == 1:
        return t.view(1, 1, -1)
    if t.dim() == 2:
        return t.unsqueeze(1)
    try:
        return t.view(-1, t.shape[-2], t.shape[-1])
    except RuntimeError:
        return None


def _launch_config(num_rows: int, num_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): ~2-4K elements a program, several rows when N is small."""
    block_n = triton.next_power_of_2(num_cols)
    if block_n > _MAX_COLS:
        raise ValueError(f"rms_norm supports rows of at most {_MAX_COLS} elements, got {num_cols}")
    block_m = max(1, min(2048 // block_n, triton.next_power_of_2(num_rows)))
    num_warps = 1 if _INTERPRET else min(16, max(1, block_m * block_n // 256))
    return block_m, block_n, num_warps


def _launch(x3: torch.Tensor, r3: torch.Tensor | None, weight: torch.Tensor,
            out3: torch.Tensor, eps: float) -> None:
    num_groups, rows_per_group, num_cols = x3.shape
    num_rows = num_groups * rows_per_group
    if num_rows == 0:
        return
    assert weight.shape == (num_cols,) and weight.is_contiguous(), "weight must be [N], contiguous"
    block_m, block_n, num_warps = _launch_config(num_rows, num_cols)
    r_strides = (r3.stride(0), r3.stride(1)) if r3 is not None else (0, 0)
    _rms_norm_kernel[(triton.cdiv(num_rows, block_m),)](
        x3, r3 if r3 is not None else x3, weight, out3,
        num_rows, rows_per_group, num_cols, 1.0 / num_cols, eps,
        x3.stride(0), x3.stride(1),
        *r_strides,
        out3.stride(0), out3.stride(1),
        HAS_RESIDUAL=r3 is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        PDL=pdl.enabled(x3.device), **pdl.launch_kwargs(x3.device),
        num_warps=num_warps, enable_fp_fusion=False,  # no FMA contraction: match torch eager
    )


def _output_for(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    dtype = torch.promote_types(x.dtype, weight.dtype)  # torch's `weight * y.to(x.dtype)`
    if out is None:
        return torch.empty(x.shape, dtype=dtype, device=x.device)
    assert out.shape == x.shape and out.dtype == dtype, "out must match x's shape and result dtype"
    return out


def rms_norm(
    x: torch.Tensor,  # [..., N] (e.g. [T, hidden] or a [T, heads, head_dim] view)
    weight: torch.Tensor,  # [N]
    eps: float,
    *,
    out: torch.Tensor | None = None,  # [..., N]; may be x itself (in place)
) -> torch.Tensor:
    """RMSNorm over the last dim; returns `out` (freshly allocated when None).

    `out=x` normalises in place (each program reads its rows before writing them).
    x may be a strided view whose leading dims cannot be flattened (q of a fused qkv):
    only the last dim must be contiguous; otherwise x is copied first.
    """
    out = _output_for(x, weight, out)
    x3 = _rows_view(x)
    if x3 is None:
        x3 = _rows_view(x.contiguous())
    out3 = _rows_view(out)
    assert out3 is not None, "out must have a contiguous last dim and viewable leading dims"
    _launch(x3, None, weight, out3, eps)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,  # [..., N] sublayer output
    residual: torch.Tensor,  # [..., N] residual stream, same dtype and shape; UPDATED IN PLACE
    weight: torch.Tensor,  # [N]
    eps: float,
    *,
    out: torch.Tensor | None = None,  # [..., N]; may be x itself
) -> tuple[torch.Tensor, torch.Tensor]:
    """`residual += x` (rounded like torch `x + residual`), then `out = rms_norm(residual)`.

    Returns (out, residual): `residual` is the same tensor that was passed in, now holding
    the new residual. `out` is freshly allocated unless given; `out=x` is safe.
    """
    assert x.shape == residual.shape and x.dtype == residual.dtype, "x and residual must match"
    out = _output_for(x, weight, out)
    assert out.numel() == 0 or out.data_ptr() != residual.data_ptr(), "out would clobber residual"
    x3, r3, out3 = _rows_view(x), _rows_view(residual), _rows_view(out)
    if x3 is None:
        x3 = _rows_view(x.contiguous())
    assert r3 is not None, "residual must have a contiguous last dim (it is written in place)"
    assert out3 is not None, "out must have a contiguous last dim and viewable leading dims"
    _launch(x3, r3, weight, out3, eps)
    return out, residual
