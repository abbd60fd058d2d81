"""Shared building blocks of the decoder models: RMSNorm, rotary embedding, attention
(q/k/v fused into one projection), gated MLP (gate/up fused); with a TensorParallel, each
holds this rank's heads / intermediate channels and all-reduces its output (parallel.py).

Data flow: models/llama.py composes these; Attention hands q/k/v and RotaryEmbedding's
cos/sin tables to the attention backend chosen by the runner (`rope_store_attend`:
rotate, write K/V to the slot pool, attend; the Triton backend's decode does all three in
one kernel). With the norm weights folded into the products after them
(LlamaForCausalLM.fold_norms), every step runs DecoderLayer.forward_fused instead of
forward:

    forward:        add+norm -> qkv -> attn -> o_proj -> add+norm -> gate_up -> down
    forward_fused:  qkv(rms) -> attn -> o_proj(+= r) -> gate_up(rms) -> down(+= r)
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gearshift.attention.base import AttentionBackend
from gearshift.config import ModelConfig, RopeScaling
from gearshift.forward_batch import ForwardBatch
from gearshift.kernels import ops
from gearshift.models.parallel import TensorParallel


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the residual stream between sublayers."""
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


def _inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    dims = torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu")
    inv = 1.0 / theta ** (dims / head_dim)
    if scaling is None:
        return inv
    # Llama 3.1 "llama3" frequency scaling: keep high frequencies, divide low ones by
    # `factor`, interpolate smoothly in between.
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    scaled = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return torch.where(mid, (1 - smooth) * inv / scaling.factor + smooth * inv, scaled)


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE (rotate halves), as in HF Llama/Qwen. cos/sin cached per position."""

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: RopeScaling | None) -> None:
        super().__init__()
        self.head_dim, self.max_positions, self.theta = head_dim, max_positions, theta
        self.scaling = scaling
        self.register_buffer("cos", torch.empty(0), persistent=False)  # [max_pos, D/2] fp32
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self.init_cache()

    def init_cache(self, device: torch.device | str | None = None) -> None:
        """(Re)build the float32 cos/sin tables; the loader calls it after materialising."""
        device = device or self.cos.device
        inv = _inv_freq(self.head_dim, self.theta, self.scaling)
        pos = torch.arange(self.max_positions, dtype=torch.float64, device="cpu")
        freqs = torch.outer(pos, inv)
        self.cos = freqs.cos().float().to(device)
        self.sin = freqs.sin().float().to(device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        # positions: [T]; q: [T, Hq, D]; k: [T, Hkv, D] (may be rotated in place). Attention
        # layers instead pass self.cos / self.sin to AttentionBackend.rope_and_store, which
        # fuses this rotation with the KV-cache write.
        return ops.rope(q, k, positions, self.cos, self.sin)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rope: RotaryEmbedding,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        if tp is not None:  # this rank's heads: qkv column-parallel, o_proj row-parallel
            self.num_heads, self.num_kv_heads = tp.num_heads(cfg), tp.num_kv_heads(cfg)
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.tp = tp
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rope = rope

    def forward(self, positions: torch.Tensor, x: torch.Tensor, fb: ForwardBatch,
                attn: AttentionBackend) -> torch.Tensor:
        # x: [T, hidden]
        o = self.attend_qkv(positions, ops.linear(x, self.qkv_proj), fb, attn)
        out = ops.linear(o, self.o_proj)
        return out if self.tp is None else self.tp.all_reduce(out)  # partial sums per rank

    def attend_qkv(self, positions: torch.Tensor, qkv: torch.Tensor, fb: ForwardBatch,
                   attn: AttentionBackend) -> torch.Tensor:
        """The fused projection's output [T, q + 2 kv] -> attention output [T, q_size]
        (RoPE, K/V into the slot pool, attention), before o_proj."""
        t = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        o = attn.rope_store_attend(q, k, v, positions, self.rope.cos, self.rope.sin,
                                   self.layer_id, fb)
        return o.reshape(t, self.q_size)  # [T, Hq * D]


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, tp: TensorParallel | None = None) -> None:
        super().__init__()
        if tp is not None:  # this rank's share: gate_up column-parallel, down row-parallel
            intermediate //= tp.size
        self.intermediate, self.tp = intermediate, tp
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = ops.linear(ops.gated_linear(x, self.gate_up_proj), self.down_proj)
        return out if self.tp is None else self.tp.all_reduce(out)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rope: RotaryEmbedding,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_id, rope, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, tp)
        self.tp = tp

    def forward(self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None,
                fb: ForwardBatch, attn: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (sublayer output, residual): the residual stream is their sum."""
        if residual is None:
            residual = h
            h = self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm.add_norm(h, residual)
        h = self.self_attn(positions, h, fb, attn)
        h, residual = self.post_attention_layernorm.add_norm(h, residual)
        return self.mlp(h), residual

    def forward_fused(self, positions: torch.Tensor, r: torch.Tensor, fb: ForwardBatch,
                      attn: AttentionBackend) -> None:
        """The same layer on the residual stream `r` [T, hidden], updated in place, for a
        model whose norm weights are folded into qkv_proj / gate_up_proj
        (LlamaForCausalLM.fold_norms): each RMSNorm runs inside the product after it and
        each residual add inside the product before it, so no norm kernel runs between."""
        attn_mod, mlp = self.self_attn, self.mlp
        qkv = ops.rms_linear(r, attn_mod.qkv_proj, self.input_layernorm)
        self._accumulate(attn_mod.attend_qkv(positions, qkv, fb, attn), attn_mod.o_proj, r)
        act = ops.rms_linear(r, mlp.gate_up_proj, self.post_attention_layernorm, gated=True)
        self._accumulate(act, mlp.down_proj, r)

    def _accumulate(self, x: torch.Tensor, layer: nn.Linear, r: torch.Tensor) -> None:
        """r += layer(x); under tensor parallelism each rank's product is a partial sum,
        all-reduced before the add (so no epilogue add inside the GEMM there)."""
        if self.tp is None:
            ops.linear_accumulate(x, layer, r)
        else:
            r.add_(self.tp.all_reduce(ops.linear(x, layer)))
