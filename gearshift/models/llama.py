"""Llama-family causal LMs (Llama 2/3/3.1/3.2, Qwen2/2.5, Qwen3) over the slot KV cache.

Data flow: ModelRunner calls `model(input_ids, positions, fb, attn)` -> hidden states
[T, hidden]; then `compute_logits(hidden[fb.logits_indices])`. The differences between
the families are config flags (qkv bias, q/k norm, RoPE scaling), not separate classes.
"""

from __future__ import annotations

import torch
from torch import nn

from gearshift.attention.base import AttentionBackend
from gearshift.config import ModelConfig
from gearshift.forward_batch import ForwardBatch
from gearshift.kernels.ops import linear
from gearshift.models.layers import DecoderLayer, RMSNorm, RotaryEmbedding
from gearshift.models.parallel import TensorParallel, VocabParallelEmbedding


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.tp = tp  # None: the whole model; else this rank's part (models/parallel.py)
        if tp is None:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        else:  # this rank's rows of the vocabulary; compute_logits gathers the rest
            self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        rope = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.rotary = rope
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rope, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, self.embed_tokens.weight.shape[0], bias=False)
        # the heads this rank attends with: its KV cache and attention workspaces hold these
        self.num_heads = tp.num_heads(cfg) if tp else cfg.num_heads
        self.num_kv_heads = tp.num_kv_heads(cfg) if tp else cfg.num_kv_heads
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.norms_folded = False  # fold_norms(): every step then takes DecoderLayer.forward_fused

    @torch.no_grad()
    def fold_norms(self) -> None:
        """Fold each layer's input / post-attention RMSNorm weight into the product that
        follows it (qkv_proj, gate_up_proj: W * g over the input dim, rounded once to the
        weight dtype) and set the norm weights to one. Same model; from then on every
        forward runs each norm inside that product and each residual add inside the
        product before it (DecoderLayer.forward_fused). Up to skinny_select.MAX_ROWS tokens
        the skinny kernels do both in one launch where the chooser takes them; larger
        steps run cuBLAS with the norm kernel first (RMSNorm alone: x is already the
        residual stream) and the add in cuBLAS's epilogue (addmm_), which measured a little
        faster than the add + RMSNorm kernels there."""
        if self.norms_folded:
            return
        for layer in self.layers:
            for norm, lin in ((layer.input_layernorm, layer.self_attn.qkv_proj),
                              (layer.post_attention_layernorm, layer.mlp.gate_up_proj)):
                w = lin.weight
                w.copy_((w.float() * norm.weight.float()[None, :]).to(w.dtype))
                norm.weight.fill_(1.0)
        self.norms_folded = True

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch,
                attn: AttentionBackend, capture: tuple[int, ...] = ()):
        """input_ids, positions: [T] -> residual stream before the final norm [T, hidden].
        With `capture` (layer ids), also the residual stream after each of those layers,
        concatenated: [T, len(capture) * hidden] (EAGLE-3 features)."""
        h, residual = self.embed_tokens(input_ids), None
        aux: dict[int, torch.Tensor] = {}
        if self.norms_folded:
            for i, layer in enumerate(self.layers):  # h: the residual stream, in place
                layer.forward_fused(positions, h, fb, attn)
                if i in capture:
                    aux[i] = h.clone()
            return (h, torch.cat([aux[i] for i in capture], dim=-1)) if capture else h
        for i, layer in enumerate(self.layers):
            h, residual = layer(positions, h, residual, fb, attn)
            if i in capture:
                aux[i] = h + residual
        if capture:
            return h + residual, torch.cat([aux[i] for i in capture], dim=-1)
        return h + residual

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None,
                       mm_out: torch.Tensor | None = None, fp32: bool = True) -> torch.Tensor:
        # hidden: [B, hidden] (rows selected by logits_indices) -> logits: [B, vocab] float32
        # (`out`: written there, the fp32 conversion in the same pass; `mm_out`: [B, vocab]
        # in the model dtype for the product itself, so that no new one is allocated).
        # fp32=False: the product in the model dtype, for the sampler, which converts each
        # logit to fp32 as it reads it (the same tokens without a [B, vocab] fp32 copy).
        # The product goes through ops.linear: on CUDA the skinny GEMM where it measured
        # faster than cuBLAS (the 8B's lm_head at 64 rows).
        x = self.norm(hidden)
        if self.tp is not None:  # every rank gets the whole row: all sample the same token
            logits = self.tp.gather_vocab(linear(x, self.lm_head), self.config.vocab_size)
            if out is not None:
                return out.copy_(logits)
            return logits.float() if fp32 else logits
        if out is None:
            logits = linear(x, self.lm_head)
            return logits.float() if fp32 else logits
        return out.copy_(linear(x, self.lm_head, out=mm_out if self.lm_head.bias is None else None))
