"""Attention backend contract: store this step's K/V into the slot pool, then attend.

Data flow: ModelRunner picks one backend (registry below) -> every Attention layer calls
`q = backend.rope_and_store(q, k, v, positions, cos, sin, layer_id, fb)` (rotates q and k,
writes K/V at fb.out_cache_loc; one fused kernel in the Triton backend on CUDA) and then
`backend.attend(q, layer_id, fb)`, which dispatches on fb.tree / fb.mode; or both at once
through `backend.rope_store_attend(...)` (the Triton backend's DECODE: inside the decode
kernel). Callers whose
q/k are already rotated use `backend.forward(q, k, v, layer_id, fb)` (store + attend).

KV buffers live in `KVCache` (one tensor each for K and V):
    k[layer, slot, kv_head, head_dim], v[layer, slot, kv_head, head_dim]
and req_to_token[row, position] -> slot (int32) maps each request's tokens to slots.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from gearshift.forward_batch import ForwardBatch
from gearshift.kernels import ops


@dataclass
class KVCache:
    k: torch.Tensor  # [num_layers, num_slots + 1, num_kv_heads, head_dim]; slot 0 = dummy
    v: torch.Tensor  # [num_layers, num_slots + 1, num_kv_heads, head_dim]
    req_to_token: torch.Tensor  # [max_num_seqs + 1, max_model_len] int32; row 0 = dummy

    @classmethod
    def allocate(cls, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 max_num_seqs: int, max_model_len: int, dtype: torch.dtype,
                 device: torch.device | str) -> KVCache:
        shape = (num_layers, num_slots + 1, num_kv_heads, head_dim)
        return cls(
            k=torch.zeros(shape, dtype=dtype, device=device),
            v=torch.zeros(shape, dtype=dtype, device=device),
            req_to_token=torch.zeros(max_num_seqs + 1, max_model_len, dtype=torch.int32,
                                     device=device),
        )

    def resize(self, num_slots: int) -> None:
        """Fresh zeroed K and V for `num_slots` slots (+ the dummy), contents dropped; the
        old tensors go first, so both never coexist (req_to_token stays)."""
        shape = (self.k.shape[0], num_slots + 1, *self.k.shape[2:])
        dtype, device = self.k.dtype, self.k.device
        self.k = self.v = None
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8


class AttentionBackend(ABC):
    def __init__(self, kv: KVCache, sm_scale: float) -> None:
        self.kv = kv
        self.sm_scale = sm_scale

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch) -> None:
        # k, v: [num_tokens, num_kv_heads, head_dim]
        self.kv.k[layer_id].index_copy_(0, fb.out_cache_loc, k)
        self.kv.v[layer_id].index_copy_(0, fb.out_cache_loc, v)

    def rope_and_store(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        """Neox RoPE on q and k at `positions`, then K/V into the slot pool; returns rotated q.

        q: [T, Hq, D]; k, v: [T, Hkv, D] (views into the fused qkv output); positions: [T];
        cos, sin: [max_pos, D/2] fp32 (RotaryEmbedding's tables). q may be rotated in place;
        k afterwards holds either value (only the cache copy is defined)."""
        q, k = ops.rope(q, k, positions, cos, sin)
        self.store_kv(k, v, layer_id, fb)
        return q

    def rope_store_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        """rope_and_store, then attend (a backend may do both in one kernel)."""
        q = self.rope_and_store(q, k, v, positions, cos, sin, layer_id, fb)
        return self.attend(q, layer_id, fb)

    def attend(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        """q: [num_tokens, num_heads, head_dim] over the K/V already stored; same shape out."""
        if fb.tree is not None:
            return self.tree(q, layer_id, fb)
        if fb.mode.name == "DECODE":
            return self.decode(q, layer_id, fb)
        return self.extend(q, layer_id, fb)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                fb: ForwardBatch) -> torch.Tensor:
        """Store already-rotated k/v, then attend. q: [num_tokens, num_heads, head_dim]."""
        self.store_kv(k, v, layer_id, fb)
        return self.attend(q, layer_id, fb)

    @abstractmethod
    def decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor: ...

    @abstractmethod
    def extend(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor: ...

    def tree(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        """Each token attends to its prefix plus its extra slots (fb.tree); no causal order.
        Plain-torch reference (any device); backends with a kernel override it."""
        from gearshift.attention.torch_backend import _attend

        t = fb.tree
        p = t.max_prefix_len
        prefix = self.kv.req_to_token[t.token_rows, :p].long()  # [T, P]
        pos = torch.arange(p, device=q.device)
        slots = torch.cat([prefix, t.extra_slots.clamp_min(0)], dim=1)  # [T, P + M]
        valid = torch.cat([pos[None, :] < t.prefix_lens[:, None], t.extra_slots >= 0], dim=1)
        k = self.kv.k[layer_id][slots].transpose(1, 2)  # [T, Hkv, P + M, D]
        v = self.kv.v[layer_id][slots].transpose(1, 2)
        out = _attend(q[:, :, None, :], k, v, valid[:, None, None, :], self.sm_scale)
        return out[:, :, 0, :]  # [T, Hq, D]


def create_backend(name: str, kv: KVCache, sm_scale: float) -> AttentionBackend:
    if name == "torch":
        from gearshift.attention.torch_backend import TorchBackend

        return TorchBackend(kv, sm_scale)
    if name == "triton":
        from gearshift.attention.triton_backend import TritonBackend

        return TritonBackend(kv, sm_scale)
    raise ValueError(f"unknown attention backend {name!r} (torch, triton)")
