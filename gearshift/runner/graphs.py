"""CUDA graphs: one cache (`GraphCache`) for every fixed-shape forward, keyed by the
graph key of a step's layout (runner/layout.py) or of a draft shape, all in one memory
pool: DECODE steps ("decode", padded batch size) and EXTEND steps ("extend", padded token
count) captured at start-up, largest first; VERIFY passes ("target", ...), greedy
verification and the draft's shapes captured by the speculation warm-up (or, past it,
on first use).

Data flow: ModelRunner.prepare_hot_path -> GraphCache.capture (every plain shape, on
`decode_capture_batch` / `extend_capture_batch`); per step: ModelRunner.layout(plan)
names the graph, BatchBuilder.prepare lays the batch out for it (runner/staging.py,
`pad_batch`) -> GraphCache.run copies the step's inputs into the graph's static ones
(one multi-tensor copy per dtype), replays, and returns the static outputs: logits
[rows, vocab] (and aux features). Capturing requires an attention backend whose paths
read lengths from device tensors only and size their grids from host ints fixed by the
shape (the Triton backend); the torch reference backend runs eagerly.
"""

from __future__ import annotations

import bisect
import dataclasses
import time

import torch

from gearshift.forward_batch import ForwardBatch, ForwardMode


def default_batch_sizes(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 257, 8)) + list(range(272, 1025, 16))
    return sorted({s for s in sizes if s < max_bs} | {max_bs})


def extend_token_buckets(max_tokens: int) -> list[int]:
    """Padded token counts of the EXTEND graphs: multiples of 64 up to 512, then of 128,
    and `max_tokens` itself as the largest (none when max_tokens <= 0)."""
    if max_tokens <= 0:
        return []
    sizes = list(range(64, 513, 64)) + list(range(640, max_tokens, 128))
    return sorted({s for s in sizes if s < max_tokens} | {max_tokens})


