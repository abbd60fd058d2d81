"""Neox-style rotary embedding of q and k in one Triton kernel, in place (decode hot path).

Data flow: models/layers.py Attention -> qkv_proj output split into q/k/v views ->
apply_rope rotates q and k where they lie (inside the fused qkv buffer) -> attention.

With x1 = x[..., :D/2] and x2 = x[..., D/2:] in fp32, cos/sin looked up at the token's
position in the fp32 tables of RotaryEmbedding:

    out = cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin).to(x.dtype)

Grid: (token, block of heads). Blocks 0..nq-1 cover q's heads, the rest k's heads, so
one launch rotates both. Every token reads its position on the device: CUDA-graph safe.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from gearshift.models.reference_ops import apply_rope_ref  # noqa: F401 (re-exported)

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"




@triton.jit
def _rotate_heads(base, stride_h, first_head, num_heads, cos, sin, offs_d, mask_d,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    heads = first_head + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    mask = (heads < num_heads)[:, None] & mask_d[None, :]
    ptrs1 = base + heads[:, None] * stride_h + offs_d[None, :]  # [BLOCK_H, BLOCK_D] first half
    x1 = tl.load(ptrs1, mask=mask, other=0.0)
    x2 = tl.load(ptrs1 + HALF, mask=mask, other=0.0)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    out1 = x1f * cos[None, :] - x2f * sin[None, :]
    out2 = x2f * cos[None, :] + x1f * sin[None, :]
    tl.store(ptrs1, out1.to(x1.dtype), mask=mask)
    tl.store(ptrs1 + HALF, out2.to(x1.dtype), mask=mask)


@triton.jit
def _rope_kernel(
    Q, K, Positions, Cos, Sin,
    num_q_heads, num_k_heads, num_q_blocks,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cos, stride_sin,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    pos = tl.load(Positions + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HALF
    cos = tl.load(Cos + pos * stride_cos + offs_d, mask=mask_d, other=0.0)  # [BLOCK_D] fp32
    sin = tl.load(Sin + pos * stride_sin + offs_d, mask=mask_d, other=0.0)
    if head_block < num_q_blocks:
        _rotate_heads(Q + token * stride_qt, stride_qh, head_block * BLOCK_H, num_q_heads,
                      cos, sin, offs_d, mask_d, HALF, BLOCK_H)
    else:
        _rotate_heads(K + token * stride_kt, stride_kh, (head_block - num_q_blocks) * BLOCK_H,
                      num_k_heads, cos, sin, offs_d, mask_d, HALF, BLOCK_H)


def apply_rope(
    q: torch.Tensor,  # [T, Hq, D], any token/head strides, unit stride over D; IN PLACE
    k: torch.Tensor,  # [T, Hkv, D], same dtype as q; IN PLACE
    positions: torch.Tensor,  # [T] int32/int64
    cos: torch.Tensor,  # [max_pos, D/2] fp32
    sin: torch.Tensor,  # [max_pos, D/2] fp32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k in place (they may be views into a fused qkv buffer); returns (q, k).

    Positions are not range-checked (that would need a host sync): they must be < max_pos.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    assert k.shape == (num_tokens, num_k_heads, head_dim) and k.dtype == q.dtype
    assert positions.shape == (num_tokens,), "one position per token"
    assert head_dim % 2 == 0 and cos.shape[-1] == head_dim // 2 and sin.shape[-1] == head_dim // 2
    assert cos.dtype == torch.float32 and sin.dtype == torch.float32
    assert q.stride(2) == 1 and k.stride(2) == 1, "head_dim must be contiguous"
    assert cos.stride(1) == 1 and sin.stride(1) == 1
    if num_tokens == 0:
        return q, k
    half = head_dim // 2
    block_d = triton.next_power_of_2(half)
    block_h = max(1, min(2048 // (2 * block_d), triton.next_power_of_2(max(num_q_heads, num_k_heads))))
    num_q_blocks = triton.cdiv(num_q_heads, block_h)
    grid = (num_tokens, num_q_blocks + triton.cdiv(num_k_heads, block_h))
    _rope_kernel[grid](
        q, k, positions, cos, sin,
        num_q_heads, num_k_heads, num_q_blocks,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        HALF=half, BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=1 if _INTERPRET else 4,
        enable_fp_fusion=False,  # no FMA contraction: bit-exact with torch eager in fp32
    )
    return q, k
