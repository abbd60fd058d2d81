"""Fused decode-path kernels (RMSNorm, residual add + RMSNorm, SiLU-and-mul) against their
plain-torch references (dtypes and tolerances: fused_checks.py), and edge cases shared by
every fused op, RoPE included (zero tokens, CUDA-graph replay). RoPE and RoPE + KV-cache
store: test_rope_kernels.py.

On CPU, TRITON_INTERPRET=1 must be set before anything imports triton (tests/kernels/
conftest.py does it); re-decorating these kernels later would not help, because triton's
own helpers (tl.sum) are decorated when triton is first imported.
"""

from __future__ import annotations

import pytest
import torch
from fused_checks import DEVICE, DTYPES, HAS_CUDA, TOKENS, assert_matches, randn, rope_tables

from gearshift.kernels.activation import silu_and_mul, silu_and_mul_ref
from gearshift.kernels.norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)
from gearshift.kernels.rope import apply_rope, apply_rope_ref, rope_and_store_kv

EPS = 1e-6
HIDDEN = [64, 96] + ([4096] if HAS_CUDA else [])


def _norm_weight(n: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return (torch.rand(n, generator=gen) + 0.5).to(device=DEVICE, dtype=dtype)


# ---- rms_norm ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rms_norm_matches_reference(dtype, num_tokens, hidden):
    x = randn(num_tokens, hidden, dtype=dtype) * 3
    w = _norm_weight(hidden, dtype)
    out = rms_norm(x, w, EPS)
    expected = rms_norm_ref(x, w, EPS)
    # A different fp32 summation order can move y by one ulp before the weight: <= 2 ulp.
    assert_matches(out, expected, max_ulp=2)
    if dtype != torch.float32:
        # Rounding y to the input dtype BEFORE the weight (HF order) must be reproduced:
        # the other order would disagree on a large share of elements.
        assert (out == expected).float().mean().item() > 0.95


def test_rms_norm_in_place_and_leading_dims():
    x = randn(2, 3, 5, 64, dtype=torch.float32, seed=1)
    w = _norm_weight(64, torch.float32)
    expected = rms_norm_ref(x, w, EPS)
    out = rms_norm(x, w, EPS, out=x)
    assert out is x
    assert_matches(x, expected)


def test_rms_norm_strided_input_and_mixed_weight_dtype():
    x = randn(64, 5, dtype=torch.float16, seed=14).t()  # [5, 64], column stride 5: copied
    w = _norm_weight(64, torch.float32)  # fp32 weight * fp16 y -> fp32, as in torch
    out = rms_norm(x, w, EPS)
    assert out.dtype == torch.float32
    assert_matches(out, rms_norm_ref(x, w, EPS))


def test_rms_norm_per_head_views_of_fused_qkv():
    """Qwen3 q/k norm: [T, heads, D] views whose token stride is the fused width."""
    t, hq, hkv, d = 5, 4, 2, 64
    qkv = randn(t, (hq + 2 * hkv) * d, dtype=torch.float32, seed=2)
    original = qkv.clone()
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.view(t, hq, d), k.view(t, hkv, d)
    w = _norm_weight(d, torch.float32)
    expected_q, expected_k = rms_norm_ref(q, w, EPS), rms_norm_ref(k, w, EPS)
    fresh = rms_norm(q, w, EPS)
    assert fresh.is_contiguous()
    assert_matches(fresh, expected_q)
    rms_norm(q, w, EPS, out=q)  # in place, inside the fused buffer
    rms_norm(k, w, EPS, out=k)
    assert_matches(q, expected_q)
    assert_matches(k, expected_k)
    assert torch.equal(v, original[:, (hq + hkv) * d:]), "v must stay untouched"


# ---- fused_add_rms_norm --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_fused_add_rms_norm_matches_reference(dtype, num_tokens, hidden):
    x = randn(num_tokens, hidden, dtype=dtype, seed=3)
    residual = randn(num_tokens, hidden, dtype=dtype, seed=4) * 4
    w = _norm_weight(hidden, dtype)
    x_before = x.clone()
    expected_out, expected_residual = fused_add_rms_norm_ref(x, residual.clone(), w, EPS)
    out, new_residual = fused_add_rms_norm(x, residual, w, EPS)
    assert new_residual is residual, "the residual is updated in place"
    assert torch.equal(residual, expected_residual), "x + residual must round like torch"
    assert_matches(out, expected_out, max_ulp=2)
    if dtype != torch.float32:
        assert (out == expected_out).float().mean().item() > 0.95  # cast before the weight
    assert torch.equal(x, x_before), "x is only read unless passed as out"


def test_fused_add_rms_norm_out_into_x():
    x = randn(3, 96, dtype=torch.float32, seed=5)
    residual = randn(3, 96, dtype=torch.float32, seed=6)
    w = _norm_weight(96, torch.float32)
    expected_out, expected_residual = fused_add_rms_norm_ref(x.clone(), residual.clone(), w, EPS)
    out, new_residual = fused_add_rms_norm(x, residual, w, EPS, out=x)
    assert out is x and new_residual is residual
    assert_matches(out, expected_out)
    assert torch.equal(new_residual, expected_residual)


# ---- silu_and_mul --------------------------------------------------------------------------

INTERMEDIATE = [64, 96, 1100] + ([14336] if HAS_CUDA else [])  # 1100: several column blocks


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("intermediate", INTERMEDIATE)
def test_silu_and_mul_matches_reference(dtype, num_tokens, intermediate):
    gate_up = randn(num_tokens, 2 * intermediate, dtype=dtype, seed=12) * 4
    out = silu_and_mul(gate_up)
    assert out.shape == (num_tokens, intermediate)
    assert_matches(out, silu_and_mul_ref(gate_up))


def test_silu_and_mul_into_given_out():
    gate_up = randn(3, 128, dtype=torch.float32, seed=13)
    out = torch.full((3, 64), float("nan"), device=DEVICE)
    assert silu_and_mul(gate_up, out=out) is out
    assert_matches(out, silu_and_mul_ref(gate_up))


# ---- shared edge cases ---------------------------------------------------------------------

def test_zero_tokens_launch_nothing():
    w = _norm_weight(64, torch.float32)
    empty = torch.empty(0, 64, device=DEVICE)
    assert rms_norm(empty, w, EPS).shape == (0, 64)
    out, residual = fused_add_rms_norm(empty, empty.clone(), w, EPS)
    assert out.shape == residual.shape == (0, 64)
    cos, sin = rope_tables(8, 64)
    q, k = apply_rope(torch.empty(0, 2, 64, device=DEVICE), torch.empty(0, 1, 64, device=DEVICE),
                      torch.empty(0, dtype=torch.int64, device=DEVICE), cos, sin)
    assert q.shape == (0, 2, 64) and k.shape == (0, 1, 64)
    k_cache = torch.zeros(3, 1, 64, device=DEVICE)
    assert rope_and_store_kv(q, k, k.clone(), q.new_empty(0, dtype=torch.int64), cos, sin, k_cache,
                             k_cache.clone(), q.new_empty(0, dtype=torch.int64)) is q
    assert silu_and_mul(torch.empty(0, 128, device=DEVICE)).shape == (0, 64)


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs need CUDA")
def test_all_ops_replay_in_a_cuda_graph():
    """Captured once, replayed on new inputs: no host sync, no stale launch arguments."""
    t, hq, hkv, d, hidden, inter = 4, 8, 2, 128, 512, 1024
    dtype = torch.bfloat16
    h = randn(t, hidden, dtype=dtype, seed=20)
    residual = randn(t, hidden, dtype=dtype, seed=21)
    qkv = randn(t, (hq + 2 * hkv) * d, dtype=dtype, seed=22)
    gate_up = randn(t, 2 * inter, dtype=dtype, seed=23)
    positions = torch.arange(t, device=DEVICE)
    w = _norm_weight(hidden, dtype)
    cos, sin = rope_tables(64, d)

    def step():
        q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        apply_rope(q.view(t, hq, d), k.view(t, hkv, d), positions, cos, sin)
        normed, _ = fused_add_rms_norm(h, residual, w, EPS)
        return normed, rms_norm(normed, w, EPS), silu_and_mul(gate_up)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        normed, normed_twice, act = step()

    for seed in (30, 31):
        h.copy_(randn(t, hidden, dtype=dtype, seed=seed))
        residual.copy_(randn(t, hidden, dtype=dtype, seed=seed + 10))
        qkv.copy_(randn(t, (hq + 2 * hkv) * d, dtype=dtype, seed=seed + 20))
        gate_up.copy_(randn(t, 2 * inter, dtype=dtype, seed=seed + 30))
        positions.copy_(torch.arange(seed, seed + t, device=DEVICE))
        q, k, _ = qkv.clone().split([hq * d, hkv * d, hkv * d], dim=-1)
        exp_q, exp_k = apply_rope_ref(q.view(t, hq, d), k.view(t, hkv, d), positions, cos, sin)
        exp_normed, exp_residual = fused_add_rms_norm_ref(h, residual.clone(), w, EPS)
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(qkv[:, :hq * d].view(t, hq, d), exp_q)
        assert_matches(qkv[:, hq * d:(hq + hkv) * d].view(t, hkv, d), exp_k)
        assert torch.equal(residual, exp_residual)
        assert_matches(normed, exp_normed, max_ulp=2)
        assert_matches(normed_twice, rms_norm_ref(normed, w, EPS), max_ulp=2)
        assert_matches(act, silu_and_mul_ref(gate_up))
