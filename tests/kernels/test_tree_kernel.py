"""Tree attention (Triton, VERIFY / DRAFT) against the base-class plain-torch reference.

Every query token sees its request's committed prefix plus its extra slots: its
ancestors in this step's draft tree and itself (forward_batch.py draws the layout). The
tree tokens own shuffled slots right after their request's prefix in the slot pool.
"""

from __future__ import annotations

import pytest
import torch

from gearshift.attention.base import AttentionBackend, KVCache
from gearshift.attention.triton_backend import TritonBackend
from gearshift.forward_batch import ForwardBatch, ForwardMode, TreeAttention
from gearshift.kernels.decode import alloc_decode_workspace
from gearshift.kernels.tree import tree_attention

PREFIX_LENS = [0, 1, 37, 300]
# parent of each tree node (-1 = root, the pending token); one tree per request
TREES = [
    [-1, 0, 1, 2],  # chain
    [-1, 0, 0, 1, 1, 2],  # the diagram of forward_batch.py: x / a b / c d e
    [-1],  # plain decode (K = 0)
    [-1, 0, 0, 1, 2, 2, 4],  # branching, depth 4
]


def tree_batch(kv: KVCache, rows: torch.Tensor, prefix_lens: list[int], trees: list[list[int]],
               *, max_extra: int | None = None, shuffle_columns: bool = False,
               num_padded: int = 0, seed: int = 0) -> ForwardBatch:
    """A VERIFY batch: node j of request b sits at position prefix_b + j (its slot is
    req_to_token[row_b, prefix_b + j]) and its extras are the path root..j, padded with -1
    to max_extra columns (optionally in shuffled column order). Padded tokens use dummy
    row 0 with no prefix and no extras."""
    device = rows.device
    gen = torch.Generator().manual_seed(seed)
    table = kv.req_to_token.cpu()
    token_rows, token_prefix, positions, paths, own_slots = [], [], [], [], []
    for row, prefix, parents in zip(rows.tolist(), prefix_lens, trees, strict=True):
        for j in range(len(parents)):
            path, node = [], j
            while node >= 0:
                path.append(int(table[row, prefix + node]))
                node = parents[node]
            token_rows.append(row)
            token_prefix.append(prefix)
            positions.append(prefix + len(path) - 1)
            paths.append(path[::-1])
            own_slots.append(path[0])
    width = max_extra or max(len(p) for p in paths)
    token_rows += [0] * num_padded
    token_prefix += [0] * num_padded
    positions += [0] * num_padded
    paths += [[]] * num_padded
    own_slots += [0] * num_padded
    extra = torch.full((len(paths), width), -1, dtype=torch.int64)
    for i, path in enumerate(paths):
        extra[i, :len(path)] = torch.tensor(path, dtype=torch.int64)
        if shuffle_columns:
            extra[i] = extra[i, torch.randperm(width, generator=gen)]
    num_tokens, bs = len(paths), len(trees)
    extend = [len(p) for p in trees]

    def ints(values: list[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    tree = TreeAttention(token_rows=ints(token_rows, torch.int64),
                         prefix_lens=ints(token_prefix), extra_slots=extra.to(device),
                         max_prefix_len=max(token_prefix))
    starts = [sum(extend[:i]) for i in range(bs)]
    seq_lens = [p + n for p, n in zip(prefix_lens, extend, strict=True)]
    return ForwardBatch(
        mode=ForwardMode.VERIFY, batch_size=bs, padded_batch_size=bs, num_tokens=num_tokens,
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        positions=ints(positions, torch.int64), out_cache_loc=ints(own_slots, torch.int64),
        req_pool_indices=rows, seq_lens=ints(seq_lens), extend_lens=ints(extend),
        extend_start_loc=ints(starts), prefix_lens=ints(prefix_lens),
        logits_indices=torch.arange(num_tokens, dtype=torch.int64, device=device),
        seq_lens_cpu=seq_lens, extend_lens_cpu=extend, prefix_lens_cpu=list(prefix_lens),
        max_seq_len=max(seq_lens), max_extend_len=max(extend), tree=tree,
    )


def reference(backend: AttentionBackend, q: torch.Tensor, layer_id: int,
              fb: ForwardBatch) -> torch.Tensor:
    return AttentionBackend.tree(backend, q, layer_id, fb)  # the plain-torch base method


def triton_backend(kv: KVCache, sm_scale: float) -> TritonBackend:
    # interpreted (CPU) runs cap the split count: every program costs milliseconds there;
    # test_tree_kernel_any_split_count_and_padded_columns covers up to 32 splits
    return TritonBackend(kv, sm_scale, max_kv_splits=32 if torch.cuda.is_available() else 4)


def pool_and_batch(slot_pool, num_kv_heads: int, head_dim: int, seed: int = 0, **options):
    seq_lens = [p + len(t) for p, t in zip(PREFIX_LENS, TREES, strict=True)]
    kv, rows = slot_pool(seq_lens, num_kv_heads, head_dim, num_layers=2, seed=seed)
    return kv, tree_batch(kv, rows, PREFIX_LENS, TREES, seed=seed, **options)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(4, 4, 64), (16, 4, 128), (8, 1, 64)])
def test_backend_tree_matches_reference(slot_pool, device, num_heads, num_kv_heads, head_dim):
    kv, fb = pool_and_batch(slot_pool, num_kv_heads, head_dim)
    q = torch.randn(fb.num_tokens, num_heads, head_dim, device=device)
    backend = triton_backend(kv, head_dim ** -0.5)
    expected = reference(backend, q, 1, fb)
    actual = backend.tree(q, 1, fb)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_kv_splits", [1, 3, 32])
