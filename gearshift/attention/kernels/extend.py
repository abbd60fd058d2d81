"""Extend (prefill chunk) attention over the slot pool: causal flash attention in Triton.

Data flow: TritonBackend.extend -> extend_attention -> out. The backend has already
stored this step's K/V at out_cache_loc, so every key (cached prefix and new tokens) is
read through req_to_token[row, position] -> slot.

Queries are packed request after request (see forward_batch.py). Query i of request b
sits at absolute position prefix_b + i, prefix_b = seq_len_b - extend_len_b, and sees
keys 0..prefix_b + i of its own request:

    keys      0 .. prefix-1 | prefix .. seq_len-1
    query 0   x  x  x  x  x | x
    query 1   x  x  x  x  x | x  x
    query 2   x  x  x  x  x | x  x  x

Grid: (batch, num_heads, cdiv(max_extend_len, BLOCK_M)); blocks past a request's
extend_len exit at once. Online softmax in the log2 domain, fp32 accumulators.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_LOG2E = 1.4426950408889634


@triton.jit
def _extend_kernel(
    Q, K, V, Out, ReqToToken, ReqPoolIdx, SeqLens, ExtendLens, ExtendStart,
    sm_scale_log2,
    stride_qt, stride_qh,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_ot, stride_oh,
    stride_rt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    m_start = tl.program_id(2) * BLOCK_M

    extend_len = tl.load(ExtendLens + b)
    if m_start >= extend_len:
        return
    seq_len = tl.load(SeqLens + b)
    prefix = seq_len - extend_len
    q_start = tl.load(ExtendStart + b).to(tl.int64)
    row = tl.load(ReqPoolIdx + b).to(tl.int64)
    kv_head = head // GROUP

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < extend_len
    mask_d = offs_d < HEAD_DIM
    tokens = q_start + offs_m  # [BLOCK_M] rows of q / out
    q = tl.load(Q + tokens[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    q_pos = prefix + offs_m  # [BLOCK_M] absolute positions

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    kv_end = tl.minimum(seq_len, prefix + m_start + BLOCK_M)  # last query of the block + 1
    for n0 in range(0, kv_end, BLOCK_N):
        pos = n0 + offs_n  # [BLOCK_N]
        mask_n = pos < kv_end
        slots = tl.load(ReqToToken + row * stride_rt + pos, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(K + slots[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        v = tl.load(V + slots[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        s = s * sm_scale_log2
        visible = (pos[None, :] <= q_pos[:, None]) & mask_n[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_i = tl.where(mask_m, l_i, 1.0)  # rows past extend_len are never stored
    out = acc / l_i[:, None]
    tl.store(Out + tokens[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


@functools.cache
def _device_info(index: int) -> tuple[int, int]:
    """(SM count, compute capability major) of a CUDA device."""
    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count, props.major


def _extend_blocks(q: torch.Tensor, bs: int, max_extend_len: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for this call (host ints only)."""
    if _INTERPRET:
        return 16, 16, 1, 1
    head_dim = q.shape[2]
    if q.dtype == torch.float32 or head_dim > 128:
        return 32, 32, 4, 2
    big_m_programs = bs * q.shape[1] * triton.cdiv(max_extend_len, 128)
    sm_count, major = _device_info(q.device.index or 0)
    if major >= 9 and big_m_programs >= 2 * sm_count:
        return 128, 64, 8, 2
    return 64, 64, 4, 2


def extend_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,  # [max_num_seqs + 1, max_model_len] int32
    req_pool_indices: torch.Tensor,  # [bs] int: row of req_to_token per request
    seq_lens: torch.Tensor,  # [bs] int: prefix + extend
    extend_lens: torch.Tensor,  # [bs] int: new tokens of each request
    extend_start_loc: torch.Tensor,  # [bs] int: first row of each request in q
    sm_scale: float,
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim], written in place
    *,
    max_extend_len: int,  # host int: max(extend_lens), sizes the grid
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its prefix and themselves."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    bs = req_pool_indices.shape[0]
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert q.stride(2) == 1 and k_cache.stride(2) == 1 and v_cache.stride(2) == 1
    assert out.stride(2) == 1 and req_to_token.stride(1) == 1
    if bs == 0 or num_tokens == 0 or max_extend_len <= 0:
        return out

    block_m, block_n, num_warps, num_stages = _extend_blocks(q, bs, max_extend_len)
    grid = (bs, num_heads, triton.cdiv(max_extend_len, block_m))
    _extend_kernel[grid](
        q, k_cache, v_cache, out, req_to_token, req_pool_indices, seq_lens, extend_lens,
        extend_start_loc,
        sm_scale * _LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1),
        req_to_token.stride(0),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(head_dim),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32: exact, no TF32
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
