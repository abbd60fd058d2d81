"""RoPE kernels against their plain-torch references: apply_rope (in place on the fused
qkv output's views) and rope_and_store_kv (RoPE + the K/V store into the slot pool in one
launch, used by EXTEND and VERIFY), and the attention backends' rope_and_store contract.
Dtypes and tolerances: fused_checks.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from fused_checks import DEVICE, DTYPES, HAS_CUDA, TOKENS, assert_matches, randn, rope_tables

from gearshift.attention.base import KVCache
from gearshift.attention.torch_backend import TorchBackend
from gearshift.attention.triton_backend import TritonBackend
from gearshift.kernels.rope import apply_rope, apply_rope_ref, rope_and_store_kv

ROPE_SHAPES = [(4, 2, 64), (3, 1, 96)] + ([(32, 8, 128)] if HAS_CUDA else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim", ROPE_SHAPES)
def test_apply_rope_in_place_on_fused_qkv_views(dtype, num_tokens, num_q_heads, num_kv_heads,
                                                head_dim):
    t, hq, hkv, d = num_tokens, num_q_heads, num_kv_heads, head_dim
    qkv = randn(t, (hq + 2 * hkv) * d, dtype=dtype, seed=8) * 2  # [T, fused width]
    original = qkv.clone()
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.view(t, hq, d), k.view(t, hkv, d)  # token stride = fused width
    cos, sin = rope_tables(4096, d)
    gen = torch.Generator().manual_seed(9)
    positions = torch.randint(0, 4096, (t,), generator=gen).to(DEVICE)
    expected_q, expected_k = apply_rope_ref(q, k, positions, cos, sin)

    q_out, k_out = apply_rope(q, k, positions, cos, sin)
    assert q_out is q and k_out is k, "rotated in place"
    assert_matches(q, expected_q)
    assert_matches(k, expected_k)
    assert torch.equal(v, original[:, (hq + hkv) * d:]), "v must stay untouched"


def test_apply_rope_int32_positions_and_position_zero():
    q = randn(3, 2, 64, dtype=torch.float32, seed=10)
    k = randn(3, 1, 64, dtype=torch.float32, seed=11)
    cos, sin = rope_tables(16, 64)
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
    qkv = randn(t, (hq + 2 * hkv) * d, dtype=dtype, seed=seed) * 2
    k_pool = randn(2, NUM_SLOTS + 1, hkv, d, dtype=dtype, seed=seed + 1)
    v_pool = randn(2, NUM_SLOTS + 1, hkv, d, dtype=dtype, seed=seed + 2)
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
    cos, sin = rope_tables(4096, d)
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
    cos, sin = rope_tables(64, d)
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
    cos, sin = rope_tables(4096, d)
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


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs need CUDA")
def test_rope_and_store_kv_replays_in_a_cuda_graph():
    """Positions and slots are read on the device: new values take effect on replay."""
    t, hq, hkv, d = 4, 32, 8, 128
    dtype = torch.bfloat16
    qkv, k_pool, v_pool, positions, loc = _rope_store_case(t, hq, hkv, d, dtype, seed=70)
    cos, sin = rope_tables(4096, d)

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
