"""Kernel tier: Triton kernels against plain torch. Without CUDA they run under the Triton
interpreter (TRITON_INTERPRET=1), which must be set before any @triton.jit decorator runs.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
    # A test collected earlier may already have imported the kernels compiled for a GPU:
    # re-decorate them under the interpreter (order matters: kernels before the backend).
    for _name in ("gearshift.kernels.decode", "gearshift.kernels.extend",
                  "gearshift.attention.triton_backend"):
        if _name in sys.modules:
            importlib.reload(sys.modules[_name])

from gearshift.attention.base import KVCache  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"


def build_slot_pool(seq_lens: list[int], num_kv_heads: int, head_dim: int, *,
                    num_layers: int = 1, spare_slots: int = 13, dtype: torch.dtype = torch.float32,
                    seed: int = 0) -> tuple[KVCache, torch.Tensor]:
    """A KVCache full of random K/V whose requests own shuffled, non-contiguous slots.

    Returns the cache and req_pool_indices [bs] int64 (rows 1..bs in a shuffled order;
    row 0 stays the dummy row pointing at dummy slot 0).
    """
    gen = torch.Generator().manual_seed(seed)
    bs, total = len(seq_lens), sum(seq_lens)
    max_len = max(seq_lens) + 3
    kv = KVCache.allocate(num_layers, total + spare_slots, num_kv_heads, head_dim,
                          max_num_seqs=bs + 2, max_model_len=max_len, dtype=dtype, device="cpu")
    kv.k.copy_(torch.randn(kv.k.shape, generator=gen))
    kv.v.copy_(torch.randn(kv.v.shape, generator=gen))
    slots = torch.randperm(total + spare_slots, generator=gen)[:total] + 1  # never slot 0
    rows = torch.randperm(bs, generator=gen) + 1
    start = 0
    for row, n in zip(rows.tolist(), seq_lens, strict=True):
        kv.req_to_token[row, :n] = slots[start:start + n].int()
        start += n
    kv = KVCache(kv.k.to(DEVICE), kv.v.to(DEVICE), kv.req_to_token.to(DEVICE))
    return kv, rows.to(DEVICE)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def slot_pool():
    """Factory: build_slot_pool(seq_lens, num_kv_heads, head_dim, **options)."""
    return build_slot_pool
