"""Decode attention (one query token per request) over the slot pool, split-K in Triton.

Data flow: TritonBackend.decode / rope_store_attend -> decode_attention -> stage 1
(partial softmax per KV split, into a persistent fp32 workspace) -> stage 2 (a second
launch merges the splits into `out`).

Each request's keys 0..seq_len-1 are read through req_to_token[row, position] -> slot.
The grid is (batch, kv_heads, num_kv_splits): it depends only on host ints, and the
kernels never sync with the host, so the call can be captured in a CUDA graph. The
split length is computed on the device from seq_len (rounded up to whole KV blocks);
splits past the end of a short sequence store nothing and are skipped by the merge. With
one split (large batches) stage 1 writes `out` directly and the merge launch is saved.

    keys of one request  [ split 0 | split 1 | split 2 | (empty) ]   num_kv_splits = 4
    workspace[b, h, s]   [ acc_s / l_s  (head_dim floats) | lse_s (log2 domain) | pad ]

One stage-1 program handles every query head of one KV group, so each K/V block is
loaded once per group (GQA), with the heads as the M side of a tl.dot.

RoPE inside (`rope=RopeInputs(...)`, the DECODE step on the Triton backend): q and this
step's k arrive unrotated from the qkv projection, so the step needs no RoPE + K/V store
launch of its own. Every split program rotates its group's q (fp32, rounded to q's dtype,
as the RoPE kernel does). The split holding position seq_len - 1 (the new token) rotates
k, stores k and v at out_cache_loc, and attends to that key from registers; the loop
stops one key short. No program reads the new slot, so no ordering between programs is
needed. Other paths (extend, VERIFY, trees, callers with rotated q) keep kernels/rope.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gearshift import env
from gearshift.kernels import pdl
from gearshift.kernels.pdl import pdl_enter, pdl_trigger, pdl_wait

_INTERPRET = env.triton_interpret()
_LOG2E = 1.4426950408889634


@triton.jit
def _merge_head(
    w_head, o_head,  # this (request, head)'s workspace row at split 0; its output row
    seq_len, split_len, stride_ws,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """o_head = the lse-weighted mean of the non-empty splits' partials (zeros if none)."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    valid = (offs_s < NUM_SPLITS) & (offs_s * split_len < seq_len)  # [BLOCK_S]
    mask_d = offs_d < HEAD_DIM

    w_ptrs = w_head + offs_s * stride_ws  # [BLOCK_S]
    # .cg: the partials come from other programs; read them at L2, never from L1
    lse = tl.load(w_ptrs + HEAD_DIM, mask=valid, other=float("-inf"), cache_modifier=".cg")
    part = tl.load(w_ptrs[:, None] + offs_d[None, :], mask=valid[:, None] & mask_d[None, :],
                   other=0.0, cache_modifier=".cg")  # [BLOCK_S, BLOCK_D]
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # seq_len 0: all splits empty, output zeros
    w = tl.where(valid, tl.exp2(lse - m), 0.0)
    denom = tl.maximum(tl.sum(w, 0), 1e-30)
    out = tl.sum(part * w[:, None], 0) / denom  # [BLOCK_D]
    tl.store(o_head + offs_d, out.to(o_head.dtype.element_ty), mask=mask_d)


@triton.jit
def _rotate(x, x_sw, cos, sin):
    """Neox RoPE of x given x_sw (x with its halves swapped) and the signed sin (-sin on the
    first half), in fp32, rounded back to x's dtype as the RoPE kernel rounds."""
    return (x.to(tl.float32) * cos + x_sw.to(tl.float32) * sin).to(x.dtype)


