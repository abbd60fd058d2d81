"""Fused decode-path kernels (RMSNorm, residual add + RMSNorm, RoPE, RoPE + KV-cache store,
SiLU-and-mul) against
their plain-torch references: fp32 everywhere (Triton interpreter on CPU), fp16 everywhere
(the interpreter rounds fp16 like the GPU), bf16 on CUDA only (the interpreter truncates
bf16 instead of rounding to nearest).

On CPU, TRITON_INTERPRET=1 must be set before anything imports triton (tests/kernels/
conftest.py does it); re-decorating these kernels later would not help, because triton's
own helpers (tl.sum) are decorated when triton is first imported.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gearshift.attention.base import KVCache
from gearshift.attention.torch_backend import TorchBackend
from gearshift.attention.triton_backend import TritonBackend
from gearshift.kernels.activation import silu_and_mul, silu_and_mul_ref
from gearshift.kernels.norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)
from gearshift.kernels.rope import apply_rope, apply_rope_ref, rope_and_store_kv

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
EPS = 1e-6
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16",
                 marks=pytest.mark.skipif(not HAS_CUDA, reason="bf16 needs CUDA")),
]
TOKENS = [1, 3, 17]
HIDDEN = [64, 96] + ([4096] if HAS_CUDA else [])


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


def _randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)


def _norm_weight(n: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return (torch.rand(n, generator=gen) + 0.5).to(device=DEVICE, dtype=dtype)


# ---- rms_norm ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rms_norm_matches_reference(dtype, num_tokens, hidden):
    x = _randn(num_tokens, hidden, dtype=dtype) * 3
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
    x = _randn(2, 3, 5, 64, dtype=torch.float32, seed=1)
    w = _norm_weight(64, torch.float32)
    expected = rms_norm_ref(x, w, EPS)
    out = rms_norm(x, w, EPS, out=x)
    assert out is x
    assert_matches(x, expected)


def test_rms_norm_strided_input_and_mixed_weight_dtype():
    x = _randn(64, 5, dtype=torch.float16, seed=14).t()  # [5, 64], column stride 5: copied
    w = _norm_weight(64, torch.float32)  # fp32 weight * fp16 y -> fp32, as in torch
    out = rms_norm(x, w, EPS)
    assert out.dtype == torch.float32
    assert_matches(out, rms_norm_ref(x, w, EPS))


def test_rms_norm_per_head_views_of_fused_qkv():
    """Qwen3 q/k norm: [T, heads, D] views whose token stride is the fused width."""
    t, hq, hkv, d = 5, 4, 2, 64
    qkv = _randn(t, (hq + 2 * hkv) * d, dtype=torch.float32, seed=2)
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
    x = _randn(num_tokens, hidden, dtype=dtype, seed=3)
    residual = _randn(num_tokens, hidden, dtype=dtype, seed=4) * 4
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
    x = _randn(3, 96, dtype=torch.float32, seed=5)
    residual = _randn(3, 96, dtype=torch.float32, seed=6)
    w = _norm_weight(96, torch.float32)
    expected_out, expected_residual = fused_add_rms_norm_ref(x.clone(), residual.clone(), w, EPS)
    out, new_residual = fused_add_rms_norm(x, residual, w, EPS, out=x)
    assert out is x and new_residual is residual
    assert_matches(out, expected_out)
    assert torch.equal(new_residual, expected_residual)


# ---- apply_rope ----------------------------------------------------------------------------

def _rope_tables(max_pos: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
    return freqs.cos().float().to(DEVICE), freqs.sin().float().to(DEVICE)


ROPE_SHAPES = [(4, 2, 64), (3, 1, 96)] + ([(32, 8, 128)] if HAS_CUDA else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim", ROPE_SHAPES)
def test_apply_rope_in_place_on_fused_qkv_views(dtype, num_tokens, num_q_heads, num_kv_heads,
                                                head_dim):
    t, hq, hkv, d = num_tokens, num_q_heads, num_kv_heads, head_dim
    qkv = _randn(t, (hq + 2 * hkv) * d, dtype=dtype, seed=8) * 2  # [T, fused width]
    original = qkv.clone()
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.view(t, hq, d), k.view(t, hkv, d)  # token stride = fused width
    cos, sin = _rope_tables(4096, d)
    gen = torch.Generator().manual_seed(9)
    positions = torch.randint(0, 4096, (t,), generator=gen).to(DEVICE)
    expected_q, expected_k = apply_rope_ref(q, k, positions, cos, sin)

    q_out, k_out = apply_rope(q, k, positions, cos, sin)
    assert q_out is q and k_out is k, "rotated in place"
    assert_matches(q, expected_q)
    assert_matches(k, expected_k)
    assert torch.equal(v, original[:, (hq + hkv) * d:]), "v must stay untouched"


def test_apply_rope_int32_positions_and_position_zero():
    q = _randn(3, 2, 64, dtype=torch.float32, seed=10)
    k = _randn(3, 1, 64, dtype=torch.float32, seed=11)
    cos, sin = _rope_tables(16, 64)
    positions = torch.tensor([0, 15, 0], dtype=torch.int32, device=DEVICE)
    q0, k0 = q.clone(), k.clone()
    expected_q, expected_k = apply_rope_ref(q, k, positions.long(), cos, sin)
    apply_rope(q, k, positions, cos, sin)
    assert_matches(q, expected_q)
    assert_matches(k, expected_k)
    assert torch.equal(q[0], q0[0]) and torch.equal(k[2], k0[2]), "position 0 is the identity"


# ---- rope_and_store_kv ---------------------------------------------------------------------

STORE_SHAPES = [(4, 2, 64), (4, 2, 128), (3, 1, 96)] + ([(32, 8, 128)] if HAS_CUDA else [])
NUM_SLOTS = 40


def _rope_store_case(t: int, hq: int, hkv: int, d: int, dtype: torch.dtype, seed: int):
    """(qkv [T, fused width], k_pool, v_pool [2, NUM_SLOTS + 1, Hkv, D] of random values,
    positions [T] int64, out_cache_loc [T] int64: distinct scattered slots, never 0)."""
    qkv = _randn(t, (hq + 2 * hkv) * d, dtype=dtype, seed=seed) * 2
    k_pool = _randn(2, NUM_SLOTS + 1, hkv, d, dtype=dtype, seed=seed + 1)
    v_pool = _randn(2, NUM_SLOTS + 1, hkv, d, dtype=dtype, seed=seed + 2)
    gen = torch.Generator().manual_seed(seed + 3)
    positions = torch.randint(0, 4096, (t,), generator=gen).to(DEVICE)
    out_cache_loc = (torch.randperm(NUM_SLOTS, generator=gen)[:t] + 1).to(DEVICE)
    return qkv, k_pool, v_pool, positions, out_cache_loc


def _split_qkv(qkv: torch.Tensor, hq: int, hkv: int, d: int):
    t = qkv.shape[0]
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)  # token stride = fused width


def _expected_rope_store(q, k, v, positions, cos, sin, k_cache, v_cache, out_cache_loc):
    """The unfused path: apply_rope_ref, then index_copy_ of k and v (out of place)."""
    exp_q, exp_k = apply_rope_ref(q, k, positions, cos, sin)
    exp_kc = k_cache.clone().index_copy_(0, out_cache_loc, exp_k)
    exp_vc = v_cache.clone().index_copy_(0, out_cache_loc, v)
    return exp_q, exp_kc, exp_vc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 5])
@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim", STORE_SHAPES)
def test_rope_and_store_kv_matches_rope_then_index_copy(dtype, num_tokens, num_q_heads,
                                                        num_kv_heads, head_dim):
    t, hq, hkv, d = num_tokens, num_q_heads, num_kv_heads, head_dim
    qkv, k_pool, v_pool, positions, loc = _rope_store_case(t, hq, hkv, d, dtype, seed=40)
    q, k, v = _split_qkv(qkv, hq, hkv, d)
    cos, sin = _rope_tables(4096, d)
    original, k_pool0, v_pool0 = qkv.clone(), k_pool.clone(), v_pool.clone()
    exp_q, exp_kc, exp_vc = _expected_rope_store(q, k, v, positions, cos, sin, k_pool[1],
                                                 v_pool[1], loc)

    out = rope_and_store_kv(q, k, v, positions, cos, sin, k_pool[1], v_pool[1], loc)
    assert out is q, "q is rotated in place"
    assert_matches(q, exp_q)
    assert_matches(k_pool[1], exp_kc)
    assert torch.equal(v_pool[1], exp_vc), "v is copied bit for bit"
    untouched = torch.ones(NUM_SLOTS + 1, dtype=torch.bool, device=DEVICE)
    untouched[loc] = False
    assert torch.equal(k_pool[1][untouched], k_pool0[1][untouched]), "other slots untouched"
    assert torch.equal(v_pool[1][untouched], v_pool0[1][untouched])
    assert torch.equal(k_pool[0], k_pool0[0]) and torch.equal(v_pool[0], v_pool0[0]), \
        "other layers untouched"
    assert torch.equal(qkv[:, hq * d:], original[:, hq * d:]), "k and v views only read"


def test_rope_and_store_kv_int32_positions_and_dummy_slot_rows():
    """Padded CUDA-graph rows all write dummy slot 0; real rows keep their own slots."""
    hq, hkv, d = 4, 2, 64
    qkv, k_pool, v_pool, _, _ = _rope_store_case(4, hq, hkv, d, torch.float32, seed=50)
    q, k, v = _split_qkv(qkv, hq, hkv, d)
    cos, sin = _rope_tables(64, d)
    positions = torch.tensor([0, 63, 0, 0], dtype=torch.int32, device=DEVICE)
    loc = torch.tensor([7, 3, 0, 0], dtype=torch.int64, device=DEVICE)
    k_row0 = k[0].clone()
    exp_q, exp_kc, exp_vc = _expected_rope_store(q, k, v, positions.long(), cos, sin, k_pool[0],
                                                 v_pool[0], loc)
    rope_and_store_kv(q, k, v, positions, cos, sin, k_pool[0], v_pool[0], loc)
    assert_matches(q, exp_q)
    assert_matches(k_pool[0, 1:], exp_kc[1:])  # slot 0 takes either padded row's k
    assert torch.equal(v_pool[0, 1:], exp_vc[1:])
    assert torch.equal(k_pool[0, 7], k_row0), "position 0 is the identity"


@pytest.mark.parametrize("backend_cls", [TorchBackend, TritonBackend])
def test_backend_rope_and_store_equals_rotate_then_store_kv(backend_cls):
    """The contract the layers use: rope_and_store == rotate (reference), then store_kv. On
    CUDA the Triton backend takes the fused kernel; elsewhere both take the default path."""
    hq, hkv, d, t = 4, 2, 64, 3
    qkv, k_pool, v_pool, positions, loc = _rope_store_case(t, hq, hkv, d, torch.float32, seed=60)
    cos, sin = _rope_tables(4096, d)
    kv = KVCache(k_pool.clone(), v_pool.clone(), torch.zeros(1, 1, dtype=torch.int32))
    kv_ref = KVCache(k_pool.clone(), v_pool.clone(), kv.req_to_token)
    fb = SimpleNamespace(out_cache_loc=loc)  # all that storing reads
    q, k, v = _split_qkv(qkv.clone(), hq, hkv, d)
    rq, rk = apply_rope_ref(q, k, positions, cos, sin)
    TorchBackend(kv_ref, 0.125).store_kv(rk, v, 1, fb)

    out = backend_cls(kv, 0.125).rope_and_store(q, k, v, positions, cos, sin, 1, fb)
    assert_matches(out, rq)
    assert_matches(kv.k, kv_ref.k)
    assert torch.equal(kv.v, kv_ref.v)


# ---- silu_and_mul --------------------------------------------------------------------------

INTERMEDIATE = [64, 96, 1100] + ([14336] if HAS_CUDA else [])  # 1100: several column blocks


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("intermediate", INTERMEDIATE)
def test_silu_and_mul_matches_reference(dtype, num_tokens, intermediate):
    gate_up = _randn(num_tokens, 2 * intermediate, dtype=dtype, seed=12) * 4
    out = silu_and_mul(gate_up)
    assert out.shape == (num_tokens, intermediate)
    assert_matches(out, silu_and_mul_ref(gate_up))


def test_silu_and_mul_into_given_out():
    gate_up = _randn(3, 128, dtype=torch.float32, seed=13)
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
    cos, sin = _rope_tables(8, 64)
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
    h = _randn(t, hidden, dtype=dtype, seed=20)
    residual = _randn(t, hidden, dtype=dtype, seed=21)
    qkv = _randn(t, (hq + 2 * hkv) * d, dtype=dtype, seed=22)
    gate_up = _randn(t, 2 * inter, dtype=dtype, seed=23)
    positions = torch.arange(t, device=DEVICE)
    w = _norm_weight(hidden, dtype)
    cos, sin = _rope_tables(64, d)

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
        h.copy_(_randn(t, hidden, dtype=dtype, seed=seed))
        residual.copy_(_randn(t, hidden, dtype=dtype, seed=seed + 10))
        qkv.copy_(_randn(t, (hq + 2 * hkv) * d, dtype=dtype, seed=seed + 20))
        gate_up.copy_(_randn(t, 2 * inter, dtype=dtype, seed=seed + 30))
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


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs need CUDA")
def test_rope_and_store_kv_replays_in_a_cuda_graph():
    """Positions and slots are read on the device: new values take effect on replay."""
    t, hq, hkv, d = 4, 32, 8, 128
    dtype = torch.bfloat16
    qkv, k_pool, v_pool, positions, loc = _rope_store_case(t, hq, hkv, d, dtype, seed=70)
    cos, sin = _rope_tables(4096, d)

    def step():
        q, k, v = _split_qkv(qkv, hq, hkv, d)
        return rope_and_store_kv(q, k, v, positions, cos, sin, k_pool[1], v_pool[1], loc)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for seed in (71, 72):
        new_qkv, _, _, new_positions, new_loc = _rope_store_case(t, hq, hkv, d, dtype, seed=seed)
        qkv.copy_(new_qkv)
        positions.copy_(new_positions)
        loc.copy_(new_loc)
        q, k, v = _split_qkv(qkv.clone(), hq, hkv, d)
        exp_q, exp_kc, exp_vc = _expected_rope_store(q, k, v, positions, cos, sin, k_pool[1],
                                                     v_pool[1], loc)
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(qkv[:, :hq * d].view(t, hq, d), exp_q)
        assert_matches(k_pool[1], exp_kc)
        assert torch.equal(v_pool[1], exp_vc)
