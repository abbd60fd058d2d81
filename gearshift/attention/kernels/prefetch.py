"""The key loop of a query tile that sees every key of its range (a decoder's one token),
its loads issued by hand one block ahead. Used by the decode kernel and by the extend
kernel's decoder path.

Why by hand: K/V are gathered through req_to_token, so a block's addresses come from a load
(its slots). Triton's pipeliner (3.6, sm90) then issues block i+1's copy only after block
i's dots and waits for it at the top of the next iteration: each block waits for its own
loads, and a program reads at its memory latency (session 19: the extend kernel's decoder
path read 60 decoders' K/V at 2.9 TB/s). Here block i+1's K/V and block i+2's slots are
plain loads into registers issued before block i's dots; a load blocks only where its
registers are used, in the next iteration. The loop runs with num_stages=1 (no automatic
pipelining on top).

    iteration i:  issue K/V(i+1) [slots read in i-1], issue slots(i+2)  ->  dots of block i
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gather_kv(K, V, slots, mask, kv_head, stride_ks, stride_kh, stride_vs, stride_vh,
              offs_d, mask_d):
    """One block of K and V rows (slots[:, None]) of one KV head; masked keys are zero."""
    kv_mask = mask[:, None] & mask_d[None, :]
    k = tl.load(K + slots[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :],
                mask=kv_mask, other=0.0)
    v = tl.load(V + slots[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :],
                mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def attend_keys_prefetched(
    acc, l_i, m_i, q, K, V, slot_ptrs, kv_head, start, end, sm_scale_log2,
    stride_ks, stride_kh, stride_vs, stride_vh,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Online-softmax update of (acc, l_i, m_i) of the tile q [M, BLOCK_D] with keys
    start..end-1 (every row sees every key; slot_ptrs: the request's req_to_token row),
    log2 domain. Returns the updated triple."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    first = start + offs_n
    slots = tl.load(slot_ptrs + first, mask=first < end, other=0).to(tl.int64)
    k_next, v_next = gather_kv(K, V, slots, first < end, kv_head, stride_ks, stride_kh,
                               stride_vs, stride_vh, offs_d, mask_d)
    ahead = first + BLOCK_N
    slots = tl.load(slot_ptrs + ahead, mask=ahead < end, other=0).to(tl.int64)
    for n0 in tl.range(start, end, BLOCK_N, num_stages=1):
        pos = n0 + offs_n
        k = k_next
        v = v_next
        ahead = pos + BLOCK_N  # block i+1, its slots read during block i-1
        k_next, v_next = gather_kv(K, V, slots, ahead < end, kv_head, stride_ks, stride_kh,
                                   stride_vs, stride_vh, offs_d, mask_d)
        ahead += BLOCK_N
        slots = tl.load(slot_ptrs + ahead, mask=ahead < end, other=0).to(tl.int64)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2
        s = tl.where((pos < end)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i
