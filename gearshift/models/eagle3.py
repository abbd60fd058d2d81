"""The EAGLE-3 draft head: one Llama decoder layer over [token embedding ; fused target
features], with its own LM head over a smaller draft vocabulary.

Data flow (speculative decoding, eagle3 proposer):

    target forward --(aux hidden states of 3 target layers, [T, 3*H_t])--+
                                                                         v
    input_ids [T] -> embed_tokens -> input_layernorm --+       fc (3*H_t -> H) if width != H
                                                       |                 |
                                                       |      residual = hidden
                                                       v                 v
                                             cat([norm(embeds), hidden_norm(hidden)])  [T, 2H]
                                                       |
                      self_attn (q/k/v from 2H; RoPE + draft KV layer 0 via the backend)
                                                       |
                            residual += attn; x = post_attention_layernorm(residual)
                                                       |
                                     prenorm = mlp(x) + residual   [T, H]  --> next draft step
                                                       |                       (as `hidden`)
                          logits = lm_head(norm(prenorm))  [B, draft_vocab] float32
                          target id = draft id + d2t[draft id]

The first draft step (and DRAFT_EXTEND over committed tokens) takes the target features
[T, 3*H_t] (fused by `fc`); later steps of a chain / tree take the draft's own previous
`prenorm` [T, H] and skip `fc`. Semantics follow SGLang's `llama_eagle3.py`. Parameter
names mirror the checkpoint's (`midlayer.*`, `fc`, `norm`, `lm_head`) with q/k/v and
gate/up fused; models/eagle3_loader.py builds and fills it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from gearshift.attention.base import AttentionBackend
from gearshift.forward_batch import ForwardBatch
from gearshift.models.layers import MLP, RMSNorm, RotaryEmbedding

if TYPE_CHECKING:
    from gearshift.models.eagle3_loader import Eagle3Config


class Eagle3Attention(nn.Module):
    """Llama attention whose fused q/k/v projection reads 2*hidden inputs (no bias)."""

    def __init__(self, cfg: Eagle3Config, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = nn.Linear(2 * cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.rope = rope

    def forward(self, positions: torch.Tensor, x: torch.Tensor, fb: ForwardBatch,
                attn: AttentionBackend) -> torch.Tensor:
        # positions: [T]; x: [T, 2*hidden] -> [T, hidden]
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.view(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(t, self.num_kv_heads, self.head_dim)
        # the draft's KV cache (its own backend instance) has one layer: id 0
        q = attn.rope_and_store(q, k, v, positions, self.rope.cos, self.rope.sin, 0, fb)
        o = attn.attend(q, 0, fb)  # [T, Hq, D]
        return self.o_proj(o.reshape(t, self.q_size))


class Eagle3DecoderLayer(nn.Module):
    """The single `midlayer`: embeddings and features are normed separately, then joined."""

    def __init__(self, cfg: Eagle3Config, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg, rope)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor,
                fb: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        # embeds, hidden: [T, hidden] -> prenorm residual stream: [T, hidden]
        normed_hidden = self.hidden_norm(hidden)
        residual = normed_hidden if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed_hidden], dim=-1)  # [T, 2*hidden]
        x = self.self_attn(positions, x, fb, attn)
        # add_norm writes the sum into its second argument on CUDA: pass the attention
        # output there, so the caller's `hidden` (often the previous step's prenorm) survives.
        x, residual = self.post_attention_layernorm.add_norm(residual, x)
        return self.mlp(x) + residual


class Eagle3Head(nn.Module):
    def __init__(self, cfg: Eagle3Config, max_positions: int,
                 embed_tokens: nn.Embedding | None = None) -> None:
        """`embed_tokens`: the target's embedding when the checkpoint has none (shared, not
        copied); None builds the head's own [vocab_size, hidden] table."""
        super().__init__()
        self.config = cfg
        self.hidden_size = cfg.hidden_size
        if embed_tokens is None:
            embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens = embed_tokens  # [vocab_size, hidden]
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(cfg, self.rotary)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        # target id = draft id + d2t[draft id]
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        # input_ids, positions: [T]; hidden: target features [T, 3*H_t] or the draft's own
        # previous prenorm [T, H] -> prenorm residual stream [T, H]
        embeds = self.embed_tokens(input_ids)  # [T, H]
        if hidden.shape[-1] != self.hidden_size:
            hidden = self.fc(hidden)  # [T, 3*H_t] -> [T, H]
        return self.midlayer(positions, embeds, hidden, fb, attn)

    def compute_logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        # prenorm: [B, H] (rows selected by the caller) -> [B, draft_vocab] float32
        return self.lm_head(self.norm(prenorm)).float()

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [...] draft-vocabulary ids -> the same shape of target-vocabulary ids (int64)
        ids = ids.long()
        return ids + self.d2t[ids]
