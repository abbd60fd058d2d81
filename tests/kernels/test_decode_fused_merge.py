"""Fused split merge of the decode kernel (the last split program of a KV group merges)
against the plain-torch backend and the two-launch reference, over the slot pool."""

from __future__ import annotations

import pytest
import torch
from test_decode_kernel import decode_batch

from gearshift.attention.torch_backend import TorchBackend
from gearshift.attention.triton_backend import TritonBackend
from gearshift.kernels.decode import (
    alloc_decode_counters,
    alloc_decode_workspace,
    decode_attention,
)

# Interpreted blocks are 16 keys: with 8 splits, a sequence under 8 * 16 keys leaves the
# later splits empty (seq 1 -> 1 non-empty split, 20 -> 2, 100 -> 7), 200 fills all 8.
SHORT_AND_LONG = [1, 20, 100, 200]
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def run_decode(kv, q, fb, scale, *, fused: bool, splits: int,
               counters: torch.Tensor | None = None) -> torch.Tensor:
    bs, num_heads, head_dim = q.shape
    work = alloc_decode_workspace(bs, num_heads, head_dim, splits, q.device)
    out = torch.full_like(q, float("nan"))
    return decode_attention(q, kv.k[0], kv.v[0], kv.req_to_token, fb.req_pool_indices,
                            fb.seq_lens, scale, out, num_kv_splits=splits, workspace=work,
                            counters=counters, fused_merge=fused)


@pytest.mark.parametrize("seq_lens", [[1], [5, 130], SHORT_AND_LONG, [3, 1, 17, 64, 9]])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (6, 1)])
def test_fused_merge_matches_torch(slot_pool, device, seq_lens, num_heads, num_kv_heads):
    head_dim, splits = 32, 8
    kv, rows = slot_pool(seq_lens, num_kv_heads, head_dim, seed=len(seq_lens))
    fb = decode_batch(kv, rows, seq_lens)
    q = torch.randn(len(seq_lens), num_heads, head_dim, device=device)
    expected = TorchBackend(kv, 0.17).decode(q, 0, fb)
    counters = alloc_decode_counters(len(seq_lens), num_kv_heads, device)
    fused = run_decode(kv, q, fb, 0.17, fused=True, splits=splits, counters=counters)
    torch.testing.assert_close(fused, expected, atol=1e-4, rtol=1e-4)
    assert not counters.any(), "the merging program leaves its counter at zero"
    separate = run_decode(kv, q, fb, 0.17, fused=False, splits=splits)
    torch.testing.assert_close(fused, separate, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_merge_dtypes(slot_pool, device, dtype):
    if dtype != torch.float32 and device == "cpu":
        pytest.skip("bf16 needs a GPU: the interpreter computes garbage for bf16 (either path)")
    seq_lens = [1, 300, 4000, 77] if device == "cuda" else SHORT_AND_LONG
    kv, rows = slot_pool(seq_lens, 2, 128, dtype=dtype, seed=7)
    fb = decode_batch(kv, rows, seq_lens)
    q = torch.randn(len(seq_lens), 8, 128, device=device, dtype=dtype)
    expected = TorchBackend(kv, 128 ** -0.5).decode(q, 0, fb)
    actual = run_decode(kv, q, fb, 128 ** -0.5, fused=True, splits=8)
    torch.testing.assert_close(actual, expected, atol=TOL[dtype], rtol=TOL[dtype])


def test_fused_merge_reuses_counters_call_after_call(slot_pool, device):
    seq_lens = SHORT_AND_LONG
    kv, rows = slot_pool(seq_lens, 2, 32, seed=11)
    fb = decode_batch(kv, rows, seq_lens)
    q = torch.randn(len(seq_lens), 8, 32, device=device)
    # an oversized buffer (more rows than requests) is fine; it must stay zero throughout
    counters = alloc_decode_counters(len(seq_lens) + 3, 2, device)
    first = run_decode(kv, q, fb, 0.2, fused=True, splits=8, counters=counters)
    assert not counters.any()
    second = run_decode(kv, q, fb, 0.2, fused=True, splits=8, counters=counters)
    assert not counters.any()
    assert torch.equal(first, second)
    # a different split count over the same buffer (another graph's batch size)
    third = run_decode(kv, q, fb, 0.2, fused=True, splits=3, counters=counters)
    assert not counters.any()
    torch.testing.assert_close(third, first, atol=1e-4, rtol=1e-4)


def test_fused_merge_empty_sequence_writes_zeros(slot_pool, device):
    # seq_len 0: every split is empty, yet all count, so the last one still writes `out`
    seq_lens = [4, 0]
    kv, rows = slot_pool(seq_lens, 1, 32, seed=12)
    fb = decode_batch(kv, rows, seq_lens)
    q = torch.randn(2, 2, 32, device=device)
    fused = run_decode(kv, q, fb, 0.2, fused=True, splits=4)
    separate = run_decode(kv, q, fb, 0.2, fused=False, splits=4)
    assert torch.equal(fused[1], torch.zeros_like(fused[1]))
    torch.testing.assert_close(fused, separate, atol=1e-6, rtol=1e-6)


def test_backend_counters_are_persistent_and_zero(slot_pool, device):
    kv, rows = slot_pool([9, 150], 2, 32, num_layers=2, seed=13)
    backend = TritonBackend(kv, 0.2, max_kv_splits=8)
    backend.reserve_decode_workspace(4, 8, 32)
    counters = backend._counters
    assert counters.shape == (max(4, kv.req_to_token.shape[0]), 2)
    assert counters.dtype == torch.int32 and not counters.any()
    fb = decode_batch(kv, rows, [9, 150])
    q = torch.randn(2, 8, 32, device=device)
    expected = TorchBackend(kv, 0.2).decode(q, 1, fb)
    for layer in (0, 1, 1):
        out = backend.decode(q, layer, fb)
        assert backend._counters is counters and not counters.any()
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    # growing past the reserved rows retires the old buffer (graphs may hold it) and
    # starts the new one at zero
    backend.reserve_decode_workspace(counters.shape[0] + 5, 8, 32)
    assert backend._counters is not counters and not backend._counters.any()
    assert any(t is counters for t in backend._retired)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="races and graphs need a GPU")
