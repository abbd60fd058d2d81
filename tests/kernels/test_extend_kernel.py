"""Causal extend (prefill) attention (Triton) against the plain-torch backend.

Under the interpreter a tile is 16 rows (tokens x query heads of one KV group), so the
requests below span many tiles, GQA groups of 3 leave padded head rows, a group of 24
needs two head blocks, and a batch of 42 makes the tile search read extend_lens in chunks.
"""

from __future__ import annotations

import pytest
import torch

from gearshift.attention.base import KVCache
from gearshift.attention.torch_backend import TorchBackend
from gearshift.attention.triton_backend import TritonBackend
from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.kernels import extend as extend_kernels
from gearshift.kernels.extend import (
    extend_attention,
    extend_config,
    is_decode_heavy,
    num_tiles_bound,
    warmup_extend,
)

# (prefix_len, extend_len): fresh prompts, chunked prefill, decode riding along, long prefix
# (31, 1): a decoder whose keys fill whole blocks of 16 / 32 (the decoder path's tail is empty)
REQUESTS = [(0, 1), (0, 7), (5, 3), (99, 1), (30, 70), (200, 57), (0, 40), (31, 1)]


def extend_batch(kv: KVCache, rows: torch.Tensor, requests: list[tuple[int, int]]) -> ForwardBatch:
    device = rows.device
    prefix = [p for p, _ in requests]
    extend = [n for _, n in requests]
    seq = [p + n for p, n in requests]
    starts = [sum(extend[:i]) for i in range(len(requests))]
    num_tokens = sum(extend)
    row_list = rows.tolist()
    out_cache_loc = torch.cat([kv.req_to_token[r, p:s] for r, p, s in zip(row_list, prefix, seq,
                                                                          strict=True)]).long()
    positions = torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq, strict=True)])

    def ints(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return ForwardBatch(
        mode=ForwardMode.EXTEND, batch_size=len(requests), padded_batch_size=len(requests),
        num_tokens=num_tokens, input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        positions=positions.to(device), out_cache_loc=out_cache_loc, req_pool_indices=rows,
        seq_lens=ints(seq), extend_lens=ints(extend), extend_start_loc=ints(starts),
        prefix_lens=ints(prefix),
        logits_indices=torch.tensor([s + n - 1 for s, n in zip(starts, extend, strict=True)],
                                    dtype=torch.int64, device=device),
        seq_lens_cpu=seq, extend_lens_cpu=extend, prefix_lens_cpu=prefix,
        max_seq_len=max(seq), max_extend_len=max(extend),
    )


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim",
                         [(4, 4, 64), (8, 2, 128), (8, 1, 32), (6, 2, 48)])
def test_backend_extend_matches_torch(slot_pool, device, num_heads, num_kv_heads, head_dim):
    kv, rows = slot_pool([p + n for p, n in REQUESTS], num_kv_heads, head_dim, num_layers=2)
    fb = extend_batch(kv, rows, REQUESTS)
    q = torch.randn(fb.num_tokens, num_heads, head_dim, device=device)
    scale = head_dim ** -0.5
    expected = TorchBackend(kv, scale).extend(q, 1, fb)
    actual = TritonBackend(kv, scale).extend(q, 1, fb)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


