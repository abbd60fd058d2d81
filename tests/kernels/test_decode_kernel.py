"""Split-K decode attention (Triton) against the plain-torch backend over the slot pool."""

from __future__ import annotations

import pytest
import torch

from gearshift.attention.base import KVCache
from gearshift.attention.torch_backend import TorchBackend
from gearshift.attention.triton_backend import TritonBackend
from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.kernels.decode import (
    alloc_decode_workspace,
    decode_attention,
    decode_blocks,
    pick_num_kv_splits,
)
from gearshift.kernels.tree import pick_tree_kv_splits

SEQ_LENS = [1, 7, 100, 257]


def decode_batch(kv: KVCache, rows: torch.Tensor, seq_lens: list[int],
                 num_padded: int = 0) -> ForwardBatch:
    """A DECODE batch; padded rows use dummy row 0, seq_len 1 and dummy slot 0."""
    device = rows.device
    bs, padded = len(seq_lens), len(seq_lens) + num_padded
    rows = torch.cat([rows, torch.zeros(num_padded, dtype=torch.int64, device=device)])
    lens = seq_lens + [1] * num_padded
    seq_lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    out_cache_loc = kv.req_to_token[rows, seq_lens_t.long() - 1].long()
    ones = torch.ones(padded, dtype=torch.int32, device=device)
    return ForwardBatch(
        mode=ForwardMode.DECODE, batch_size=bs, padded_batch_size=padded, num_tokens=padded,
        input_ids=torch.zeros(padded, dtype=torch.int64, device=device),
        positions=seq_lens_t.long() - 1, out_cache_loc=out_cache_loc,
        req_pool_indices=rows, seq_lens=seq_lens_t, extend_lens=ones,
        extend_start_loc=torch.arange(padded, dtype=torch.int32, device=device),
        prefix_lens=seq_lens_t - 1,
        logits_indices=torch.arange(padded, dtype=torch.int64, device=device),
        seq_lens_cpu=lens, extend_lens_cpu=[1] * padded, prefix_lens_cpu=[n - 1 for n in lens],
        max_seq_len=max(lens), max_extend_len=1,
    )


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(4, 4, 64), (8, 2, 128), (8, 1, 32)])
def test_backend_decode_matches_torch(slot_pool, device, num_heads, num_kv_heads, head_dim):
    kv, rows = slot_pool(SEQ_LENS, num_kv_heads, head_dim, num_layers=2)
    fb = decode_batch(kv, rows, SEQ_LENS)
    q = torch.randn(len(SEQ_LENS), num_heads, head_dim, device=device)
    scale = head_dim ** -0.5
    expected = TorchBackend(kv, scale).decode(q, 1, fb)
    actual = TritonBackend(kv, scale).decode(q, 1, fb)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_kv_splits", [1, 3, 32])
def test_decode_kernel_any_split_count(slot_pool, device, num_kv_splits):
    num_heads, num_kv_heads, head_dim = 8, 2, 64
    kv, rows = slot_pool(SEQ_LENS, num_kv_heads, head_dim, seed=1)
    fb = decode_batch(kv, rows, SEQ_LENS)
    q = torch.randn(len(SEQ_LENS), num_heads, head_dim, device=device)
    expected = TorchBackend(kv, 0.125).decode(q, 0, fb)
    # an oversized workspace (more rows and splits than needed) is fine
    work = alloc_decode_workspace(len(SEQ_LENS) + 3, num_heads, head_dim, 40, device)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, kv.k[0], kv.v[0], kv.req_to_token, fb.req_pool_indices, fb.seq_lens,
                     0.125, out, num_kv_splits=num_kv_splits, workspace=work)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_one_split_writes_the_output_without_a_merge(slot_pool, device, monkeypatch):
    """With one KV split stage 1 writes `out` itself (normalised) and stage 2 never runs;
    its workspace is left untouched."""
    from gearshift.kernels import decode as decode_kernels

    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("the merge kernel ran for a single split")

    monkeypatch.setattr(decode_kernels, "_decode_merge_kernel", NoLaunch())
    num_heads, num_kv_heads, head_dim = 8, 2, 64
    kv, rows = slot_pool(SEQ_LENS, num_kv_heads, head_dim, seed=3)
    fb = decode_batch(kv, rows, SEQ_LENS)
    q = torch.randn(len(SEQ_LENS), num_heads, head_dim, device=device)
    work = torch.full((len(SEQ_LENS), num_heads, 1, 80), 7.0, device=device)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, kv.k[0], kv.v[0], kv.req_to_token, fb.req_pool_indices, fb.seq_lens,
                     0.125, out, num_kv_splits=1, workspace=work)
    torch.testing.assert_close(out, TorchBackend(kv, 0.125).decode(q, 0, fb), atol=1e-4, rtol=1e-4)
    assert bool((work == 7.0).all())


