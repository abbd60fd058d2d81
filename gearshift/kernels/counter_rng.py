"""Counter-based randomness shared by the sampler (runner/sampler.py), its fused kernel
(kernels/sample.py) and speculative verification: the uniform for (request seed, output
index, token id) is an integer hash, so a seeded request draws the same numbers in any
batch, after preemption and recompute, and under CUDA graphs. Plain torch, no Triton.

Data flow: SamplingBatch (seeds, steps) -> seeded_uniform -> the race / acceptance tests.
"""

from __future__ import annotations

import torch

HASH_MUL = 0x45D9F3B  # < 2**27: products of 32-bit values stay inside int64
STEP_OFFSET = 0x9E3779B  # added to the output index before hashing
U_MAX = 1.0 - 2.0**-24  # the largest float32 below 1
MIN_TEMPERATURE = 1e-5  # sampled rows divide by max(T, this)
_M32 = 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer on int64 tensors holding values in [0, 2**32)."""
    x = (((x >> 16) ^ x) * HASH_MUL) & _M32
    x = (((x >> 16) ^ x) * HASH_MUL) & _M32
    return (x >> 16) ^ x


def seeded_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab: int,
                   cols: torch.Tensor | None = None) -> torch.Tensor:
    """[B] seeds in [0, 2**32), [B] steps -> [B, vocab] float32 uniforms in (0, 1),
    deterministic: (hash + 0.5) / 2**32 rounded to float32, capped at U_MAX (the 128 of
    2**32 hashes that would round to 1.0). cols [vocab]: the token id of each column (a
    draft vocabulary draws the target's numbers for its tokens); None: column i is token i."""
    key = hash32(seeds ^ hash32((steps + STEP_OFFSET) & _M32))  # [B]
    ids = torch.arange(vocab, device=seeds.device, dtype=torch.int64) if cols is None else cols
    x = hash32(key[:, None] ^ hash32(ids)[None, :])  # [B, vocab]
    return (x.to(torch.float64) + 0.5).div_(2.0**32).to(torch.float32).clamp_max_(U_MAX)