@triton.jit
def _decode_split_kernel(
    Q, K, V, ReqToToken, ReqPoolIdx, SeqLens, Work, Out,
    KNew, VNew, Positions, Cos, Sin, OutCacheLoc,  # ROPE only (else any tensors)
    sm_scale_log2,
    stride_qb, stride_qh,
    stride_knb, stride_knh, stride_vnb, stride_vnh, stride_cos,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_rt,
    stride_wb, stride_wh, stride_ws,
    stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PDL: tl.constexpr, ROPE: tl.constexpr,
):
    # ROPE (see "RoPE inside" in the module docstring): q and this step's k arrive
    # unrotated; the split holding the last position stores rotated k and v at
    # OutCacheLoc[b] and attends to that key from registers, the loop reads the rest.
    pdl_wait(PDL)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(SeqLens + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    if ROPE:  # the new key (position seq_len - 1) comes from registers, not the loop
        owner = (seq_len > 0) & (split == (seq_len - 1) // tl.maximum(split_len, 1))
        end = tl.minimum(end, seq_len - 1)
        nonempty = (start < end) | owner
    else:
        nonempty = start < end  # an empty split (past a short sequence) runs no loop, stores nothing
    row = tl.load(ReqPoolIdx + b).to(tl.int64)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_h = offs_h < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h  # [BLOCK_H] query heads of this KV group

    q_ptrs = Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_h[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]
    if ROPE:
        half: tl.constexpr = HEAD_DIM // 2
        first = offs_d < half
        swap = tl.where(first, offs_d + half, offs_d - half)  # the other half's element
        sin_sign = tl.where(first, -1.0, 1.0)
        table = tl.load(Positions + b).to(tl.int64) * stride_cos + offs_d % half
        cos = tl.load(Cos + table, mask=mask_d, other=0.0)  # [BLOCK_D] fp32, halves repeated
        sin = tl.load(Sin + table, mask=mask_d, other=0.0) * sin_sign
        q_sw = tl.load(q_ptrs + (swap - offs_d)[None, :], mask=mask_h[:, None] & mask_d[None, :],
                       other=0.0)
        q = _rotate(q, q_sw, cos[None, :], sin[None, :])

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        mask_n = pos < end
        slots = tl.load(ReqToToken + row * stride_rt + pos, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(K + slots[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        v = tl.load(V + slots[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_H, BLOCK_N]
        s = s * sm_scale_log2
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    pdl_trigger(PDL)
    if ROPE:  # this step's key: rotated, stored by the owner split, attended from registers
        kn_ptrs = KNew + b * stride_knb + kv_head * stride_knh + offs_d
        k_new = _rotate(tl.load(kn_ptrs, mask=mask_d, other=0.0),
                        tl.load(kn_ptrs + (swap - offs_d), mask=mask_d, other=0.0), cos, sin)
        v_new = tl.load(VNew + b * stride_vnb + kv_head * stride_vnh + offs_d, mask=mask_d,
                        other=0.0)
        slot = tl.load(OutCacheLoc + b).to(tl.int64)
        own_d = offs_d < tl.where(owner, HEAD_DIM, 0)  # [BLOCK_D] all of head_dim, or none
        tl.store(K + slot * stride_ks + kv_head * stride_kh + offs_d, k_new, mask=own_d)
        tl.store(V + slot * stride_vs + kv_head * stride_vh + offs_d, v_new, mask=own_d)
        s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], 1) * sm_scale_log2
        m_new = tl.where(owner, tl.maximum(m_i, s_new), m_i)  # [BLOCK_H]
        # other splits keep their state: alpha 1, p 0 (no -inf - -inf on the way)
        alpha = tl.exp2(tl.where(owner, m_i - tl.where(owner, m_new, 0.0), 0.0))
        p_new = tl.exp2(tl.where(owner, s_new - m_new, float("-inf")))
        l_i = l_i * alpha + p_new
        acc = acc * alpha[:, None] + (p_new.to(v_new.dtype).to(tl.float32)[:, None]
                                      * v_new.to(tl.float32)[None, :])
        m_i = m_new

    l_i = tl.where(nonempty, l_i, 1.0)  # >= 1 when non-empty; keeps an empty split finite
    if NUM_SPLITS == 1:  # the one split is the answer (zeros for seq_len 0): no merge
        o_ptrs = Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, (acc / l_i[:, None]).to(Out.dtype.element_ty),
                 mask=mask_h[:, None] & mask_d[None, :])
    else:
        w_ptrs = Work + b * stride_wb + heads * stride_wh + split * stride_ws  # [BLOCK_H]
        store_h = offs_h < tl.where(nonempty, GROUP, 0)  # [BLOCK_H] the group's heads, or none
        tl.store(w_ptrs[:, None] + offs_d[None, :], acc / l_i[:, None],
                 mask=store_h[:, None] & mask_d[None, :])
        tl.store(w_ptrs + HEAD_DIM, m_i + tl.log2(l_i), mask=store_h)


@triton.jit
def _decode_merge_kernel(
    Work, SeqLens, Out,
    stride_wb, stride_wh, stride_ws,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    b = tl.program_id(0)
    head = tl.program_id(1)

    seq_len = tl.load(SeqLens + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    _merge_head(Work + b * stride_wb + head * stride_wh, Out + b * stride_ob + head * stride_oh,
                seq_len, split_len, stride_ws, HEAD_DIM, NUM_SPLITS, BLOCK_S, BLOCK_D)


@dataclass(frozen=True)
class RopeInputs:
    """What decode_attention needs to rotate q and k itself and store this step's K/V
    (one per request: decode has one token a request)."""

    k: torch.Tensor  # [bs, num_kv_heads, head_dim] unrotated, unit stride over head_dim
    v: torch.Tensor  # [bs, num_kv_heads, head_dim]
    positions: torch.Tensor  # [bs] int: the token's position (seq_len - 1)
    cos: torch.Tensor  # [max_pos, head_dim / 2] fp32 (RotaryEmbedding's table)
    sin: torch.Tensor  # [max_pos, head_dim / 2] fp32, same strides as cos
    out_cache_loc: torch.Tensor  # [bs] int: the slot this step's K/V go to

    def check(self, q: torch.Tensor, k_cache: torch.Tensor) -> None:
        bs, _, head_dim = q.shape
        assert self.k.shape == self.v.shape == (bs, k_cache.shape[1], head_dim)
        assert self.k.dtype == self.v.dtype == k_cache.dtype
        assert self.k.stride(2) == 1 and self.v.stride(2) == 1 and head_dim % 2 == 0
        assert self.cos.dtype == self.sin.dtype == torch.float32
        assert self.cos.shape[1] == head_dim // 2 and self.cos.stride() == self.sin.stride()
        assert self.cos.stride(1) == 1
        assert self.positions.shape == self.out_cache_loc.shape == (bs,)


@functools.cache
def num_sms(device: torch.device | str) -> int:
    """Streaming multiprocessors of a CUDA device (elsewhere a nominal 132, an H100's / H200's)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def pick_num_kv_splits(batch_size: int, num_kv_heads: int, sm_count: int = 132,
                       max_kv_splits: int = 32) -> int:
    """KV splits for a (padded) batch size: the most, a power of two, that keep stage 1
    within ~2 waves (2 * sm_count programs), at least one.

    Depends only on host ints, so a CUDA graph captured for one batch size keeps its grid.
    Measured with benchmarks/bench_decode_attn.py, this picks the fastest count (or one
    within noise) at every batch bucket; a ~4-wave rule split twice as often and was
    slower at large batches.
    """
    fit = 2 * sm_count // max(batch_size * num_kv_heads, 1)
    return max(1, min(max_kv_splits, 1 << max(fit, 1).bit_length() - 1))


def decode_blocks(batch_size: int, num_kv_heads: int, num_kv_splits: int,
                  sm_count: int = 132) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) of stage 1, from host ints (graph-safe).

    128 keys a block where splits are few (<= 8, so a split is long enough to fill them at
    short contexts) and the grid fits in ~2 waves; else 64 (many splits leave few keys a
    split, and past ~2 waves the larger block was slower). One split over more than ~2
    waves (large batches) runs 2 warps a program, which measured a little faster than 4
    (benchmarks/bench_decode_attn.py).
    """
    if _INTERPRET:
        return 16, 1, 1
    if num_kv_splits <= 8 and batch_size * num_kv_heads * num_kv_splits <= 2 * sm_count:
        return 128, 4, 2
    return (64, 2, 2) if num_kv_splits == 1 else (64, 4, 2)


def workspace_row(head_dim: int) -> int:
    """Floats per (request, head, split) of the workspace: head_dim partial outputs, the
    lse at index head_dim, padded to a multiple of 16 so that rows stay aligned."""
    return (head_dim + 1 + 15) // 16 * 16


def alloc_decode_workspace(batch_size: int, num_heads: int, head_dim: int, num_kv_splits: int,
                           device: torch.device | str) -> torch.Tensor:
    """Scratch for stage 1: [bs, num_heads, num_kv_splits, workspace_row(head_dim)] fp32."""
    return torch.empty(batch_size, num_heads, num_kv_splits, workspace_row(head_dim),
                       dtype=torch.float32, device=device)


def decode_attention(
    q: torch.Tensor,  # [bs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,  # [max_num_seqs + 1, max_model_len] int32
    req_pool_indices: torch.Tensor,  # [bs] int: row of req_to_token per request
    seq_lens: torch.Tensor,  # [bs] int: keys to attend (including this step's token)
    sm_scale: float,
    out: torch.Tensor,  # [bs, num_heads, head_dim], written in place
    *,
    num_kv_splits: int = 8,
    workspace: torch.Tensor | None = None,  # [>= bs, num_heads, >= splits, >= head_dim+1]
    blocks: tuple[int, int, int] | None = None,  # stage 1 (BLOCK_N, warps, stages); None: default
    rope: RopeInputs | None = None,  # q and this step's k unrotated: see RopeInputs
) -> torch.Tensor:
    """Attention of one new query per request over its cached keys; returns `out`.

    Pass a persistent `workspace` (see alloc_decode_workspace) to stay CUDA-graph safe;
    without it a fresh one is allocated. With `rope`, q is unrotated and this
    step's K/V are not in the cache yet: the kernel rotates q and k and stores k and v
    (module docstring, "RoPE inside").
    """
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert q.stride(2) == 1 and k_cache.stride(2) == 1 and v_cache.stride(2) == 1
    assert out.stride(2) == 1 and req_to_token.stride(1) == 1
    if workspace is None:
        workspace = alloc_decode_workspace(bs, num_heads, head_dim, num_kv_splits, q.device)
    assert workspace.dtype == torch.float32 and workspace.stride(3) == 1
    assert workspace.shape[0] >= bs and workspace.shape[1] == num_heads
    assert workspace.shape[2] >= num_kv_splits and workspace.shape[3] >= head_dim + 1
    if bs == 0:
        return out

    group = num_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    block_h = max(16, triton.next_power_of_2(group))  # tl.dot needs M >= 16
    block_s = triton.next_power_of_2(num_kv_splits)
    block_n, num_warps, num_stages = blocks or decode_blocks(  # blocks: for tuning benches
        bs, num_kv_heads, num_kv_splits, num_sms(q.device))
    # per-request scalars are read at unit stride: materialise expanded views
    req_pool_indices, seq_lens = req_pool_indices.contiguous(), seq_lens.contiguous()
    use_pdl, launch = pdl.enabled(q.device), pdl.launch_kwargs(q.device)
    if rope is not None:
        rope.check(q, k_cache)
    r = rope or RopeInputs(q, q, seq_lens, seq_lens, seq_lens, seq_lens)  # unused stand-ins
    _decode_split_kernel[(bs, num_kv_heads, num_kv_splits)](
        q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, workspace, out,
        r.k, r.v, r.positions.contiguous(), r.cos, r.sin, r.out_cache_loc.contiguous(),
        sm_scale * _LOG2E,
        q.stride(0), q.stride(1),
        r.k.stride(0), r.k.stride(1), r.v.stride(0), r.v.stride(1), r.cos.stride(0),
        k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        req_to_token.stride(0),
        workspace.stride(0), workspace.stride(1), workspace.stride(2),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, NUM_SPLITS=num_kv_splits,
        BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=block_n,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32: exact, no TF32
        PDL=use_pdl, ROPE=rope is not None, num_warps=num_warps, num_stages=num_stages,
        **launch,
    )
    if num_kv_splits == 1:  # stage 1 wrote `out` itself
        return out
    _decode_merge_kernel[(bs, num_heads)](
        workspace, seq_lens, out,
        workspace.stride(0), workspace.stride(1), workspace.stride(2),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, NUM_SPLITS=num_kv_splits,
        BLOCK_S=block_s, BLOCK_D=block_d, BLOCK_N=block_n,
        PDL=use_pdl, num_warps=4 if block_d >= 128 else 2, num_stages=1, **launch,
    )
    return out
