"""Tensor parallelism for the Llama-family models (Megatron-style): which part of each
weight a rank holds, and the layers whose forward needs a collective.

    column-parallel (output rows split)   qkv_proj (by heads), gate_up_proj (intermediate),
                                          lm_head (vocabulary; logits all-gathered)
    row-parallel (input columns split)    o_proj, down_proj: one all-reduce of the output
    vocabulary-parallel embedding         rows [start, start + count); other ids give zeros,
                                          all-reduced
    replicated                            norms, RoPE, the residual stream

KV heads are split like the query heads; with fewer KV heads than ranks each rank keeps the
one KV head its query heads read (replicated on size / num_kv_heads ranks):

    8 q heads, 2 kv heads, 4 ranks:  rank 0: q 0-1 kv 0 | rank 1: q 2-3 kv 0
                                     rank 2: q 4-5 kv 1 | rank 3: q 6-7 kv 1

Data flow: distributed/ builds a TensorParallel per rank -> models/loader.load_model (each
rank reads its slices only: `shard_slices`) -> LlamaForCausalLM (layers.py) -> the
collectives in `comm` (distributed/comm.py) during every forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gearshift.config import ConfigError, ModelConfig


@dataclass(frozen=True, eq=False)
class TensorParallel:
    """One rank's place in the tensor-parallel group."""

    rank: int
    size: int
    # all_reduce / all_gather over the ranks (distributed/comm.DeviceComm); None builds and
    # loads the shapes alone (loader tests)
    comm: Any = None

    def num_heads(self, cfg: ModelConfig) -> int:
        return cfg.num_heads // self.size

    def num_kv_heads(self, cfg: ModelConfig) -> int:
        return max(cfg.num_kv_heads // self.size, 1)

    def first_kv_head(self, cfg: ModelConfig) -> int:
        if cfg.num_kv_heads >= self.size:
            return self.rank * self.num_kv_heads(cfg)
        return self.rank // (self.size // cfg.num_kv_heads)

    def vocab_rows(self, vocab: int) -> tuple[int, int, int]:
        """(first row, rows held, rows allocated): every rank allocates ceil(vocab / size)
        rows so the gathered logits have one shape; the last rank's tail is padding."""
        per_rank = -(-vocab // self.size)
        start = min(self.rank * per_rank, vocab)
        return start, min(per_rank, vocab - start), per_rank

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(x)

    def gather_vocab(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """Each rank's logits [B, V / size] -> the whole row [B, vocab], the same on every
        rank (so every rank samples the same token)."""
        b, per_rank = logits.shape
        parts = self.comm.all_gather(logits.contiguous())  # [size * B, V / size]
        full = parts.view(self.size, b, per_rank).permute(1, 0, 2).reshape(b, -1)
        return full if full.shape[1] == vocab else full[:, :vocab].contiguous()


def check_shardable(cfg: ModelConfig, size: int) -> None:
    """One line naming what `size` ranks cannot split, before anything starts."""
    if size < 1:
        raise ConfigError("tensor_parallel_size must be >= 1")
    kv = cfg.num_kv_heads
    if cfg.num_heads % size:
        raise ConfigError(f"tensor_parallel_size {size} must divide the model's "
                          f"{cfg.num_heads} attention heads")
    if kv % size and size % kv:
        raise ConfigError(f"tensor_parallel_size {size} and the model's {kv} KV heads: one "
                          "must divide the other")
    if cfg.intermediate_size % size:
        raise ConfigError(f"tensor_parallel_size {size} must divide the model's "
                          f"intermediate size {cfg.intermediate_size}")


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the embedding table [V / size, hidden]; the whole lookup after
    one all-reduce. `num_embeddings` is the whole vocabulary, as nn.Embedding's."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp: TensorParallel) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.tp = num_embeddings, embedding_dim, tp
        self.start, self.count, rows = tp.vocab_rows(num_embeddings)
        self.weight = nn.Parameter(torch.empty(rows, embedding_dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [T] -> [T, hidden]: rows other ranks hold are zeros here, filled by the sum
        local = ids - self.start
        outside = (local < 0) | (local >= self.count)
        out = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill_(outside[:, None], 0.0))


def shard_slices(cfg: ModelConfig, tp: TensorParallel) -> dict[str, tuple[int, slice, int, int]]:
    """Checkpoint tensor kind -> (split dim, this rank's slice of the HF tensor along it, the
    row its part starts at in our fused parameter, the HF tensor's whole extent there).
    Kinds: q, k, v (qkv_proj rows, weight and bias), o (o_proj columns), gate, up
    (gate_up_proj rows), down (columns), vocab (embed_tokens / lm_head rows)."""
    hd = cfg.head_dim
    q, kv = tp.num_heads(cfg) * hd, tp.num_kv_heads(cfg) * hd
    k0 = tp.first_kv_head(cfg) * hd
    inter = cfg.intermediate_size // tp.size
    v0, count, _ = tp.vocab_rows(cfg.vocab_size)
    r, full_i = tp.rank, cfg.intermediate_size
    return {
        "q": (0, slice(r * q, (r + 1) * q), 0, cfg.q_size),
        "k": (0, slice(k0, k0 + kv), q, cfg.kv_size),
        "v": (0, slice(k0, k0 + kv), q + kv, cfg.kv_size),
        "o": (1, slice(r * q, (r + 1) * q), 0, cfg.q_size),
        "gate": (0, slice(r * inter, (r + 1) * inter), 0, full_i),
        "up": (0, slice(r * inter, (r + 1) * inter), inter, full_i),
        "down": (1, slice(r * inter, (r + 1) * inter), 0, full_i),
        "vocab": (0, slice(v0, v0 + count), 0, cfg.vocab_size),
    }
