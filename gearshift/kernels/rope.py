"""Neox-style rotary embedding in one Triton kernel, in place on q (decode hot path), with
two entry points:

  apply_rope         rotates q and k where they lie (inside the fused qkv buffer);
  rope_and_store_kv  rotates q in place and writes rotated k and (copied) v straight into
                     this layer's KV slot pool at out_cache_loc: one launch per layer
                     instead of RoPE + two index_copy_ kernels.

Data flow: models/layers.py Attention -> qkv_proj output split into q/k/v views ->
AttentionBackend.rope_and_store (attention/triton_backend.py on CUDA: rope_and_store_kv;
elsewhere ops.rope + store_kv) -> attention over the slot pool.

With x1 = x[..., :D/2] and x2 = x[..., D/2:] in fp32, cos/sin looked up at the token's
position in the fp32 tables of RotaryEmbedding:

    out = cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin).to(x.dtype)

Grid: (token, block of heads). Blocks 0..nq-1 cover q's heads, the rest k's heads (and,
in rope_and_store_kv, v's heads of the same numbers), so one launch does everything; the
rotation itself is one helper (_rotate_heads) whatever the destination.
Every token reads its position and slot on the device: CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gearshift import env
from gearshift.kernels import pdl
from gearshift.kernels.pdl import pdl_enter
from gearshift.kernels.reference import apply_rope_ref  # noqa: F401 (re-exported)

_INTERPRET = env.triton_interpret()


@triton.jit
def _rotate_heads(src, src_stride_h, dst, dst_stride_h, first_head, num_heads, cos, sin,
                  offs_d, mask_d, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    """Rotate heads first_head.. of one token from src into dst (dst may be src)."""
    heads = first_head + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    mask = (heads < num_heads)[:, None] & mask_d[None, :]
    src1 = src + heads[:, None] * src_stride_h + offs_d[None, :]  # [BLOCK_H, BLOCK_D] first half
    dst1 = dst + heads[:, None] * dst_stride_h + offs_d[None, :]
    x1 = tl.load(src1, mask=mask, other=0.0)
    x2 = tl.load(src1 + HALF, mask=mask, other=0.0)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    out1 = x1f * cos[None, :] - x2f * sin[None, :]
    out2 = x2f * cos[None, :] + x1f * sin[None, :]
    tl.store(dst1, out1.to(x1.dtype), mask=mask)
    tl.store(dst1 + HALF, out2.to(x1.dtype), mask=mask)


@triton.jit
def _copy_heads(src, src_stride_h, dst, dst_stride_h, first_head, num_heads, offs_d, mask_d,
                HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    """Copy heads first_head.. of one token (both halves) from src into dst."""
    heads = first_head + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    mask = (heads < num_heads)[:, None] & mask_d[None, :]
    src1 = src + heads[:, None] * src_stride_h + offs_d[None, :]
    dst1 = dst + heads[:, None] * dst_stride_h + offs_d[None, :]
    tl.store(dst1, tl.load(src1, mask=mask), mask=mask)
    tl.store(dst1 + HALF, tl.load(src1 + HALF, mask=mask), mask=mask)


@triton.jit
def _rope_kernel(
    Q, K, V, Positions, Cos, Sin, KDst, VDst, OutCacheLoc,
    num_q_heads, num_k_heads, num_q_blocks,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_sin,
    stride_kd_row, stride_kd_h, stride_vd_row, stride_vd_h,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, STORE_KV: tl.constexpr,
    PDL: tl.constexpr,
):
    """q heads rotate in place. k heads rotate into KDst row `token` (KDst is K: in place)
    or, with STORE_KV, row out_cache_loc[token] of this layer's K cache, and v is copied
    into the same row of VDst (V, VDst and OutCacheLoc are unused without STORE_KV)."""
    pdl_enter(PDL)
    token = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    pos = tl.load(Positions + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HALF
    cos = tl.load(Cos + pos * stride_cos + offs_d, mask=mask_d, other=0.0)  # [BLOCK_D] fp32
    sin = tl.load(Sin + pos * stride_sin + offs_d, mask=mask_d, other=0.0)
    if head_block < num_q_blocks:
        q = Q + token * stride_qt
        _rotate_heads(q, stride_qh, q, stride_qh, head_block * BLOCK_H, num_q_heads,
                      cos, sin, offs_d, mask_d, HALF, BLOCK_H)
    else:
        first_head = (head_block - num_q_blocks) * BLOCK_H
        row = token
        if STORE_KV:
            row = tl.load(OutCacheLoc + token).to(tl.int64)
        _rotate_heads(K + token * stride_kt, stride_kh, KDst + row * stride_kd_row, stride_kd_h,
                      first_head, num_k_heads, cos, sin, offs_d, mask_d, HALF, BLOCK_H)
        if STORE_KV:
            _copy_heads(V + token * stride_vt, stride_vh, VDst + row * stride_vd_row, stride_vd_h,
                        first_head, num_k_heads, offs_d, mask_d, HALF, BLOCK_H)


def _check_rope_args(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     cos: torch.Tensor, sin: torch.Tensor) -> None:
    num_tokens, _, head_dim = q.shape
    assert k.shape == (num_tokens, k.shape[1], head_dim) and k.dtype == q.dtype
    assert positions.shape == (num_tokens,), "one position per token"
    assert head_dim % 2 == 0 and cos.shape[-1] == head_dim // 2 and sin.shape[-1] == head_dim // 2
    assert cos.dtype == torch.float32 and sin.dtype == torch.float32
    assert q.stride(2) == 1 and k.stride(2) == 1, "head_dim must be contiguous"
    assert cos.stride(1) == 1 and sin.stride(1) == 1


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
            cos: torch.Tensor, sin: torch.Tensor, k_dst: torch.Tensor, v_dst: torch.Tensor,
            out_cache_loc: torch.Tensor, store_kv: bool) -> None:
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    # one position / slot per token at unit stride (an expanded view would be misread)
    positions, out_cache_loc = positions.contiguous(), out_cache_loc.contiguous()
    block_d = triton.next_power_of_2(head_dim // 2)
    block_h = max(1, min(2048 // (2 * block_d), triton.next_power_of_2(max(num_q_heads, num_k_heads))))
    num_q_blocks = triton.cdiv(num_q_heads, block_h)
    grid = (num_tokens, num_q_blocks + triton.cdiv(num_k_heads, block_h))  # q blocks, then k/v
    _rope_kernel[grid](
        q, k, v, positions, cos, sin, k_dst, v_dst, out_cache_loc,
        num_q_heads, num_k_heads, num_q_blocks,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), sin.stride(0),
        k_dst.stride(0), k_dst.stride(1), v_dst.stride(0), v_dst.stride(1),
        HALF=head_dim // 2, BLOCK_H=block_h, BLOCK_D=block_d, STORE_KV=store_kv,
        PDL=pdl.enabled(q.device), **pdl.launch_kwargs(q.device),
        num_warps=1 if _INTERPRET else 4,
        enable_fp_fusion=False,  # no FMA contraction: bit-exact with torch eager in fp32
    )


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
    _check_rope_args(q, k, positions, cos, sin)
    if q.shape[0] > 0:
        _launch(q, k, k, positions, cos, sin, k, k, positions, store_kv=False)
    return q, k


def rope_and_store_kv(
    q: torch.Tensor,  # [T, Hq, D], any token/head strides, unit stride over D; IN PLACE
    k: torch.Tensor,  # [T, Hkv, D], same dtype as q; read only (rotated into k_cache)
    v: torch.Tensor,  # [T, Hkv, D], same dtype; read only (copied into v_cache)
    positions: torch.Tensor,  # [T] int32/int64
    cos: torch.Tensor,  # [max_pos, D/2] fp32
    sin: torch.Tensor,  # [max_pos, D/2] fp32
    k_cache: torch.Tensor,  # [num_slots + 1, Hkv, D] one layer's K, unit stride over D
    v_cache: torch.Tensor,  # [num_slots + 1, Hkv, D] one layer's V
    out_cache_loc: torch.Tensor,  # [T] int64: the slot each token writes
) -> torch.Tensor:
    """Rotate q in place; k_cache[out_cache_loc[t]] = rope(k[t]), v_cache[...] = v[t].
    Returns q. Equals apply_rope_ref + index_copy_ of k and v (k itself is left as it was).

    Positions and slots are not range-checked (that would need a host sync).
    """
    _check_rope_args(q, k, positions, cos, sin)
    num_tokens = q.shape[0]
    assert v.shape == k.shape and v.dtype == k.dtype and v.stride(2) == 1
    for cache in (k_cache, v_cache):
        assert cache.shape[1:] == k.shape[1:] and cache.dtype == k.dtype
        assert cache.stride(2) == 1, "cache head_dim must be contiguous"
    assert out_cache_loc.shape == (num_tokens,), "one slot per token"
    if num_tokens > 0:
        _launch(q, k, v, positions, cos, sin, k_cache, v_cache, out_cache_loc, store_kv=True)
    return q
