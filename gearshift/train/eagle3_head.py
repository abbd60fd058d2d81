"""The EAGLE-3 draft head as a trainable torch module, and its files in the public layout.

Data flow: eagle3.py (training loop) -> Eagle3Trainable(ids, target features) -> logits of
S draft steps; save_head -> config.json + model.safetensors -> models/eagle3_loader.py.

Training-time test (TTT), indexed by window position i (tokens x_0..x_{T-1}, f_i = target
features at i, p_i = target next-token distribution at i, i.e. over x_{i+1}):

    step 1   row i: (emb(x_{i+1}), fc(f_i)),  position i,      predicts p_{i+1}
    step s   row i: (emb(x_{i+s}), h_{s-1,i}), position i+s-1, predicts p_{i+s}
             (h_{s-1,i}: the draft's own prenorm output of step s-1 at the same row)

Attention of a step-s row i -- exactly what the engine's draft steps see
(speculative/proposers/expand.py: the depth-s row sits at position L+s-2 and attends to the
committed draft KV plus its ancestors' scratch slots):

    keys:  step-1 rows 0..i (causal)  |  step-2 row i | ... | step-s row i (the diagonal)
    query step 1, row i:  K1[0..i]
    query step 3, row i:  K1[0..i] , K2[i] , K3[i]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, slots=True)
class HeadShape:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, int, int]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _linear(n_in: int, n_out: int) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=False)


class Eagle3Trainable(nn.Module):
    """The draft head as a training module. Its state_dict keys are the public layout's
    (`midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`); the embedding is the target's, frozen,
    held outside the state_dict."""

    def __init__(self, shape: HeadShape, embed: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, draft_ids: torch.Tensor) -> None:
        super().__init__()
        self.shape = shape
        h, d = shape.hidden_size, shape.head_dim
        self.embed = embed.detach()  # [vocab, H] frozen, not a parameter
        self.cos, self.sin = cos, sin  # [max_pos, D/2] fp32 (gearshift RotaryEmbedding tables)
        self.fc = _linear(3 * shape.target_hidden_size, h)
        self.midlayer = nn.Module()
        m = self.midlayer
        m.input_layernorm = RMSNorm(h, shape.rms_norm_eps)
        m.hidden_norm = RMSNorm(h, shape.rms_norm_eps)
        m.post_attention_layernorm = RMSNorm(h, shape.rms_norm_eps)
        m.self_attn = nn.Module()
        m.self_attn.q_proj = _linear(2 * h, shape.num_heads * d)
        m.self_attn.k_proj = _linear(2 * h, shape.num_kv_heads * d)
        m.self_attn.v_proj = _linear(2 * h, shape.num_kv_heads * d)
        m.self_attn.o_proj = _linear(shape.num_heads * d, h)
        m.mlp = nn.Module()
        m.mlp.gate_proj = _linear(h, shape.intermediate_size)
        m.mlp.up_proj = _linear(h, shape.intermediate_size)
        m.mlp.down_proj = _linear(shape.intermediate_size, h)
        self.norm = RMSNorm(h, shape.rms_norm_eps)
        self.lm_head = _linear(h, shape.draft_vocab_size)
        # target id = draft id + d2t[draft id]
        self.register_buffer("d2t", draft_ids - torch.arange(shape.draft_vocab_size))

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [B, heads, T, D]; positions: [T] -> neox-style rotation (rotate halves)
        cos, sin = self.cos[positions], self.sin[positions]  # [T, D/2]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def _attention(self, x: torch.Tensor, positions: torch.Tensor,
                   cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        # x: [B, T, 2H] -> [B, T, H]; cache: (k, v) [B, Hkv, T, D] of the previous steps
        b, t, _ = x.shape
        s, attn = self.shape, self.midlayer.self_attn
        q = attn.q_proj(x).view(b, t, s.num_heads, s.head_dim).transpose(1, 2)  # [B, Hq, T, D]
        k = attn.k_proj(x).view(b, t, s.num_kv_heads, s.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        v = attn.v_proj(x).view(b, t, s.num_kv_heads, s.head_dim).transpose(1, 2)
        q, k = self._rope(q, positions), self._rope(k, positions)
        cache.append((k, v))
        group = s.num_heads // s.num_kv_heads
        qg = q.view(b, s.num_kv_heads, group, t, s.head_dim)  # q head h uses kv head h // group
        scale = s.head_dim ** -0.5
        k1, v1 = cache[0]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = [(qg @ k1[:, :, None].transpose(-1, -2) * scale).masked_fill(~causal, -torch.inf)]
        for kj, _ in cache[1:]:  # the diagonal: row i of every later step sees only row i
            scores.append((qg * kj[:, :, None]).sum(-1, keepdim=True) * scale)  # [B,Hkv,G,T,1]
        probs = torch.cat(scores, dim=-1).softmax(-1)  # [B, Hkv, G, T, T + steps - 1]
        out = probs[..., :t] @ v1[:, :, None]  # [B, Hkv, G, T, D]
        for j, (_, vj) in enumerate(cache[1:]):
            out = out + probs[..., t + j: t + j + 1] * vj[:, :, None]
        out = out.reshape(b, s.num_heads, t, s.head_dim).transpose(1, 2).reshape(b, t, -1)
        return attn.o_proj(out)

    def step(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One draft step (gearshift.models.eagle3 semantics). ids: [B, T]; hidden: target
        features [B, T, 3*H_t] or the previous step's prenorm [B, T, H] -> prenorm [B, T, H]."""
        m = self.midlayer
        if hidden.shape[-1] != self.shape.hidden_size:
            hidden = self.fc(hidden)
        embeds = self.embed[ids]  # [B, T, H]
        x = torch.cat([m.input_layernorm(embeds), m.hidden_norm(hidden)], dim=-1)  # [B, T, 2H]
        residual = self._attention(x, positions, cache) + hidden
        x = m.post_attention_layernorm(residual)
        return m.mlp.down_proj(F.silu(m.mlp.gate_proj(x)) * m.mlp.up_proj(x)) + residual

    def logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(prenorm))  # [..., draft_vocab]

    def forward(self, ids: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """TTT forward. ids: [B, T] tokens x_0..; features: [B, T, 3*H_t]. Returns the logits
        [B, T, draft_vocab] of steps 1..`steps`; step s row i predicts token x_{i+s+1}."""
        t = ids.shape[1]
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        hidden, out = features, []
        base = torch.arange(t, device=ids.device)
        for s in range(1, steps + 1):
            shifted = F.pad(ids[:, s:], (0, s))  # row i: x_{i+s} (0 past the window's end)
            hidden = self.step(shifted, hidden, base + (s - 1), cache)
            out.append(self.logits(hidden))
        return out


def head_config(shape: HeadShape, target_dir: Path, dtype: str = "float32") -> dict:
    """config.json of the public layout; RoPE and max positions are the target's."""
    tcfg = json.loads((target_dir / "config.json").read_text())
    rope = {k: tcfg[k] for k in ("rope_theta", "rope_scaling", "rope_parameters")
            if tcfg.get(k) is not None}
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "num_hidden_layers": 1, "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_attention_heads": shape.num_heads, "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim, "hidden_act": "silu", "rms_norm_eps": shape.rms_norm_eps,
        **rope, "max_position_embeddings": tcfg.get("max_position_embeddings", 2048),
        "vocab_size": shape.vocab_size, "draft_vocab_size": shape.draft_vocab_size,
        "target_hidden_size": shape.target_hidden_size, "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(shape.aux_layer_ids),
                         "use_aux_hidden_state": True},
    }


def save_head(head: Eagle3Trainable, target_dir: Path, out: Path, dtype: str,
              report: dict | None = None) -> None:
    """config.json + model.safetensors (+ training.json) in the public EAGLE-3 layout."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v if k == "d2t" else v.to(getattr(torch, dtype))).contiguous()
               for k, v in head.state_dict().items()}
    t2d = torch.zeros(head.shape.vocab_size, dtype=torch.bool)
    t2d[torch.arange(head.shape.draft_vocab_size) + head.d2t] = True
    tensors["t2d"] = t2d
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = head_config(head.shape, target_dir, dtype)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if report is not None:
        (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
