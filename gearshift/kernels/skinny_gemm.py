"""`x @ W.T (+ b)` for few rows (decode at small batch, short VERIFY passes): one Triton
program per BLOCK_N output columns, looping over all of K, so every SM streams weights.

Why: at few rows, cuBLAS picks 64-row tiles for the 8B shapes' qkv (N = 6144) and o_proj
(N = 4096) projections: 96 and 64 thread blocks on 132 SMs, well short of the bandwidth
that the larger gate_up / down projections reach. With BLOCK_N = 16 the same weights make
384 / 256 programs, a few per SM. Alone, the plain product gains little over cuBLAS; the
fusions below are where it wins, so skinny_select measures every shape and takes the
kernel only where it is faster.

`gated` fuses the MLP's SiLU-and-mul after gate_up: each program streams the gate and the
up rows of its columns into two accumulators and writes silu(gate) * up, so the
activation needs no launch (and no [M, 2I] round trip) of its own (ahead of cuBLAS + the
SiLU kernel at 64 rows, behind at fewer). The RMSNorm before the product is fused only in
the TMA kernel (`rms`, below): in the pointer kernel any elementwise work on x inside the
K loop made it several times slower.

`tma` configs (Hopper and later) run the same tile loop with x and W read through host
tensor descriptors: each stage is one bulk copy into shared memory, so stages cost no
registers and out-of-range rows / K read as zero (no masks); at 64 rows they measured
ahead of cuBLAS and the pointer kernel on the 8B's qkv, o_proj and down, while deeper
pointer pipelines (6 stages) led at one row. An x the descriptor cannot address (a base
or row stride not 16-byte aligned) runs the pointer kernel with the same tiles. `rms`: x
is the residual stream and W holds the norm weight (LlamaForCausalLM.fold_norms); each
row's rstd comes from the x tiles in shared memory and scales the accumulators.
`accumulate`: out += the product.

Data flow: models/ops.linear / gated_linear / rms_linear / linear_accumulate ->
skinny_select (start-up timing: this kernel or its cuBLAS form, per (rows bucket, N, K,
dtype, bias, kind)) -> skinny_linear. Accumulates in fp32 (tensor-core dot of a
zero-padded [BLOCK_M, BLOCK_K] x tile with the [BLOCK_N, BLOCK_K] weight tile), rounds
once to the output dtype. No host sync: CUDA-graph safe once compiled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.4: host-side TMA descriptors
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: tma configs run the pointer kernel
    TensorDescriptor = None

from gearshift import env
from gearshift.kernels import pdl
from gearshift.kernels.norm import rms_norm
from gearshift.kernels.pdl import pdl_trigger, pdl_wait, prefetch_rows_l2

_INTERPRET = env.triton_interpret()
# weight columns prefetched into L2 before the PDL wait, in pipeline stages (BLOCK_K
# columns each): what the first stages of the K loop load
PDL_PREFETCH_STAGES = 2


@dataclass(frozen=True)
class SkinnyConfig:
    block_m: int = 16
    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4
    tma: bool = False  # x and W through tensor descriptors (see the module docstring)


@triton.jit
def _enter(W, offs_n, N, stride_wn, GATED: tl.constexpr, PDL: tl.constexpr,
           PREFETCH: tl.constexpr, LINE: tl.constexpr):
    """Under PDL (kernels/pdl.py): ask L2 for the first PREFETCH columns of this program's
    weight rows (the gate and the up rows when GATED) while the kernel before may still
    run, then wait for it (the next kernel is let in after the K loop: pdl_trigger)."""
    if PDL and PREFETCH > 0:
        rows = tl.minimum(offs_n, N - 1)
        prefetch_rows_l2(W, rows, stride_wn, PREFETCH, LINE)
        if GATED:
            prefetch_rows_l2(W, rows + N, stride_wn, PREFETCH, LINE)
    pdl_wait(PDL)


@triton.jit
def _skinny_gemm_kernel(
    X, W, B, Out, M, N, K, stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, GATED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ACCUMULATE: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr, LINE: tl.constexpr,
):
    # GATED: W is [gate; up] ([2N, K]) and out = silu(x @ gate.T) * (x @ up.T): each program
    # streams the gate and the up rows of its columns.
    # Row blocks vary fastest, so the programs that share a weight tile run together (L2).
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    offs_m = (pid % num_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid // num_m) * BLOCK_N + tl.arange(0, BLOCK_N)
    _enter(W, offs_n, N, stride_wn, GATED, PDL, PREFETCH, LINE)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    x_ptrs = X + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    up_ptrs = w_ptrs + N.to(tl.int64) * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
            if GATED:
                u = tl.load(up_ptrs, mask=n_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + offs_k) < K
            x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            if GATED:
                u = tl.load(up_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        if GATED:
            acc_up = tl.dot(x, tl.trans(u), acc_up)
            up_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    pdl_trigger(PDL)
    if HAS_BIAS:
        acc += tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    out_ptrs = Out + offs_m[:, None] * stride_om + offs_n[None, :]
    if ACCUMULATE:  # out += x @ W.T (the residual stream): add in fp32, round once
        acc += tl.load(out_ptrs, mask=m_ok[:, None] & n_ok[None, :], other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _skinny_tma_kernel(
    x_desc, w_desc, B, Out, M, N, K, stride_om, eps,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, RMS: tl.constexpr, ACCUMULATE: tl.constexpr,
    W, stride_wn, PDL: tl.constexpr, PREFETCH: tl.constexpr, LINE: tl.constexpr,
):
    # Row blocks vary fastest (programs sharing a weight tile run together); rows past M
    # and K past the end read as zero. GATED: W is [gate; up]; the up rows of these
    # columns start at row N.
    # RMS: x is the residual stream and W holds the RMSNorm weight folded in, so
    # rms_norm(x) @ W.T = rstd * (x @ W.T), rstd from each row's squares, summed from the
    # x tiles the dot streams anyway (elementwise, reduced once after the loop).
    # ACCUMULATE: out += x @ W.T (the residual stream).
    num_m = tl.cdiv(M, BLOCK_M)
    off_m = (tl.program_id(0) % num_m) * BLOCK_M
    off_n = (tl.program_id(0) // num_m) * BLOCK_N
    _enter(W, off_n + tl.arange(0, BLOCK_N), N, stride_wn, GATED, PDL, PREFETCH, LINE)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sq = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        x = x_desc.load([off_m, k0])  # [BLOCK_M, BLOCK_K]
        acc = tl.dot(x, tl.trans(w_desc.load([off_n, k0])), acc)
        if GATED:
            acc_up = tl.dot(x, tl.trans(w_desc.load([N + off_n, k0])), acc_up)
        if RMS:
            xf = x.to(tl.float32)
            sq += xf * xf
    pdl_trigger(PDL)
    tile_epilogue(acc, acc_up, tl.sum(sq, 1), off_m, off_n, M, N, K, B, Out, stride_om, eps,
                  HAS_BIAS, GATED, RMS, ACCUMULATE, BLOCK_M, BLOCK_N)


@triton.jit
def tile_epilogue(acc, acc_up, sq_rows, off_m, off_n, M, N, K, B, Out, stride_om, eps,
                  HAS_BIAS: tl.constexpr, GATED: tl.constexpr, RMS: tl.constexpr,
                  ACCUMULATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A TMA tile's output from its fp32 sums over all of K: the norm's rstd (RMS; sq_rows:
    each row's sum of squares of x), the bias, SiLU-and-mul (GATED), + out (ACCUMULATE),
    rounded once."""
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    mask = (offs_m[:, None] < M) & n_ok[None, :]
    if RMS:
        rstd = 1.0 / tl.sqrt(sq_rows / K + eps)
        acc = acc * rstd[:, None]
        acc_up = acc_up * rstd[:, None]
    if HAS_BIAS:
        acc += tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    out_ptrs = Out + offs_m[:, None] * stride_om + offs_n[None, :]
    if ACCUMULATE:
        acc += tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=mask)


