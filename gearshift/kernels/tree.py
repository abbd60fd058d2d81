"""Tree attention for VERIFY / DRAFT: each query token sees its committed prefix plus an
explicit list of extra key slots (its tree ancestors among this step's tokens, and itself).

Data flow: TritonBackend.tree -> tree_attention -> stage 1 (partial softmax per KV split,
into the persistent fp32 decode workspace) -> stage 2 (merge the splits into `out`).

Keys of query token i (no causal order; softmax over the union):

    req_to_token[token_rows[i], 0 .. prefix_lens[i]-1]   committed prefix, via the row
    extra_slots[i, :]                                    slots, -1 = unused column

    keys of token i  [ split 0 | split 1 | ... | split S-1 + extra slots ]
    workspace[i, h, s]  [ acc_s / l_s  (head_dim floats) | lse_s (log2 domain) | pad ]

The prefix is cut into S = num_kv_splits equal shares (rounded up to whole KV blocks);
the last split also reads the extra slots, so it always writes its workspace row (lse =
-inf when it saw no key), while an earlier split past the end of a short prefix exits at
once and is skipped by stage 2. A token with no key at all gets zeros (padded tokens).

Grid (num_tokens, num_kv_heads, S): it depends only on host ints (S is picked from the
number of tokens) and nothing syncs with the host, so the call can be captured in a CUDA
graph. One program handles the G query heads of one KV head for one token (the heads are
the M side of tl.dot, padded to 16), so each K/V block is loaded once per group (GQA).
Tokens of one request are neighbours in launch order (program_id 0 varies fastest), so
their shared prefix blocks can be served from L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gearshift import env
from gearshift.kernels.decode import alloc_decode_workspace

_INTERPRET = env.triton_interpret()
_LOG2E = 1.4426950408889634


@triton.jit
def _attend_block(q, k, v, valid, m_i, l_i, acc, sm_scale_log2, DOT_PRECISION: tl.constexpr):
    """Online-softmax update with one key block. valid [BLOCK_N] may be all False."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2  # [BLOCK_H, N]
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet: keep zeros
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _tree_split_kernel(
    Q, K, V, ReqToToken, TokenRows, PrefixLens, ExtraSlots, Work,
    sm_scale_log2, num_extra,
    stride_qt, stride_qh,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_rt, stride_et, stride_ee,
    stride_wt, stride_wh, stride_ws,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_E: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    t = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    is_last = split == NUM_SPLITS - 1

    prefix_len = tl.load(PrefixLens + t)
    # (cdiv by hand: each nested jit call costs milliseconds under the interpreter)
    split_len = ((prefix_len + NUM_SPLITS - 1) // NUM_SPLITS + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, prefix_len)
    if (start >= end) & (split < NUM_SPLITS - 1):
        return
    row = tl.load(TokenRows + t).to(tl.int64)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_h = offs_h < GROUP
    mask_d = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h  # [BLOCK_H] query heads of this KV group

    q_ptrs = Q + t * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_h[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)

    # committed prefix: this split's share, read through req_to_token
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        mask_n = pos < end
        slots = tl.load(ReqToToken + row * stride_rt + pos, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(K + slots[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        v = tl.load(V + slots[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        m_i, l_i, acc = _attend_block(q, k, v, mask_n, m_i, l_i, acc, sm_scale_log2,
                                      DOT_PRECISION)

    # extra slots (last split only): any column may be -1
    offs_e = tl.arange(0, BLOCK_E)
    extra_end = tl.where(is_last, num_extra, 0)
    for e0 in range(0, extra_end, BLOCK_E):
        col = e0 + offs_e
        slots = tl.load(ExtraSlots + t * stride_et + col * stride_ee, mask=col < num_extra,
                        other=-1)  # [BLOCK_E]
        valid = slots >= 0  # [BLOCK_E]
        slots = tl.where(valid, slots, 0).to(tl.int64)
        kv_mask = valid[:, None] & mask_d[None, :]
        k = tl.load(K + slots[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # [BLOCK_E, BLOCK_D]
        v = tl.load(V + slots[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # [BLOCK_E, BLOCK_D]
        m_i, l_i, acc = _attend_block(q, k, v, valid, m_i, l_i, acc, sm_scale_log2,
                                      DOT_PRECISION)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    w_ptrs = Work + t * stride_wt + heads * stride_wh + split * stride_ws  # [BLOCK_H]
    tl.store(w_ptrs[:, None] + offs_d[None, :], acc / l_safe[:, None],
             mask=mask_h[:, None] & mask_d[None, :])
    tl.store(w_ptrs + HEAD_DIM, m_i + tl.log2(l_safe), mask=mask_h)  # -inf: no key seen


@triton.jit
def _tree_merge_kernel(
    Work, PrefixLens, Out,
    stride_wt, stride_wh, stride_ws,
    stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    t = tl.program_id(0)
    head = tl.program_id(1)

    prefix_len = tl.load(PrefixLens + t)
    split_len = ((prefix_len + NUM_SPLITS - 1) // NUM_SPLITS + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    # the splits stage 1 wrote: those holding prefix keys, and always the last one
    valid = (offs_s < NUM_SPLITS) & ((offs_s * split_len < prefix_len)
                                     | (offs_s == NUM_SPLITS - 1))  # [BLOCK_S]
    mask_d = offs_d < HEAD_DIM

    w_ptrs = Work + t * stride_wt + head * stride_wh + offs_s * stride_ws  # [BLOCK_S]
    lse = tl.load(w_ptrs + HEAD_DIM, mask=valid, other=float("-inf"))
    part = tl.load(w_ptrs[:, None] + offs_d[None, :], mask=valid[:, None] & mask_d[None, :],
                   other=0.0)  # [BLOCK_S, BLOCK_D]
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # no key at all: output zeros
    w = tl.where(valid, tl.exp2(lse - m), 0.0)
    denom = tl.maximum(tl.sum(w, 0), 1e-30)
    out = tl.sum(part * w[:, None], 0) / denom  # [BLOCK_D]
    tl.store(Out + t * stride_ot + head * stride_oh + offs_d, out.to(Out.dtype.element_ty),
             mask=mask_d)


def pick_tree_kv_splits(num_tokens: int, num_kv_heads: int, sm_count: int = 132,
                        max_kv_splits: int = 32) -> int:
    """KV splits of the prefix for `num_tokens` query tokens: enough stage-1 programs for
    ~4 waves, a power of two (host ints only: graph-safe). Decode's own rule
    (pick_num_kv_splits) aims at ~2 waves, measured faster there; the tree kernel's splits
    have not been re-measured under it."""
    wanted = triton.cdiv(4 * sm_count, max(num_tokens * num_kv_heads, 1))
    return max(1, min(max_kv_splits, triton.next_power_of_2(wanted)))


def _tree_blocks(num_extra: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_E, num_warps, num_stages) for stage 1; host shapes only."""
    block_e = max(16, triton.next_power_of_2(max(num_extra, 1)))
    if _INTERPRET:  # few, large blocks (the interpreter pays per op), still > 1 per loop
        return 64, min(32, block_e), 1, 1
    return 64, min(64, block_e), 4, 2


def tree_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,  # [max_num_seqs + 1, max_model_len] int32
    token_rows: torch.Tensor,  # [num_tokens] int: req_to_token row of each query token
    prefix_lens: torch.Tensor,  # [num_tokens] int: committed keys req_to_token[row, :len]
    extra_slots: torch.Tensor,  # [num_tokens, max_extra] int: more key slots, -1 = none
    sm_scale: float,
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim], written in place
    *,
    num_kv_splits: int = 8,
    workspace: torch.Tensor | None = None,  # [>= T, num_heads, >= splits, >= head_dim+1]
) -> torch.Tensor:
    """Attention of each query token over its prefix plus its extra slots; returns `out`.

    Pass a persistent `workspace` (see alloc_decode_workspace; the decode scratch layout)
    to stay CUDA-graph safe; without one a fresh buffer is allocated.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    num_extra = extra_slots.shape[1]
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert q.stride(2) == 1 and k_cache.stride(2) == 1 and v_cache.stride(2) == 1
    assert out.stride(2) == 1 and req_to_token.stride(1) == 1
    assert extra_slots.dim() == 2 and extra_slots.shape[0] == num_tokens
    if workspace is None:
        workspace = alloc_decode_workspace(num_tokens, num_heads, head_dim, num_kv_splits,
                                           q.device)
    assert workspace.dtype == torch.float32 and workspace.stride(3) == 1
    assert workspace.shape[0] >= num_tokens and workspace.shape[1] == num_heads
    assert workspace.shape[2] >= num_kv_splits and workspace.shape[3] >= head_dim + 1
    if num_tokens == 0:
        return out
    # the kernel reads one element per token at unit stride: an expanded view (stride 0,
    # e.g. a draft step's rows broadcast over its nodes) must be materialised
    token_rows, prefix_lens = token_rows.contiguous(), prefix_lens.contiguous()

    group = num_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    block_h = max(16, triton.next_power_of_2(group))  # tl.dot needs M >= 16
    block_n, block_e, num_warps, num_stages = _tree_blocks(num_extra)
    _tree_split_kernel[(num_tokens, num_kv_heads, num_kv_splits)](
        q, k_cache, v_cache, req_to_token, token_rows, prefix_lens, extra_slots, workspace,
        sm_scale * _LOG2E, num_extra,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        req_to_token.stride(0), extra_slots.stride(0), extra_slots.stride(1),
        workspace.stride(0), workspace.stride(1), workspace.stride(2),
        GROUP=group, HEAD_DIM=head_dim, NUM_SPLITS=num_kv_splits,
        BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=block_n, BLOCK_E=block_e,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32: exact, no TF32
        num_warps=num_warps, num_stages=num_stages,
    )
    _tree_merge_kernel[(num_tokens, num_heads)](
        workspace, prefix_lens, out,
        workspace.stride(0), workspace.stride(1), workspace.stride(2),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, NUM_SPLITS=num_kv_splits,
        BLOCK_S=triton.next_power_of_2(num_kv_splits), BLOCK_D=block_d, BLOCK_N=block_n,
        num_warps=4 if block_d >= 128 else 2, num_stages=1,
    )
    return out