@pytest.mark.parametrize("blocks", [(16, 1, 1), (32, 2, 1)])
def test_decode_kernel_block_override(slot_pool, device, blocks):
    """The stage-1 block override (benchmarks/bench_decode_attn.py tunes with it): any KV block
    length gives the same attention, split lengths rounded to it."""
    num_heads, num_kv_heads, head_dim = 8, 2, 64
    kv, rows = slot_pool(SEQ_LENS, num_kv_heads, head_dim, seed=2)
    fb = decode_batch(kv, rows, SEQ_LENS)
    q = torch.randn(len(SEQ_LENS), num_heads, head_dim, device=device)
    expected = TorchBackend(kv, 0.125).decode(q, 0, fb)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, kv.k[0], kv.v[0], kv.req_to_token, fb.req_pool_indices, fb.seq_lens,
                     0.125, out, num_kv_splits=4, blocks=blocks)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_kv_splits", [1, 4])
def test_decode_empty_sequence_writes_zeros(slot_pool, device, num_kv_splits):
    """seq_len 0: every split is empty and stores nothing, yet the request's output is
    written (zeros), by the merge or by the single split."""
    seq_lens = [4, 0]
    kv, rows = slot_pool(seq_lens, 1, 32, seed=12)
    fb = decode_batch(kv, rows, seq_lens)
    q = torch.randn(2, 2, 32, device=device)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, kv.k[0], kv.v[0], kv.req_to_token, fb.req_pool_indices, fb.seq_lens,
                     0.2, out, num_kv_splits=num_kv_splits)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[0], TorchBackend(kv, 0.2).decode(q, 0, fb)[0],
                               atol=1e-4, rtol=1e-4)


def test_decode_padded_rows_point_at_dummy_slot(slot_pool, device):
    seq_lens = [5, 40]
    kv, rows = slot_pool(seq_lens, 2, 64, seed=2)
    fb = decode_batch(kv, rows, seq_lens, num_padded=3)
    q = torch.randn(fb.padded_batch_size, 8, 64, device=device)
    backend = TritonBackend(kv, 0.125)
    out = backend.decode(q, 0, fb)
    expected = TorchBackend(kv, 0.125).decode(q, 0, fb)
    assert out.shape == q.shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    # a padded row attends to slot 0 only, so it returns the dummy V row
    torch.testing.assert_close(out[-1], kv.v[0, 0].repeat_interleave(4, dim=0))


def test_decode_forward_stores_new_kv_then_attends(slot_pool, device):
    seq_lens = [3, 64, 33]
    kv, rows = slot_pool(seq_lens, 1, 64, seed=3)
    kv_ref = KVCache(kv.k.clone(), kv.v.clone(), kv.req_to_token.clone())
    fb = decode_batch(kv, rows, seq_lens)
    q = torch.randn(3, 4, 64, device=device)
    k_new = torch.randn(3, 1, 64, device=device)
    v_new = torch.randn(3, 1, 64, device=device)
    out = TritonBackend(kv, 0.125).forward(q, k_new, v_new, 0, fb)
    expected = TorchBackend(kv_ref, 0.125).forward(q, k_new, v_new, 0, fb)
    torch.testing.assert_close(kv.v, kv_ref.v)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_backend_workspace_is_reused_across_layers_and_steps(slot_pool, device):
    kv, rows = slot_pool([9, 20], 2, 32, num_layers=2, seed=4)
    backend = TritonBackend(kv, 0.2)
    fb = decode_batch(kv, rows, [9, 20])
    q = torch.randn(2, 4, 32, device=device)
    backend.decode(q, 0, fb)
    buffer = backend._workspaces[(4, 32)][1]
    backend.decode(q, 1, fb)
    backend.decode(q[:1], 0, decode_batch(kv, rows[:1], [9]))
    assert backend._workspaces[(4, 32)][1] is buffer


def test_pick_num_kv_splits_depends_only_on_batch_shape():
    # the most splits (a power of two) within ~2 waves of programs, at least one
    expected = {1: 32, 2: 16, 4: 8, 8: 4, 16: 2, 32: 1, 64: 1, 512: 1}
    assert {bs: pick_num_kv_splits(bs, 8, sm_count=132) for bs in expected} == expected
    assert pick_num_kv_splits(1, 8, sm_count=132, max_kv_splits=8) == 8
    assert pick_num_kv_splits(1, 8, sm_count=16) == 4
    # tree attention aims at ~4 waves
    assert pick_tree_kv_splits(64, 8, sm_count=132) == 2 and pick_tree_kv_splits(5, 8) == 16