def tma_ready(*tensors: torch.Tensor) -> bool:
    """Can tensor descriptors address these 2-D row-major tensors (Triton has them; base
    and row stride 16-byte aligned)?"""
    return TensorDescriptor is not None and all(
        t.dim() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0
        and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors)


def skinny_linear(
    x: torch.Tensor,  # [M, K], unit stride over K
    weight: torch.Tensor,  # [N, K] ([2N, K]: gate; up when gated), unit stride over K
    bias: torch.Tensor | None = None,  # [N]
    *,
    config: SkinnyConfig = SkinnyConfig(),
    out: torch.Tensor | None = None,  # [M, N]
    gated: bool = False,
    rms: tuple[torch.Tensor, float] | None = None,  # (unit norm weight [K], eps)
    accumulate: bool = False,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)`: one program per (config.block_m rows, block_n columns)
    tile (the serving chooser uses one row block: M <= block_m). `gated`: the MLP's
    silu_and_mul(F.linear(x, weight)) in the same launch (no bias). `rms`: x is the
    residual stream and `weight` holds the RMSNorm weight folded in (LlamaForCausalLM.
    fold_norms; the norm's own weight is then ones): the product of rms_norm(x) (tma
    configs in one launch, otherwise the norm kernel first). `accumulate`: `out` += the
    product (the residual stream, in place)."""
    m, k = x.shape
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    assert weight.shape[1] == k and x.stride(-1) == 1 and weight.stride(-1) == 1
    assert not (gated and bias is not None), "the gated product takes no bias"
    assert out is not None or not accumulate, "accumulate adds into `out`"
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    tma = config.tma and tma_ready(x, weight)
    if rms is not None and not tma:  # the norm in its own launch
        x = rms_norm(x, *rms)
    use_pdl, line = pdl.enabled(x.device), 128 // weight.element_size()
    # weight columns prefetched under PDL (a power of two, at least a line, at most K)
    prefetch = _pow2_floor(min(k, PDL_PREFETCH_STAGES * config.block_k)) if use_pdl else 0
    prefetch = prefetch if prefetch >= line else 0
    launch = pdl.launch_kwargs(x.device)
    if tma:
        args = (TensorDescriptor.from_tensor(x, [config.block_m, config.block_k]),
                TensorDescriptor.from_tensor(weight, [config.block_n, config.block_k]),
                bias if bias is not None else weight, out, m, n, k, out.stride(0),
                0.0 if rms is None else rms[1])
        consts = dict(
            HAS_BIAS=bias is not None, GATED=gated,
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            NUM_STAGES=1 if _INTERPRET else config.num_stages,
            RMS=rms is not None, ACCUMULATE=accumulate,
            W=weight, stride_wn=weight.stride(0), PDL=use_pdl, PREFETCH=prefetch, LINE=line,
            num_warps=1 if _INTERPRET else config.num_warps, **launch,
        )
        _skinny_tma_kernel[(triton.cdiv(n, config.block_n) * triton.cdiv(m, config.block_m),)](
            *args, **consts)
        return out
    _skinny_gemm_kernel[(triton.cdiv(n, config.block_n) * triton.cdiv(m, config.block_m),)](
        x, weight, bias if bias is not None else weight, out, m, n, k,
        x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % config.block_k == 0, GATED=gated,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        ACCUMULATE=accumulate, PDL=use_pdl, PREFETCH=prefetch, LINE=line,
        num_warps=1 if _INTERPRET else config.num_warps,
        num_stages=1 if _INTERPRET else config.num_stages, **launch,
    )
    return out


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0
