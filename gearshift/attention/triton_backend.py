"""Triton attention backend: split-K decode and causal flash extend over the slot pool.

Data flow: Attention layer -> TritonBackend.rope_store_attend. DECODE: the decode kernel
rotates q and k and stores K/V itself (kernels/decode.py, RopeInputs). Other modes ->
TritonBackend.rope_and_store (on CUDA one fused kernel, kernels/rope.py: rotates q in
place, writes rotated K and V at out_cache_loc) -> AttentionBackend.attend ->
TritonBackend.decode / .extend / .tree -> kernels/decode.py, kernels/extend.py,
kernels/tree.py.

Decode is CUDA-graph safe: its grid depends only on the padded batch size (the number
of KV splits is a function of it), and its fp32 scratch comes from one persistent buffer
per (num_heads, head_dim) that every layer and step reuses. Buffers are only ever added,
never freed, so graphs captured against an older buffer stay valid.
"""

from __future__ import annotations

import torch

from gearshift.attention.base import AttentionBackend, KVCache
from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.kernels.decode import (
    RopeInputs,
    decode_attention,
    num_sms,
    pick_num_kv_splits,
    workspace_row,
)
from gearshift.kernels.extend import extend_attention
from gearshift.kernels.rope import rope_and_store_kv
from gearshift.kernels.tree import pick_tree_kv_splits, tree_attention


class TritonBackend(AttentionBackend):
    def __init__(self, kv: KVCache, sm_scale: float, max_kv_splits: int = 32) -> None:
        super().__init__(kv, sm_scale)
        self.max_kv_splits = max_kv_splits
        self.num_kv_heads = kv.k.shape[2]
        self.sm_count = num_sms(kv.k.device)
        # (num_heads, head_dim) -> (max batch rows, flat fp32 scratch)
        self._workspaces: dict[tuple[int, int], tuple[int, torch.Tensor]] = {}
        self._retired: list[torch.Tensor] = []  # kept alive for graphs that captured them

    def num_kv_splits(self, batch_size: int) -> int:
        """Decode's KV splits at a padded batch size."""
        return pick_num_kv_splits(batch_size, self.num_kv_heads, self.sm_count,
                                  self.max_kv_splits)

    def tree_kv_splits(self, num_tokens: int) -> int:
        return pick_tree_kv_splits(num_tokens, self.num_kv_heads, self.sm_count,
                                   self.max_kv_splits)

    def reserve_decode_workspace(self, max_batch_size: int, num_heads: int,
                                 head_dim: int) -> None:
        """Allocate decode scratch for every batch size up to max_batch_size (call this
        before CUDA-graph capture; decode() does it lazily otherwise)."""
        key = (num_heads, head_dim)
        if key in self._workspaces and self._workspaces[key][0] >= max_batch_size:
            return
        rows = max(max_batch_size, self.kv.req_to_token.shape[0])
        per_row_split = num_heads * workspace_row(head_dim)
        numel = per_row_split * max(bs * max(self.num_kv_splits(bs), self.tree_kv_splits(bs))
                                    for bs in range(1, rows + 1))
        if key in self._workspaces:
            self._retired.append(self._workspaces[key][1])
        buffer = torch.empty(numel, dtype=torch.float32, device=self.kv.k.device)
        self._workspaces[key] = (rows, buffer)

    def _decode_workspace(self, bs: int, num_heads: int, head_dim: int,
                          splits: int) -> torch.Tensor:
        self.reserve_decode_workspace(bs, num_heads, head_dim)
        buffer = self._workspaces[(num_heads, head_dim)][1]
        row = workspace_row(head_dim)
        return buffer[:bs * num_heads * splits * row].view(bs, num_heads, splits, row)

    def rope_and_store(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        # q: [T, Hq, D] rotated in place; k, v: [T, Hkv, D] -> kv slots fb.out_cache_loc
        if not q.is_cuda:
            return super().rope_and_store(q, k, v, positions, cos, sin, layer_id, fb)
        return rope_and_store_kv(q, k, v, positions, cos, sin, self.kv.k[layer_id],
                                 self.kv.v[layer_id], fb.out_cache_loc)

    def rope_store_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        # DECODE: RoPE and the K/V store inside the decode kernel (no launch of their own)
        if fb.mode is ForwardMode.DECODE and fb.tree is None:
            return self.decode(q, layer_id, fb,
                               RopeInputs(k, v, positions, cos, sin, fb.out_cache_loc))
        return super().rope_store_attend(q, k, v, positions, cos, sin, layer_id, fb)

    def decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch,
               rope: RopeInputs | None = None) -> torch.Tensor:
        # q: [padded_bs, num_heads, head_dim] (unrotated with `rope`)
        bs, num_heads, head_dim = q.shape
        splits = self.num_kv_splits(bs)
        workspace = self._decode_workspace(bs, num_heads, head_dim, splits)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        return decode_attention(
            q, self.kv.k[layer_id], self.kv.v[layer_id], self.kv.req_to_token,
            fb.req_pool_indices, fb.seq_lens, self.sm_scale, out,
            num_kv_splits=splits, workspace=workspace, rope=rope,
        )

    def tree(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        # q: [num_tokens, num_heads, head_dim]; keys per token: prefix + extra slots (fb.tree)
        # Graph-safe like decode: splits depend on num_tokens only, scratch is the decode
        # workspace (reserve_decode_workspace(max_tokens, ...) before capture).
        num_tokens, num_heads, head_dim = q.shape
        splits = self.tree_kv_splits(num_tokens)
        t = fb.tree
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        return tree_attention(
            q, self.kv.k[layer_id], self.kv.v[layer_id], self.kv.req_to_token,
            t.token_rows, t.prefix_lens, t.extra_slots, self.sm_scale, out,
            num_kv_splits=splits,
            workspace=self._decode_workspace(num_tokens, num_heads, head_dim, splits),
        )

    def extend(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        # q: [num_tokens, num_heads, head_dim], requests packed back to back
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        return extend_attention(
            q, self.kv.k[layer_id], self.kv.v[layer_id], self.kv.req_to_token,
            fb.req_pool_indices, fb.seq_lens, fb.extend_lens, fb.extend_start_loc,
            self.sm_scale, out, max_extend_len=fb.max_extend_len,
        )