def test_extend_forward_stores_new_kv_then_attends(slot_pool, device):
    requests = [(0, 20), (17, 5), (3, 1)]
    kv, rows = slot_pool([p + n for p, n in requests], 2, 64, seed=1)
    kv_ref = KVCache(kv.k.clone(), kv.v.clone(), kv.req_to_token.clone())
    fb = extend_batch(kv, rows, requests)
    q = torch.randn(fb.num_tokens, 4, 64, device=device)
    k_new = torch.randn(fb.num_tokens, 2, 64, device=device)
    v_new = torch.randn(fb.num_tokens, 2, 64, device=device)
    out = TritonBackend(kv, 0.125).forward(q, k_new, v_new, 0, fb)
    expected = TorchBackend(kv_ref, 0.125).forward(q, k_new, v_new, 0, fb)
    torch.testing.assert_close(kv.k, kv_ref.k)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_extend_kernel_skips_requests_without_new_tokens(slot_pool, device):
    requests = [(4, 6), (10, 0), (0, 3)]
    kv, rows = slot_pool([p + n for p, n in requests], 1, 32, seed=2)
    fb = extend_batch(kv, rows, requests)
    q = torch.randn(fb.num_tokens, 2, 32, device=device)
    expected = TorchBackend(kv, 0.3).extend(q, 0, fb)
    out = torch.full_like(q, float("nan"))
    extend_attention(q, kv.k[0], kv.v[0], kv.req_to_token, fb.req_pool_indices, fb.seq_lens,
                     fb.extend_lens, fb.extend_start_loc, 0.3, out,
                     max_extend_len=fb.max_extend_len)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_extend_first_token_sees_only_itself(slot_pool, device):
    kv, rows = slot_pool([16], 1, 32, seed=3)
    fb = extend_batch(kv, rows, [(0, 16)])
    q = torch.randn(16, 1, 32, device=device)
    out = TritonBackend(kv, 0.2).extend(q, 0, fb)
    first_slot = kv.req_to_token[rows[0], 0].long()
    torch.testing.assert_close(out[0, 0], kv.v[0, first_slot, 0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16/fp16 kernels need a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_extend_half_precision_on_gpu(slot_pool, dtype):
    requests = [(0, 512), (0, 512), (300, 212), (1000, 1), (7, 130)]
    kv, rows = slot_pool([p + n for p, n in requests], 8, 128, dtype=dtype, seed=4)
    fb = extend_batch(kv, rows, requests)
    q = torch.randn(fb.num_tokens, 32, 128, device="cuda", dtype=dtype)
    expected = TorchBackend(kv, 128 ** -0.5).extend(q, 0, fb)
    actual = TritonBackend(kv, 128 ** -0.5).extend(q, 0, fb)
    torch.testing.assert_close(actual, expected, atol=2e-2, rtol=2e-2)


def run_kernel(kv: KVCache, fb: ForwardBatch, q: torch.Tensor, scale: float,
               config: extend_kernels.ExtendConfig | None = None) -> torch.Tensor:
    out = torch.full_like(q, float("nan"))  # rows the kernel misses stay NaN
    return extend_attention(q, kv.k[0], kv.v[0], kv.req_to_token, fb.req_pool_indices,
                            fb.seq_lens, fb.extend_lens, fb.extend_start_loc, scale, out,
                            max_extend_len=fb.max_extend_len, config=config)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(8, 2, 32), (24, 1, 16)])
