"""CUDA graphs: DECODE steps (one graph per padded batch size), EXTEND steps (one graph
per padded token count) and lazily captured VERIFY / DRAFT shapes, sharing one memory pool.

Data flow: ModelRunner.prepare_hot_path -> ExtendGraphRunner.capture() (largest first),
DecodeGraphRunner.capture(); per step: ModelRunner.layout(plan) names the graph shape,
BatchBuilder.prepare lays the batch out for it (runner/staging.py, `pad_batch`) ->
`replay(fb)` copies the step's inputs into the static buffers (one copy per tensor),
replays, and returns the static outputs: logits [rows, vocab] (and aux features).
Capturing requires an attention backend whose paths read lengths from device tensors
only and size their grids from host ints fixed by the shape (the Triton backend); the
torch reference backend runs eagerly.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from dataclasses import dataclass

import torch

from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.progress import progress


@dataclass
class _StaticBuffers:
    input_ids: torch.Tensor  # [max_bs] int64
    positions: torch.Tensor  # [max_bs] int64
    out_cache_loc: torch.Tensor  # [max_bs] int64
    req_pool_indices: torch.Tensor  # [max_bs] int64
    seq_lens: torch.Tensor  # [max_bs] int32
    prefix_lens: torch.Tensor  # [max_bs] int32
    ones: torch.Tensor  # [max_bs] int32 (extend_lens of a decode batch)
    arange: torch.Tensor  # [max_bs] int64 (logits indices)
    arange32: torch.Tensor  # [max_bs] int32 (start locations)

    @classmethod
    def allocate(cls, max_bs: int, device: torch.device) -> _StaticBuffers:
        z = lambda dt: torch.zeros(max_bs, dtype=dt, device=device)
        ar = torch.arange(max_bs, dtype=torch.int64, device=device)
        return cls(z(torch.int64), z(torch.int64), z(torch.int64), z(torch.int64),
                   torch.ones(max_bs, dtype=torch.int32, device=device), z(torch.int32),
                   torch.ones(max_bs, dtype=torch.int32, device=device), ar, ar.to(torch.int32))

    def dummy_batch(self, bs: int) -> ForwardBatch:
        """The capture layout: every row is the dummy request (row 0, slot 0, one token), so
        a replay on it writes no real request's or cached prefix's KV."""
        for buf in (self.input_ids, self.positions, self.out_cache_loc, self.req_pool_indices,
                    self.prefix_lens):
            buf[:bs].zero_()
        self.seq_lens[:bs].fill_(1)
        return self.batch(bs)

    def batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            mode=ForwardMode.DECODE, batch_size=bs, padded_batch_size=bs, num_tokens=bs,
            input_ids=self.input_ids[:bs], positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs], req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs], extend_lens=self.ones[:bs],
            extend_start_loc=self.arange32[:bs], prefix_lens=self.prefix_lens[:bs],
            logits_indices=self.arange[:bs], seq_lens_cpu=[1] * bs, extend_lens_cpu=[1] * bs,
            prefix_lens_cpu=[0] * bs, max_seq_len=1, max_extend_len=1,
        )


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


def mixed_verify_tokens(rows: int, tokens: int) -> int:
    """Token bucket of a VERIFY pass over chains of different lengths (`tokens` real ones,
    `rows` the padded batch): rows * j for j in 2 .. K + 1, with at least one padding token
    (the masked nodes of shorter chains read it). Every bucket a mixed plan of `rows`
    requests can reach, so the warm-up covers them all."""
    return max(-(-(tokens + 1) // rows), 2) * rows


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


def replay_ms(graph: torch.cuda.CUDAGraph, repeats: int = 5) -> float:
    """Device ms of one replay of `graph` on whatever its static inputs hold: one warm-up
    replay, then the mean of `repeats`."""
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


@torch.inference_mode()
def capture_graphs(sizes: list[int], batch_for, forward, pool):
    """Capture `forward(batch_for(size))` for every size, largest first (later graphs reuse
    its memory), into `pool` (None: a new one). -> (graphs, static outputs, pool)."""
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    outputs: dict[int, object] = {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for size in progress(sorted(sizes, reverse=True), desc="capturing CUDA graphs",
                             unit="graph"):
            fb = batch_for(size)
            for _ in range(2):  # warm up kernels / autotuning outside the graph
                forward(fb)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                outputs[size] = forward(fb)
            if pool is None:
                pool = graph.pool()
            graphs[size] = graph
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return graphs, outputs, pool


class DecodeGraphRunner:
    def __init__(self, forward_logits, max_bs: int, device: torch.device, pool=None) -> None:
        self.forward_logits = forward_logits  # (ForwardBatch) -> logits [bs, vocab] (, aux)
        self.sizes = default_batch_sizes(max_bs)
        self.buf = _StaticBuffers.allocate(max_bs, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, object] = {}  # static output tensor(s) per graph
        self.pool = pool  # None: capture() creates one

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.mode is ForwardMode.DECODE and fb.padded_batch_size in self.graphs

    def padded_size(self, bs: int) -> int:
        return pick_bucket(self.sizes, bs) or bs

    def capture(self) -> None:
        self.graphs, self.outputs, self.pool = capture_graphs(
            self.sizes, self.buf.dummy_batch, self.forward_logits, self.pool)

    def time_ms(self, bs: int, repeats: int = 5) -> float:
        """Device ms of one replay of the `bs` graph on the capture layout (the static
        inputs hold the last real step's until then)."""
        self.buf.dummy_batch(bs)
        return replay_ms(self.graphs[bs], repeats)

    def replay(self, fb: ForwardBatch):
        bs = fb.padded_batch_size
        b = self.buf
        copy_into([b.input_ids[:bs], b.positions[:bs], b.out_cache_loc[:bs],
                   b.req_pool_indices[:bs], b.seq_lens[:bs], b.prefix_lens[:bs]],
                  [fb.input_ids, fb.positions, fb.out_cache_loc, fb.req_pool_indices,
                   fb.seq_lens, fb.prefix_lens])
        self.graphs[bs].replay()
        return self.outputs[bs]


@dataclass
class _ExtendBuffers:
    """Static inputs of the EXTEND graphs: tokens of the largest bucket, `rows` requests."""

    input_ids: torch.Tensor  # [max_tokens] int64
    positions: torch.Tensor  # [max_tokens] int64
    out_cache_loc: torch.Tensor  # [max_tokens] int64
    req_pool_indices: torch.Tensor  # [rows] int64
    seq_lens: torch.Tensor  # [rows] int32
    extend_lens: torch.Tensor  # [rows] int32
    extend_start_loc: torch.Tensor  # [rows] int32
    prefix_lens: torch.Tensor  # [rows] int32
    logits_indices: torch.Tensor  # [rows] int64

    @classmethod
    def allocate(cls, max_tokens: int, rows: int, device: torch.device) -> _ExtendBuffers:
        z = lambda n, dt: torch.zeros(n, dtype=dt, device=device)
        i64, i32 = torch.int64, torch.int32
        return cls(z(max_tokens, i64), z(max_tokens, i64), z(max_tokens, i64), z(rows, i64),
                   z(rows, i32), z(rows, i32), z(rows, i32), z(rows, i32), z(rows, i64))

    def capture_batch(self, num_tokens: int) -> ForwardBatch:
        """The static batch of the `num_tokens` graph, filled with the layout of a step with
        no real request: the dummy request (row 0, prefix 0, slot 0) holds every token and
        the other rows are empty. Host fields are the graph's shape constants."""
        t, rows = num_tokens, self.req_pool_indices.shape[0]
        self.input_ids[:t].zero_()
        self.positions[:t].copy_(torch.arange(t, device=self.positions.device))
        self.out_cache_loc[:t].zero_()
        for buf in (self.req_pool_indices, self.prefix_lens, self.logits_indices):
            buf.zero_()
        self.extend_lens.zero_()
        self.extend_lens[0] = t
        self.seq_lens.copy_(self.extend_lens)
        self.extend_start_loc.fill_(t)
        self.extend_start_loc[0] = 0
        lens = [t] + [0] * (rows - 1)
        return ForwardBatch(
            mode=ForwardMode.EXTEND, batch_size=0, padded_batch_size=rows, num_tokens=t,
            input_ids=self.input_ids[:t], positions=self.positions[:t],
            out_cache_loc=self.out_cache_loc[:t], req_pool_indices=self.req_pool_indices,
            seq_lens=self.seq_lens, extend_lens=self.extend_lens,
            extend_start_loc=self.extend_start_loc, prefix_lens=self.prefix_lens,
            logits_indices=self.logits_indices, seq_lens_cpu=lens, extend_lens_cpu=list(lens),
            prefix_lens_cpu=[0] * rows, max_seq_len=t, max_extend_len=t,
        )


class ExtendGraphRunner:
    """CUDA graphs for EXTEND steps (prefill chunks, decoders riding along as 1-token
    extends), one per padded token count in `sizes`, all over `rows` per-request rows
    (max_num_seqs + 1): the real requests, one dummy request holding the padding tokens,
    then empty requests (layout: `pad_batch` in runner/staging.py). The extend kernel's grid
    is then a function of (tokens, rows) only. Graphs return the static logits
    [rows, vocab] (and aux features [tokens, ...] when the forward captures them)."""

    def __init__(self, forward, sizes: list[int], rows: int, device: torch.device,
                 pool=None) -> None:
        self.forward = forward  # (ForwardBatch) -> logits [rows, vocab] (, aux)
        self.sizes = sorted(sizes)
        self.rows = rows
        self.buf = _ExtendBuffers.allocate(max(sizes), rows, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, object] = {}  # static output tensor(s) per graph
        self.pool = pool  # None: capture() creates one

    def can_run(self, fb: ForwardBatch) -> bool:
        return (fb.mode is ForwardMode.EXTEND and fb.tree is None
                and fb.padded_batch_size == self.rows and fb.num_tokens in self.graphs)

    def capture(self) -> None:
        self.graphs, self.outputs, self.pool = capture_graphs(
            self.sizes, self.buf.capture_batch, self.forward, self.pool)

    def replay_ms(self, repeats: int = 5) -> dict[int, float]:
        """Device ms of one replay of each captured graph (see time_ms)."""
        return {size: self.time_ms(size, repeats) for size in self.graphs}

    def time_ms(self, size: int, repeats: int = 5) -> float:
        """Device ms of one replay of the `size` graph on its capture batch (the dummy
        request's tokens: its KV goes to slot 0 only). The static inputs hold the last real
        step's until then: logits rows past `size`, slots of live or cached KV."""
        self.buf.capture_batch(size)
        return replay_ms(self.graphs[size], repeats)

    def replay(self, fb: ForwardBatch):
        t = fb.num_tokens
        b = self.buf
        copy_into([b.input_ids[:t], b.positions[:t], b.out_cache_loc[:t], b.req_pool_indices,
                   b.seq_lens, b.extend_lens, b.extend_start_loc, b.prefix_lens,
                   b.logits_indices],
                  [fb.input_ids, fb.positions, fb.out_cache_loc, fb.req_pool_indices,
                   fb.seq_lens, fb.extend_lens, fb.extend_start_loc, fb.prefix_lens,
                   fb.logits_indices])
        self.graphs[t].replay()
        return self.outputs[t]


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


class ShapeGraphs:
    """Lazily captured CUDA graphs for fixed-shape forwards other than DECODE (VERIFY over
    a uniform number of candidates per request, DRAFT steps). A key names the shape; the
    first call with a key warms up and captures `fn(static_inputs)`, later calls copy the
    inputs into the static tensors and replay. All graphs share one memory pool.

    A graph's outputs hold until its own key replays again, whatever replays in between:
    a step reads the draft tree its expansion graph made after the target's VERIFY graph
    ran. In the shared pool they would not: a graph captured later may be given memory
    that an earlier capture's intermediates had, and the earlier graph's replay writes
    those again (the pool is only safe for outputs read before the next replay of any
    other graph). So what a body allocates and returns is copied, inside its graph, into
    tensors of the key's own, outside the pool (`owned_outputs`); what it writes into
    buffers that outlive the call (the target's shared logits, static inputs) comes back
    as it is."""

    def __init__(self, pool=None) -> None:
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.entries: dict[tuple, tuple[object, dict, object]] = {}
        self.watch = None  # after the warm-up: told of every capture (serving_watch.py)

    @torch.inference_mode()
    def run(self, key: tuple, fn, inputs: dict[str, torch.Tensor]):
        entry = self.entries.get(key)
        if entry is None:
            t0 = time.perf_counter()
            static = {k: v.clone() for k, v in inputs.items()}
            owned = owned_outputs(*self._warm_up(fn, static))
            graph, out = self._capture(lambda: into_owned(fn(static), owned))
            entry = self.entries[key] = (graph, static, out)
            if self.watch is not None:
                self.watch.captured(key, (time.perf_counter() - t0) * 1e3)
        graph, static, out = entry
        copy_into([static[k] for k in inputs], list(inputs.values()))
        graph.replay()
        return out

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