def test_tree_kernel_any_split_count_and_padded_columns(slot_pool, device, num_kv_splits):
    """64 extra columns (column-major) with the -1 padding scattered between the real
    slots; a workspace larger than needed; padded tokens (no key at all) come out as zeros."""
    num_heads, num_kv_heads, head_dim = 8, 2, 64
    kv, fb = pool_and_batch(slot_pool, num_kv_heads, head_dim, seed=1, max_extra=64,
                            shuffle_columns=True, num_padded=2)
    t = fb.tree
    real = fb.num_tokens - 2
    assert (t.extra_slots[:real] < 0).any(dim=1).all() and t.extra_slots.shape[1] == 64
    q = torch.randn(fb.num_tokens, num_heads, head_dim, device=device)
    backend = TritonBackend(kv, 0.125)
    expected = reference(backend, q, 0, fb)
    work = alloc_decode_workspace(fb.num_tokens + 3, num_heads, head_dim, 40, device)
    out = torch.full_like(q, float("nan"))
    column_major = t.extra_slots.t().contiguous().t()  # any strides are fine
    tree_attention(q, kv.k[0], kv.v[0], kv.req_to_token, t.token_rows, t.prefix_lens,
                   column_major, 0.125, out, num_kv_splits=num_kv_splits, workspace=work)
    torch.testing.assert_close(out[:real], expected[:real], atol=1e-4, rtol=1e-4)
    assert torch.equal(out[real:], torch.zeros_like(out[real:]))


def test_forward_stores_tree_kv_then_attends(slot_pool, device):
    """AttentionBackend.forward with fb.tree: this step's K/V land at out_cache_loc and
    every token sees exactly its prefix and its tree path (not its siblings)."""
    num_heads, num_kv_heads, head_dim = 8, 2, 32
    kv, fb = pool_and_batch(slot_pool, num_kv_heads, head_dim, seed=2)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(fb.num_tokens, h, head_dim, generator=gen).to(device)
               for h in (num_heads, num_kv_heads, num_kv_heads))
    backend = triton_backend(kv, head_dim ** -0.5)
    actual = backend.forward(q, k, v, 1, fb)
    torch.testing.assert_close(kv.k[1][fb.out_cache_loc], k)
    expected = reference(backend, q, 1, fb)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)
    # the diagram's node a (token 5) must not see its sibling b (token 6): perturb b's K/V
    kv.k[1][fb.out_cache_loc[6]] += 10.0
    kv.v[1][fb.out_cache_loc[6]] += 10.0
    again = backend.tree(q, 1, fb)
    torch.testing.assert_close(again[5], actual[5], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(again[6], actual[6])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tree attention: GPU only")
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(32, 8, 128), (28, 4, 128)])
def test_tree_bf16_long_prefix(slot_pool, device, num_heads, num_kv_heads, head_dim):
    prefix_lens = [0, 1, 37, 300, 2049, 8200]
    trees = [[-1, *range(15)], TREES[1], TREES[2], TREES[3], [-1, 0, 0, 0, 1, 1, 2, 2],
             [-1, 0, 1, 2, 3, 4]]
    seq_lens = [p + len(t) for p, t in zip(prefix_lens, trees, strict=True)]
    kv, rows = slot_pool(seq_lens, num_kv_heads, head_dim, dtype=torch.bfloat16)
    fb = tree_batch(kv, rows, prefix_lens, trees, max_extra=80, shuffle_columns=True)
    q = torch.randn(fb.num_tokens, num_heads, head_dim, device=device, dtype=torch.bfloat16)
    backend = TritonBackend(kv, head_dim ** -0.5)
    expected = reference(backend, q, 0, fb)
    actual = backend.tree(q, 0, fb)
    assert actual.dtype == torch.bfloat16
    torch.testing.assert_close(actual.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_tree_kernel_takes_broadcast_rows_and_prefix_lens(slot_pool, device):
    """A draft step's rows / prefix lengths can be expanded views (stride 0) of one value
    per request: the kernel must read them like contiguous tensors (on a GPU it once read
    past the 1-element storage: an illegal address; the interpreter segfaulted)."""
    num_heads, num_kv_heads, head_dim = 4, 2, 32
    kv, fb = pool_and_batch(slot_pool, num_kv_heads, head_dim)
    t = fb.tree
    i = int((t.prefix_lens == max(PREFIX_LENS)).nonzero()[0])  # the longest prefix's tree
    n = 4  # its first nodes: one row and one prefix length for all of them
    rows = t.token_rows[i:i + 1].clone().expand(n)  # storage of ONE element
    prefix = t.prefix_lens[i:i + 1].clone().expand(n)
    assert rows.stride(0) == 0 and prefix.stride(0) == 0
    q = torch.randn(n, num_heads, head_dim, device=device)
    extra = t.extra_slots[i:i + n]
    want = torch.empty_like(q)
    tree_attention(q, kv.k[0], kv.v[0], kv.req_to_token, rows.contiguous(), prefix.contiguous(),
                   extra, head_dim ** -0.5, want, num_kv_splits=4)
    got = torch.empty_like(q)
    tree_attention(q, kv.k[0], kv.v[0], kv.req_to_token, rows, prefix, extra, head_dim ** -0.5,
                   got, num_kv_splits=4)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
