"""`x @ W.T (+ b)` for few rows (decode at small batch, short VERIFY passes): one Triton
program per BLOCK_N output columns, looping over all of K, so every SM streams weights.

Why: at M <= 8, cuBLAS picks 64-row tiles for the 8B shapes' qkv (N = 6144) and o_proj
(N = 4096) projections: 96 and 64 thread blocks on 132 SMs, ~73% of the bandwidth that
the larger gate_up / down projections reach (session 4's profile of a batch-2 VERIFY step).
With BLOCK_N = 16 the same weights make 384 / 256 programs, a few per SM. Measured on
the H200 (session 5, graph-timed), the gain is small: the chooser keeps cuBLAS except for
o_proj at 1-2 rows (12.2 vs 13.0 us).

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

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class SkinnyConfig:
    block_m: int = 16
    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4


@triton.jit
def _skinny_gemm_kernel(
    X, W, B, Out, M, N, K, stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # row blocks vary fastest, so the programs that share a weight tile run together (L2)
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    offs_m = (pid % num_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid // num_m) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    x_ptrs = X + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + offs_k) < K
            x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out_ptrs = Out + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def skinny_linear(
    x: torch.Tensor,  # [M, K], unit stride over K
    weight: torch.Tensor,  # [N, K], unit stride over K
    bias: torch.Tensor | None = None,  # [N]
    *,
    config: SkinnyConfig = SkinnyConfig(),
    out: torch.Tensor | None = None,  # [M, N]
) -> torch.Tensor:
    """`F.linear(x, weight, bias)`: one program per (config.block_m rows, block_n columns)
    tile (the serving chooser uses one row block: M <= block_m)."""
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and x.stride(-1) == 1 and weight.stride(-1) == 1
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    _skinny_gemm_kernel[(triton.cdiv(n, config.block_n) * triton.cdiv(m, config.block_m),)](
        x, weight, bias if bias is not None else weight, out, m, n, k,
        x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % config.block_k == 0,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=1 if _INTERPRET else config.num_warps,
        num_stages=1 if _INTERPRET else config.num_stages,
    )
    return out
