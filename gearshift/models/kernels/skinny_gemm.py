"""`x @ W.T (+ b)` for few rows (decode at small batch, short VERIFY passes): one Triton
program per BLOCK_N output columns, looping over all of K, so every SM streams weights.

Why: at M <= 8, cuBLAS picks 64-row tiles for the 8B shapes' qkv (N = 6144) and o_proj
(N = 4096) projections: 96 and 64 thread blocks on 132 SMs, ~73% of the bandwidth that
the larger gate_up / down projections reach (session 4's profile of a batch-2 VERIFY step).
With BLOCK_N = 16 the same weights make 384 / 256 programs, a few per SM.

Data flow: models/ops.linear -> skinny_select (start-up timing: this kernel or cuBLAS, per
(rows bucket, N, K, dtype)) -> skinny_linear. Accumulates in fp32 (tensor-core dot of a
zero-padded [BLOCK_M, BLOCK_K] x tile with the [BLOCK_N, BLOCK_K] weight tile), rounds once
to the output dtype. No host sync: CUDA-graph safe once compiled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class SkinnyConfig:
    block_m: int = 16
    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4


PLAIN, ADD_NORM, SILU = 0, 1, 2  # what the kernel does to x before the product


@triton.jit
def _x_tile(X, R, G, rows, m_ok, kk, k_ok, stride_xm, stride_rm, K,
            PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, ACCURATE_EXP: tl.constexpr,
            EVEN_K: tl.constexpr):
    """([BLOCK_M, BLOCK_K] tile of the product's input in X's dtype, the tile before any
    scaling: x + residual for the norm's sums of squares and the new residual). SiLU rounds
    as kernels/activation.py; the norm multiplies by its weight before the product and by
    1/rms after it (one pass over K; rounding differs from the unfused ops by an ulp)."""
    if EVEN_K:  # no mask along K: loads stay vectorised
        mask = m_ok[:, None]  # broadcast along K
    else:
        mask = m_ok[:, None] & k_ok[None, :]
    x = tl.load(X + rows[:, None] * stride_xm + kk[None, :], mask=mask, other=0.0)
    s = x
    if PROLOGUE == 1:  # g * (x + residual); the row's rstd scales the product afterwards
        if HAS_RESIDUAL:
            r = tl.load(R + rows[:, None] * stride_rm + kk[None, :], mask=mask, other=0.0)
            s = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        if EVEN_K:
            g = tl.load(G + kk).to(tl.float32)
        else:
            g = tl.load(G + kk, mask=k_ok, other=0.0).to(tl.float32)
        x = (g[None, :] * s.to(tl.float32)).to(X.dtype.element_ty)
    elif PROLOGUE == 2:  # silu(x[:, :K]) * x[:, K:2K]
        up = tl.load(X + rows[:, None] * stride_xm + K + kk[None, :], mask=mask, other=0.0)
        gf = x.to(tl.float32)
        if ACCURATE_EXP:
            e = libdevice.exp(-gf)
        else:
            e = tl.exp(-gf)
        silu = tl.math.div_rn(gf, 1.0 + e).to(X.dtype.element_ty)
        x = (silu.to(tl.float32) * up.to(tl.float32)).to(X.dtype.element_ty)
    return x, s


@triton.jit
def _skinny_gemm_kernel(
    X, W, B, Out, R, G, NewR, M, N, K, eps, stride_xm, stride_wn, stride_om, stride_rm,
    HAS_BIAS: tl.constexpr, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    ACCURATE_EXP: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = rows < M
    n_ok = offs_n < N
    sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < K
        x, s = _x_tile(X, R, G, rows, m_ok, kk, k_ok, stride_xm, stride_rm, K,
                       PROLOGUE, HAS_RESIDUAL, ACCURATE_EXP, EVEN_K)
        if PROLOGUE == 1:
            sf = s.to(tl.float32)
            sq += tl.sum(sf * sf, axis=1)
            if HAS_RESIDUAL:
                if pid == 0:  # the new residual stream, written once
                    tl.store(NewR + rows[:, None] * stride_rm + kk[None, :], s,
                             mask=m_ok[:, None] & k_ok[None, :])
        if EVEN_K:
            w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        else:
            w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        w_ptrs += BLOCK_K
    if PROLOGUE == 1:  # rms_norm(s) . g . W = rstd * ((g * s) . W), row by row
        acc = acc * tl.math.rsqrt(sq / K + eps)[:, None]
    if HAS_BIAS:
        acc += tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out_ptrs = Out + rows[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def skinny_linear(
    x: torch.Tensor,  # [M, K], unit stride over K
    weight: torch.Tensor,  # [N, K], unit stride over K
    bias: torch.Tensor | None = None,  # [N]
    *,
    config: SkinnyConfig = SkinnyConfig(),
    out: torch.Tensor | None = None,  # [M, N]
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for M <= config.block_m rows."""
    return _launch(x, weight, bias, config, out, PLAIN)


def skinny_add_norm_linear(
    x: torch.Tensor,  # [M, K]: the sublayer output
    residual: torch.Tensor | None,  # [M, K]: the residual stream before it (None: x is it)
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,
    *,
    config: SkinnyConfig = SkinnyConfig(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """(F.linear(rms_norm(x + residual) * norm_weight, weight, bias), x + residual): the
    residual add, RMSNorm and the projection in one launch (kernels/norm.py's rounding).
    The new residual is a new tensor (program 0 writes it; the others still read the old)."""
    new_res = torch.empty_like(x) if residual is not None else x
    out = _launch(x, weight, bias, config, None, ADD_NORM, residual=residual,
                  norm_weight=norm_weight, eps=eps, new_residual=new_res)
    return out, new_res


def skinny_silu_linear(
    gate_up: torch.Tensor,  # [M, 2K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,
    *,
    config: SkinnyConfig = SkinnyConfig(),
) -> torch.Tensor:
    """F.linear(silu(gate_up[:, :K]) * gate_up[:, K:], weight, bias) in one launch."""
    return _launch(gate_up, weight, bias, config, None, SILU)


def _launch(x, weight, bias, config, out, prologue, *, residual=None, norm_weight=None,
            eps=0.0, new_residual=None) -> torch.Tensor:
    m = x.shape[0]
    n, k = weight.shape
    assert x.shape[1] == (2 * k if prologue == SILU else k), "x and weight disagree on K"
    assert x.stride(-1) == 1 and weight.stride(-1) == 1
    assert m <= config.block_m, f"skinny_linear takes at most {config.block_m} rows, got {m}"
    if residual is not None:
        assert residual.shape == x.shape and residual.stride() == x.stride()
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    _skinny_gemm_kernel[(triton.cdiv(n, config.block_n),)](
        x, weight, bias if bias is not None else weight, out,
        residual if residual is not None else x,
        norm_weight if norm_weight is not None else weight,
        new_residual if new_residual is not None else x,
        m, n, k, eps, x.stride(0), weight.stride(0), out.stride(0),
        residual.stride(0) if residual is not None else x.stride(0),
        HAS_BIAS=bias is not None, PROLOGUE=prologue, HAS_RESIDUAL=residual is not None,
        ACCURATE_EXP=x.is_cuda and not _INTERPRET, EVEN_K=k % config.block_k == 0,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=1 if _INTERPRET else config.num_warps,
        num_stages=1 if _INTERPRET else config.num_stages,
    )
    return out