def test_decode_blocks_widen_where_splits_are_few_and_the_grid_small(monkeypatch):
    from gearshift.kernels import decode as decode_kernels

    monkeypatch.setattr(decode_kernels, "_INTERPRET", False)
    blocks = {bs: decode_blocks(bs, 8, pick_num_kv_splits(bs, 8)) for bs in (1, 2, 4, 32, 40, 64)}
    assert blocks == {1: (64, 4, 2), 2: (64, 4, 2), 4: (128, 4, 2), 32: (128, 4, 2),
                      40: (64, 2, 2), 64: (64, 2, 2)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16/fp16 kernels need a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_half_precision_on_gpu(slot_pool, dtype):
    seq_lens = [1, 300, 4000, 77]
    kv, rows = slot_pool(seq_lens, 8, 128, dtype=dtype, seed=5)
    fb = decode_batch(kv, rows, seq_lens)
    q = torch.randn(4, 32, 128, device="cuda", dtype=dtype)
    expected = TorchBackend(kv, 128 ** -0.5).decode(q, 0, fb)
    actual = TritonBackend(kv, 128 ** -0.5).decode(q, 0, fb)
    torch.testing.assert_close(actual, expected, atol=2e-2, rtol=2e-2)


def rope_tables(max_pos: int, head_dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv[None, :]
    return ang.cos().to(device), ang.sin().to(device)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,num_padded",
                         [(8, 2, 64, 0), (4, 4, 32, 2), (6, 2, 48, 1)])
def test_rope_inside_decode_matches_rope_store_then_decode(slot_pool, device, num_heads,
                                                           num_kv_heads, head_dim, num_padded):
    """DECODE on the Triton backend (rope_store_attend): RoPE and the K/V store inside the
    decode kernel give the output and the cache of the RoPE + store launch followed by
    attention (torch backend), padded rows included."""
    kv, rows = slot_pool(SEQ_LENS, num_kv_heads, head_dim, num_layers=2, seed=5)
    ref_kv = KVCache(kv.k.clone(), kv.v.clone(), kv.req_to_token.clone())
    fb = decode_batch(kv, rows, SEQ_LENS, num_padded)
    bs = fb.padded_batch_size
    qkv = torch.randn(bs, (num_heads + 2 * num_kv_heads) * head_dim, device=device)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim,
                         num_kv_heads * head_dim], dim=-1)  # strided views, as in the model
    q, k, v = (t.view(bs, -1, head_dim) for t in (q, k, v))
    cos, sin = rope_tables(300, head_dim, device)
    scale = head_dim ** -0.5
    expected = TorchBackend(ref_kv, scale).rope_store_attend(q.clone(), k.clone(), v, fb.positions,
                                                             cos, sin, 1, fb)
    actual = TritonBackend(kv, scale).rope_store_attend(q, k, v, fb.positions, cos, sin, 1, fb)
    torch.testing.assert_close(actual[:len(SEQ_LENS)], expected[:len(SEQ_LENS)],
                               atol=1e-4, rtol=1e-4)
    real = fb.out_cache_loc[:len(SEQ_LENS)]
    torch.testing.assert_close(kv.k[1, real], ref_kv.k[1, real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kv.v[1, real], ref_kv.v[1, real])
    torch.testing.assert_close(kv.k[0], ref_kv.k[0])  # other layers untouched


@pytest.mark.parametrize("num_kv_splits", [1, 2, 32])
def test_rope_inside_decode_any_split_count(slot_pool, device, num_kv_splits):
    """The split holding the new key stores and attends it, whatever the split count (and
    a 1-key request, whose only key is the new one)."""
    from gearshift.kernels.decode import RopeInputs

    num_heads, num_kv_heads, head_dim = 8, 2, 64
    kv, rows = slot_pool(SEQ_LENS, num_kv_heads, head_dim, seed=6)
    ref_kv = KVCache(kv.k.clone(), kv.v.clone(), kv.req_to_token.clone())
    fb = decode_batch(kv, rows, SEQ_LENS)
    q = torch.randn(len(SEQ_LENS), num_heads, head_dim, device=device)
    k = torch.randn(len(SEQ_LENS), num_kv_heads, head_dim, device=device)
    v = torch.randn_like(k)
    cos, sin = rope_tables(300, head_dim, device)
    expected = TorchBackend(ref_kv, 0.125).rope_store_attend(q.clone(), k.clone(), v,
                                                             fb.positions, cos, sin, 0, fb)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, kv.k[0], kv.v[0], kv.req_to_token, fb.req_pool_indices, fb.seq_lens,
                     0.125, out, num_kv_splits=num_kv_splits,
                     rope=RopeInputs(k, v, fb.positions, cos, sin, fb.out_cache_loc))
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kv.k, ref_kv.k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kv.v, ref_kv.v)

