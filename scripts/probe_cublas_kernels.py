"""Which cuBLAS kernel runs the 8B o_proj (4096 x 4096, bf16) at a mixed step's row counts,
eagerly and inside CUDA graphs, and how long it takes (torch profiler, weights hot in L2).

Session 16 (H200): 128 x 128 tiles at 448 / 512 rows (23-24 us, ~720 TFLOP/s), 128 x 160
at 576, the same kernel eagerly, in a graph, on a row slice of a larger buffer and under
inference_mode. So the 192 x 128 `coopB` kernel at 39.8 us in session 15's profile of
512-token mixed steps was qkv (N = 6144: 38.1 us in scripts/bench_wide_gemm.py), not
o_proj as that session's notes read it.

Usage: python scripts/probe_cublas_kernels.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile


def kernels(tag: str, fn) -> None:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and ("nvjet" in e.key or "gemm" in e.key.lower()):
            print(tag, e.key[:70], round(e.device_time_total / e.count, 1), "us")


def main() -> None:
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for m in (448, 512, 576):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        kernels(f"eager m{m}", lambda x=x: F.linear(x, w))
    x = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16)
    pool = torch.cuda.graph_pool_handle()
    big = torch.randn(576, 32, 128, device="cuda", dtype=torch.bfloat16)
    cases = {"graph": x, "graph-view": big[:512].reshape(512, 4096)}
    for tag, inp in cases.items():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            F.linear(inp, w)
        kernels(tag, graph.replay)
    with torch.inference_mode():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            F.linear(x, w)
        kernels("graph-inference", graph.replay)


if __name__ == "__main__":
    main()
