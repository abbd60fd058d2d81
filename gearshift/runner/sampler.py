"""Token sampling without host synchronisation: greedy, temperature, top-k, top-p.

Randomness is counter-based: the uniform for (request seed, output index, token id) is an
integer hash, so a seeded request yields the same tokens whatever batch it runs in, after
preemption and recompute, and under CUDA graphs. Sampling uses the exponential race
(argmax of p / Exp(1)), which draws exactly from p without a cumulative-sum search.

Data flow: BatchBuilder -> SamplingBatch; ModelRunner: logits -> Sampler -> token ids [B].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B  # < 2**27: products of 32-bit values stay inside int64


@dataclass(slots=True)
class SamplingBatch:
    temperatures: torch.Tensor  # [B] float32; 0 = greedy          set by BatchBuilder
    top_p: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64; -1 = off
    seeds: torch.Tensor  # [B] int64 (32-bit values)
    steps: torch.Tensor  # [B] int64: index of the output token being sampled
    all_greedy: bool  # host flags from the plan: skip work no request needs
    any_greedy: bool
    need_top_k: bool
    need_top_p: bool


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer on int64 tensors holding values in [0, 2**32)."""
    x = (((x >> 16) ^ x) * _MUL) & _M32
    x = (((x >> 16) ^ x) * _MUL) & _M32
    return (x >> 16) ^ x


def seeded_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B] seeds, [B] steps -> [B, vocab] float32 uniforms in (0, 1), deterministic."""
    key = hash32(seeds ^ hash32((steps + 0x9E3779B) & _M32))  # [B]
    ids = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    x = hash32(key[:, None] ^ hash32(ids)[None, :])  # [B, vocab]
    return (x.to(torch.float64) + 0.5).div_(2.0**32).to(torch.float32)


def apply_top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                      need_top_k: bool, need_top_p: bool) -> torch.Tensor:
    """Zero the probabilities outside each row's top-k / nucleus. probs: [B, V]."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = torch.zeros_like(sorted_p, dtype=torch.bool)
    if need_top_k:
        rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
        k = torch.where(top_k > 0, top_k, probs.shape[-1])[:, None]
        drop |= rank >= k
    if need_top_p:
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass of strictly better tokens
        drop |= before >= top_p[:, None]
    drop[:, 0] = False  # always keep the most likely token
    return probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))


def sample(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """logits: [B, V] float32 -> token ids [B] int64."""
    greedy = logits.argmax(dim=-1)
    if sb.all_greedy:
        return greedy
    temps = sb.temperatures.clamp_min(1e-5)[:, None]
    probs = torch.softmax(logits / temps, dim=-1)
    if sb.need_top_k or sb.need_top_p:
        probs = apply_top_k_top_p(probs, sb.top_k, sb.top_p, sb.need_top_k, sb.need_top_p)
    exp = -torch.log(seeded_uniform(sb.seeds, sb.steps, logits.shape[-1]))
    sampled = (probs / exp).argmax(dim=-1)
    if sb.any_greedy:
        sampled = torch.where(sb.temperatures == 0, greedy, sampled)
    return sampled