def test_decode_rows_mixed_with_prefills(slot_pool, device, num_heads, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(5)
    prefixes = torch.randint(0, 40, (40,), generator=gen).tolist()
    decode_rows = [(p, 1) for p in prefixes]
    requests = decode_rows[:25] + [(0, 37), (21, 9)] + decode_rows[25:]
    kv, rows = slot_pool([p + n for p, n in requests], num_kv_heads, head_dim, seed=6)
    fb = extend_batch(kv, rows, requests)
    q = torch.randn(fb.num_tokens, num_heads, head_dim, device=device)
    expected = TorchBackend(kv, 0.25).extend(q, 0, fb)
    torch.testing.assert_close(run_kernel(kv, fb, q, 0.25), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("config", [extend_kernels.ExtendConfig(8, 4, 16, 1, 1, 16),
                                    extend_kernels.ExtendConfig(2, 8, 64, 1, 1, 8),
                                    extend_kernels.ExtendConfig(8, 4, 128, 4, 2, 128),
                                    extend_kernels.ExtendConfig(8, 4, 16, 1, 1, 16, False),
                                    extend_kernels.ExtendConfig(8, 4, 32, 1, 1, 16, True, 16)])
def test_extend_kernel_config_override(slot_pool, device, config):
    """A config override (benchmarks/bench_extend_attn.py tunes with it): other tile heights,
    key blocks, tile-search chunks, decoders on the token tiles (decode_rows off) or on
    the decoder path with their own key block give the same attention."""
    kv, rows = slot_pool([p + n for p, n in REQUESTS], 2, 32, seed=8)
    fb = extend_batch(kv, rows, REQUESTS)
    q = torch.randn(fb.num_tokens, 8, 32, device=device)
    expected = TorchBackend(kv, 0.2).extend(q, 0, fb)
    torch.testing.assert_close(run_kernel(kv, fb, q, 0.2, config), expected, atol=1e-4, rtol=1e-4)


def test_block_config_depends_on_model_shape_only():
    cfg = extend_config(torch.bfloat16, 32, 8, 128)
    assert cfg is extend_config(torch.bfloat16, 32, 8, 128)  # cached per (model shape, step class)
    assert cfg.block_t * cfg.block_g >= 16  # tl.dot needs M >= 16
    assert cfg.block_g == 4  # the 4 query heads of a group share each K/V block
    # the grid bound covers every tile of any batch, and is exact for pure decode
    gen = torch.Generator().manual_seed(7)
    for _ in range(200):
        bs = int(torch.randint(1, 70, (1,), generator=gen))
        lens = torch.randint(0, 300, (bs,), generator=gen).tolist()
        tiles = sum(-(-n // cfg.block_t) for n in lens)
        assert num_tiles_bound(cfg, bs, sum(lens), max(lens)) >= tiles
    assert num_tiles_bound(cfg, 64, 64, 1) == 64
    assert num_tiles_bound(cfg, 64, 63 + 512, 512) == 63 + -(-512 // cfg.block_t)


def test_decode_heavy_steps_get_the_short_tile(monkeypatch):
    """Hopper, 16-bit, GQA group 4: decode-heavy steps (measured faster so) get 8-token
    tiles; elsewhere both classes share one config. Every config sends
    decoders down the decoder path, over 128-key blocks on a GPU in 16 bits."""
    monkeypatch.setattr(extend_kernels, "_INTERPRET", False)
    config = extend_config.__wrapped__  # uncached: the module's _INTERPRET is patched
    long, short = (config(torch.bfloat16, 32, 8, 128, 9, heavy) for heavy in (False, True))
    assert (long.block_t, long.block_g, long.block_n, long.num_stages) == (16, 4, 64, 2)
    assert (short.block_t, short.block_g, short.block_n, short.num_stages) == (8, 4, 64, 2)
    assert long.decode_rows and short.decode_rows and long.dec_block_n == short.dec_block_n == 128
    assert config(torch.bfloat16, 32, 8, 128, 8).num_stages == 3  # before Hopper
    for dtype, capability in ((torch.bfloat16, 8), (torch.float32, 9)):
        assert config(dtype, 32, 8, 128, capability, True) == config(dtype, 32, 8, 128, capability)
    # EXTEND graphs over 65 rows (max_num_seqs 64): the 256-token mixed step is decode-heavy
    assert is_decode_heavy(256, 65) and not is_decode_heavy(320, 65)
    assert is_decode_heavy(1, 1) and not is_decode_heavy(2048, 4)


def compiled_variants() -> int:
    return sum(len(caches[0]) for caches in extend_kernels._extend_kernel.device_caches.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled variants exist on a GPU only")
def test_warmup_compiles_every_variant_serving_needs(slot_pool):
    requests = [(600, 1)] * 63 + [(0, 512)]
    kv, rows = slot_pool([p + n for p, n in requests], 8, 128, dtype=torch.bfloat16, seed=8)
    warmup_extend(kv.k[0], kv.v[0], kv.req_to_token, 32)
    compiled = compiled_variants()
    for batch in (requests, requests[:1], requests[-1:], [(3, 17), (0, 1)]):
        fb = extend_batch(kv, rows[:len(batch)], batch)
        q = torch.randn(fb.num_tokens, 32, 128, device="cuda", dtype=torch.bfloat16)
        expected = TorchBackend(kv, 128 ** -0.5).extend(q, 0, fb)
        torch.testing.assert_close(run_kernel(kv, fb, q, 128 ** -0.5), expected,
                                   atol=2e-2, rtol=2e-2)
    assert compiled_variants() == compiled
