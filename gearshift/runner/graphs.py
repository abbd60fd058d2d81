"""CUDA graphs for DECODE steps, one per padded batch size, sharing one memory pool.

Data flow: ModelRunner.__init__ -> DecodeGraphRunner.capture(); per DECODE step:
BatchBuilder pads the batch to `padded_size(bs)` -> `replay(fb)` copies the step's
inputs into the static buffers, replays, and returns logits [padded_bs, vocab].
Capturing requires an attention backend whose DECODE path reads lengths from device
tensors only (the Triton backend); the torch reference backend runs eagerly.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from gearshift.forward_batch import ForwardBatch, ForwardMode


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


class DecodeGraphRunner:
    def __init__(self, forward_logits, max_bs: int, device: torch.device) -> None:
        self.forward_logits = forward_logits  # (ForwardBatch) -> logits [bs, vocab] (, aux)
        self.sizes = default_batch_sizes(max_bs)
        self.buf = _StaticBuffers.allocate(max_bs, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, object] = {}  # static output tensor(s) per graph
        self.pool = None

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.mode is ForwardMode.DECODE and fb.padded_batch_size in self.graphs

    def padded_size(self, bs: int) -> int:
        i = bisect.bisect_left(self.sizes, bs)
        return self.sizes[i] if i < len(self.sizes) else bs

    @torch.inference_mode()
    def capture(self) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):  # largest first: later graphs reuse its pool
                fb = self.buf.batch(bs)
                for _ in range(2):  # warm up kernels / autotuning outside the graph
                    self.forward_logits(fb)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    self.outputs[bs] = self.forward_logits(fb)
                if self.pool is None:
                    self.pool = graph.pool()
                self.graphs[bs] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def replay(self, fb: ForwardBatch):
        bs = fb.padded_batch_size
        b = self.buf
        b.input_ids[:bs].copy_(fb.input_ids)
        b.positions[:bs].copy_(fb.positions)
        b.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        b.req_pool_indices[:bs].copy_(fb.req_pool_indices)
        b.seq_lens[:bs].copy_(fb.seq_lens)
        b.prefix_lens[:bs].copy_(fb.prefix_lens)
        self.graphs[bs].replay()
        return self.outputs[bs]


class ShapeGraphs:
    """Lazily captured CUDA graphs for fixed-shape forwards other than DECODE (VERIFY over
    a uniform number of candidates per request, DRAFT steps). A key names the shape; the
    first call with a key warms up and captures `fn(static_inputs)`, later calls copy the
    inputs into the static tensors and replay. All graphs share one memory pool."""

    def __init__(self, pool=None) -> None:
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.entries: dict[tuple, tuple[torch.cuda.CUDAGraph, dict, object]] = {}

    @torch.inference_mode()
    def run(self, key: tuple, fn, inputs: dict[str, torch.Tensor]):
        entry = self.entries.get(key)
        if entry is None:
            static = {k: v.clone() for k, v in inputs.items()}
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    fn(static)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    out = fn(static)
            torch.cuda.current_stream().wait_stream(stream)
            entry = self.entries[key] = (graph, static, out)
        graph, static, out = entry
        for k, v in inputs.items():
            static[k].copy_(v)
        graph.replay()
        return out