def mixed_verify_tokens(rows: int, tokens: int, per_row: tuple[int, ...] = ()) -> int:
    """Token bucket of a VERIFY pass over chains of different lengths (`tokens` real ones,
    `rows` the padded batch): rows * j for j in 2 .. K + 1, with at least one padding token
    (the masked nodes of shorter chains read it). Every bucket a mixed plan of `rows`
    requests can reach, so the warm-up covers them all. `per_row` (a hybrid's: verify_rows)
    lists the j that have graphs, deep suffix chains' coarse ones past K + 1 among them: j
    rounds up to the next."""
    j = max(-(-(tokens + 1) // rows), 2)
    return next((c for c in per_row if c >= j), j) * rows


def deep_levels(k: int, deepest: int) -> tuple[int, ...]:
    """Chain depths past the model's K that a hybrid's deeper suffix drafts verify at (a
    step's deepest chain pads to the next, its extra nodes never accepted): doubling from
    2K up to `deepest`, so that two or three depths have graphs instead of K + 1 .. deepest."""
    levels, d = [], 2 * k
    while d < deepest:
        levels.append(d)
        d *= 2
    return tuple(levels + [deepest]) if deepest > k else ()


def verify_rows(k: int, deepest: int) -> tuple[int, ...]:
    """The j of mixed_verify_tokens with graphs: 2 .. K + 1, then (deep suffix chains, up to
    `deepest`) x1.5 each up to deepest + 2 (every chain at that depth and a padding token)."""
    out, j = list(range(2, k + 2)), k + 1
    while deepest > k and j < deepest + 2:
        j = min(-(-3 * j // 2), deepest + 2)
        out.append(j)
    return tuple(out)


def pick_bucket(sizes: list[int], n: int) -> int | None:
    """The smallest size >= n, or None when n exceeds them all (sizes ascending)."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def fastest_at_or_above(times: dict[int, float]) -> dict[int, int]:
    """size -> the size >= it whose graph replays fastest (itself on ties): a step padded
    further runs no slower where cuBLAS's tiling of the smaller shape is worse than the
    larger one's (each graph is timed at capture)."""
    route, best = {}, None
    for size in sorted(times, reverse=True):
        if best is None or times[size] <= times[best]:
            best = size
        route[size] = best
    return route


def decode_capture_batch(bs: int, device: torch.device) -> ForwardBatch:
    """The capture layout of the ("decode", bs) graph: every row the dummy request (row 0,
    slot 0, one token), so a replay on it writes no real request's or cached prefix's
    KV. Host fields are the graph's shape constants."""
    i64, i32 = torch.int64, torch.int32
    zeros = lambda dt: torch.zeros(bs, dtype=dt, device=device)  # noqa: E731
    ar = torch.arange(bs, dtype=i64, device=device)
    return ForwardBatch(
        mode=ForwardMode.DECODE, batch_size=bs, padded_batch_size=bs, num_tokens=bs,
        input_ids=zeros(i64), positions=zeros(i64), out_cache_loc=zeros(i64),
        req_pool_indices=zeros(i64), seq_lens=torch.ones(bs, dtype=i32, device=device),
        extend_lens=torch.ones(bs, dtype=i32, device=device), extend_start_loc=ar.to(i32),
        prefix_lens=zeros(i32), logits_indices=ar, seq_lens_cpu=[1] * bs,
        extend_lens_cpu=[1] * bs, prefix_lens_cpu=[0] * bs, max_seq_len=1, max_extend_len=1,
    )


def extend_capture_batch(tokens: int, rows: int, device: torch.device) -> ForwardBatch:
    """The capture layout of the ("extend", tokens) graph over `rows` per-request rows
    (max_num_seqs + 1): a step with no real request, the dummy request (row 0, prefix 0,
    slot 0) holding every token and the other rows empty (runner/staging.py `pad_batch`);
    the extend kernel's grid is then a function of (tokens, rows) only. Host fields are
    the graph's shape constants."""
    t, i64, i32 = tokens, torch.int64, torch.int32
    zeros = lambda n, dt: torch.zeros(n, dtype=dt, device=device)  # noqa: E731
    lens = [t] + [0] * (rows - 1)
    extend_lens = torch.tensor(lens, dtype=i32, device=device)
    start = torch.full((rows,), t, dtype=i32, device=device)
    start[0] = 0
    return ForwardBatch(
        mode=ForwardMode.EXTEND, batch_size=0, padded_batch_size=rows, num_tokens=t,
        input_ids=zeros(t, i64), positions=torch.arange(t, dtype=i64, device=device),
        out_cache_loc=zeros(t, i64), req_pool_indices=zeros(rows, i64),
        seq_lens=extend_lens.clone(), extend_lens=extend_lens, extend_start_loc=start,
        prefix_lens=zeros(rows, i32), logits_indices=zeros(rows, i64), seq_lens_cpu=lens,
        extend_lens_cpu=list(lens), prefix_lens_cpu=[0] * rows, max_seq_len=t, max_extend_len=t,
    )


def copy_into(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """dst.copy_(src) for every pair, as one multi-tensor launch per (dst, src) dtype pair
    (torch._foreach_copy_) instead of a launch each: a VERIFY step copies ~35 graph inputs,
    and a launch each is host time while the device idles. Shapes must match (no
    broadcasting)."""
    groups: dict[tuple, tuple[list, list]] = {}
    for d, s in zip(dsts, srcs, strict=True):
        g = groups.setdefault((d.dtype, s.dtype), ([], []))
        g[0].append(d)
        g[1].append(s)
    for ds, ss in groups.values():
        torch._foreach_copy_(ds, ss)


class GraphCache:
    """CUDA graphs of fixed-shape forwards, one per key, sharing one memory pool: plain
    steps' captured at start-up (`capture`), the others at the speculation warm-up or on
    first use (`run`). A capture warms the body up twice on a side stream, then records
    `fn(static inputs)`; a replay copies the inputs into the static tensors first.

    A plain step's outputs (`owned=False`: its logits and aux) are read before any other
    graph replays, so they stay in the pool, as every graph's intermediates do. Other
    graphs' outputs hold until their own key replays again, whatever replays in between:
    a step reads the draft tree its expansion graph made after the target's VERIFY graph
    ran. In the shared pool they would not: a graph captured later may be given memory
    that an earlier capture's intermediates had, and the earlier graph's replay writes
    those again. So what such a body allocates and returns is copied, inside its graph,
    into tensors of the key's own, outside the pool (`owned_outputs`); what it writes into
    buffers that outlive the call (the target's shared logits, static inputs) comes back
    as it is."""

    def __init__(self, pool=None) -> None:
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.entries: dict[tuple, tuple[object, dict, object]] = {}
        self.watch = None  # after the warm-up: told of every capture (serving_watch.py)

    @torch.inference_mode()
    def capture(self, key: tuple, fn, inputs: dict[str, torch.Tensor], owned: bool = True):
        """Capture `fn(static inputs)` for `key` (static inputs: copies of `inputs`)."""
        t0 = time.perf_counter()
        static = {k: v.clone() for k, v in inputs.items()}
        results = self._warm_up(fn, static)
        if owned:
            own = owned_outputs(*results)
            graph, out = self._capture(lambda: into_owned(fn(static), own))
        else:
            graph, out = self._capture(lambda: fn(static))
        self.entries[key] = (graph, static, out)
        if self.watch is not None:
            self.watch.captured(key, (time.perf_counter() - t0) * 1e3)
        return out

    @torch.inference_mode()
    def run(self, key: tuple, fn, inputs: dict[str, torch.Tensor]):
        """Replay `key`'s graph on `inputs` (captured from `fn` first if new) -> outputs."""
        if key not in self.entries:
            self.capture(key, fn, inputs)
        graph, static, out = self.entries[key]
        copy_into([static[k] for k in inputs], list(inputs.values()))
        graph.replay()
        return out

    @torch.inference_mode()  # the static inputs are inference tensors (captured so)
    def time_ms(self, key: tuple, inputs: dict[str, torch.Tensor], repeats: int = 5) -> float:
        """Device ms of one replay of `key`'s graph on `inputs` (its capture layout: a
        plain step's writes KV to the dummy slot 0 only): one warm-up replay, then the mean
        of `repeats`."""
        graph, static, _ = self.entries[key]
        copy_into([static[k] for k in inputs], list(inputs.values()))
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeats

    def _warm_up(self, fn, static: dict[str, torch.Tensor]) -> tuple[object, object]:
        """Two eager calls on a side stream (kernels compiled and tuned outside the graph)
        -> both results."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            results = fn(static), fn(static)
        torch.cuda.current_stream().wait_stream(stream)
        return results

    def _capture(self, body) -> tuple[torch.cuda.CUDAGraph, object]:
        """Capture `body()` into the shared pool -> (graph, its static outputs)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                out = body()
        torch.cuda.current_stream().wait_stream(stream)
        return graph, out


def map_tensors(fn, out, *others):
    """fn(tensor, *the same leaf of `others`) over the tensors of a body's output (tuples,
    lists, dicts, dataclasses such as DraftTree); anything else comes back as it is."""
    if isinstance(out, torch.Tensor):
        return fn(out, *others)
    if isinstance(out, (tuple, list)):
        items = [map_tensors(fn, *xs) for xs in zip(out, *others, strict=True)]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
    if isinstance(out, dict):
        return {k: map_tensors(fn, v, *(o[k] for o in others)) for k, v in out.items()}
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return dataclasses.replace(out, **{
            f.name: map_tensors(fn, getattr(out, f.name), *(getattr(o, f.name) for o in others))
            for f in dataclasses.fields(out) if f.init})
    return out


def owned_outputs(first, second):
    """From two eager calls of a body: per output tensor, a tensor of its own to copy it
    into (a tensor the call allocated: a different storage each call), or None (the same
    storage both times: a buffer that outlives the call, returned as it is)."""
    def own(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
        if a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr():
            return None
        return torch.empty_like(b)

    return map_tensors(own, first, second)


def into_owned(out, owned):
    """A body's output with each tensor that has an owned one copied into it."""
    return map_tensors(lambda t, o: t if o is None else o.copy_(t), out, owned)
