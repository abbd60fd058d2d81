"""Shared by the fused-op kernel tests (test_fused_ops.py, test_rope_kernels.py): device,
dtypes, the ulp comparison with the torch references, seeded inputs and RoPE tables.

fp32 runs everywhere (the Triton interpreter on CPU), fp16 everywhere (the interpreter
rounds fp16 like the GPU), bf16 on CUDA only (the interpreter truncates bf16 instead of
rounding to nearest).
"""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16",
                 marks=pytest.mark.skipif(not HAS_CUDA, reason="bf16 needs CUDA")),
]
TOKENS = [1, 3, 17]


def _ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """16-bit floats as integers whose difference counts ulps (sign-magnitude -> ordered)."""
    bits = t.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(bits >= 0, bits, -32768 - bits)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, max_ulp: int = 1) -> None:
    """fp32: within 1e-5. fp16/bf16: at most `max_ulp` units in the last place apart."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
        return
    ulps = (_ordered_bits(actual) - _ordered_bits(expected)).abs()
    assert ulps.max().item() <= max_ulp, f"{ulps.max().item()} ulp apart"


def randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)


def rope_tables(max_pos: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
    return freqs.cos().float().to(DEVICE), freqs.sin().float().to(DEVICE)