@pytest.mark.parametrize("seq_lens", [[4000], [1, 300, 4000, 77, 2048, 5, 999, 1500]])
def test_fused_merge_races_and_graph_replays_on_gpu(slot_pool, seq_lens):
    # many split programs race for each ticket; a partial read before it is visible would
    # be the NaN the workspace is filled with, or differ from one replay to the next
    kv, rows = slot_pool(seq_lens, 8, 128, dtype=torch.bfloat16, seed=14)
    fb = decode_batch(kv, rows, seq_lens)
    q = torch.randn(len(seq_lens), 32, 128, device="cuda", dtype=torch.bfloat16)
    work = alloc_decode_workspace(len(seq_lens), 32, 128, 32, "cuda")
    counters = alloc_decode_counters(len(seq_lens), 8, "cuda")
    out = torch.empty_like(q)

    def step() -> None:
        decode_attention(q, kv.k[0], kv.v[0], kv.req_to_token, fb.req_pool_indices,
                         fb.seq_lens, 128 ** -0.5, out, num_kv_splits=32, workspace=work,
                         counters=counters, fused_merge=True)

    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    expected = TorchBackend(kv, 128 ** -0.5).decode(q, 0, fb)
    first = None
    for _ in range(50):
        work.fill_(float("nan"))
        out.fill_(float("nan"))
        graph.replay()
        first = out.clone() if first is None else first
        assert torch.equal(out, first)
    torch.cuda.synchronize()
    assert not counters.any()
    torch.testing.assert_close(first, expected, atol=2e-2, rtol=2e-2)
