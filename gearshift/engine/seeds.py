"""Request seeds: every request samples with a seed, its own or one drawn at arrival, and
the seed is reported (RequestOutput.seed; the server's response) so that any response can
be replayed: the same prompt and parameters with that seed give the same text, with or
without speculation (in its coupled mode), in any batch.

Data flow: Engine.add_request -> draw_seed (no seed given) -> mix_seed -> Request.sampling_seed
-> the sampler's counter-based numbers (kernels/counter_rng.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the server reads SEED_BOUND without loading torch
    import torch

SEED_BOUND = 2**31  # drawn seeds lie in [0, SEED_BOUND): short to report, any int64 replays


def draw_seed(rng: torch.Generator) -> int:
    """A fresh seed from the engine's generator (seeded by EngineConfig.seed: an engine
    draws the same seeds in the same order)."""
    import torch

    return int(torch.randint(0, SEED_BOUND, (1,), generator=rng))


def mix_seed(seed: int) -> int:
    """Any 64-bit seed -> 32 bits, deterministically (the sampler hashes it further)."""
    return (seed ^ (seed >> 32) ^ (seed >> 64)) & 0xFFFFFFFF
