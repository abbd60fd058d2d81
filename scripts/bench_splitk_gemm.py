"""Experiment, prepared in session 13 for the next session (H200): a split-K weight-streaming
GEMM for the batch-64 decode step's layer GEMMs, against cuBLAS and the skinny kernel.

Why: session 13's graphed profile of that step has the layer GEMMs at 125 µs a layer
against a 104 µs weight-streaming floor (docs/benchmarks/2026-11-30-h200-session13.md),
~0.7 ms of the ~1 ms a step that 8,000 tok/s needs. The skinny kernel gives every program
all of x for its column block, so at 64 rows and BLOCK_N 32 the programs re-read x
N / 32 times from L2 (down_proj: 235 MB a call). Wider column blocks cut that traffic,
and splitting K restores the number of programs. Each split stores its fp32 partial in a
workspace. The last split of a column block to finish (a ticket, as in the decode
kernel's fused merge) sums the partials and writes the output, in the same launch.

The kernel lives here until it wins. Numbers: µs a call, timed as the skinny chooser
times (CUDA graph, L2 evicted), the max error against an fp32 product.

Usage: python scripts/bench_splitk_gemm.py --rows 64 --out splitk.json
       TRITON_INTERPRET=1 python scripts/bench_splitk_gemm.py --check   (CPU self-check)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LAYER = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096),
         "down": (4096, 14336)}


@triton.jit
def _splitk_kernel(
    X, W, Out, Work, Count, M, N, K, k_per_split, stride_xm, stride_wn, stride_om,
    SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = offs_m < M, offs_n < N
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    x_ptrs = X + offs_m[:, None] * stride_xm + (k_start + offs_k)[None, :]
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + (k_start + offs_k)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k_ok = (k0 + offs_k) < k_end
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_ptrs = Out + offs_m[:, None] * stride_om + offs_n[None, :]
    out_mask = m_ok[:, None] & n_ok[None, :]
    if SPLITS == 1:
        tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=out_mask)
    else:
        rows = split * BLOCK_M + offs_m  # workspace [SPLITS * BLOCK_M, N] fp32
        tl.store(Work + rows[:, None] * N + offs_n[None, :], acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial before the release below
        ticket = tl.atomic_add(Count + pid_n, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLITS - 1:  # the last split of this column block: sum the partials
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLITS):
                part_ptrs = Work + (s * BLOCK_M + offs_m)[:, None] * N + offs_n[None, :]
                total += tl.load(part_ptrs, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(Out.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(Count + pid_n, 0)  # zero again for the next call


class SplitK:
    """One (shape, tiling): persistent fp32 workspace and zeroed tickets, graph-safe."""

    def __init__(self, m: int, n: int, k: int, block_n: int, block_k: int, splits: int,
                 warps: int, stages: int, device) -> None:
        self.block_m = max(16, triton.next_power_of_2(m))
        self.block_n, self.block_k, self.splits = block_n, block_k, splits
        self.warps, self.stages = (1, 1) if _INTERPRET else (warps, stages)
        self.k_per_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
        self.work = torch.empty(splits * self.block_m, n, dtype=torch.float32, device=device)
        self.count = torch.zeros(triton.cdiv(n, block_n), dtype=torch.int32, device=device)

    def name(self) -> str:
        return (f"splitk_n{self.block_n}_k{self.block_k}_s{self.splits}"
                f"_w{self.warps}_st{self.stages}")

    def __call__(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        m, k = x.shape
        n = w.shape[0]
        _splitk_kernel[(triton.cdiv(n, self.block_n), self.splits)](
            x, w, out, self.work, self.count, m, n, k, self.k_per_split,
            x.stride(0), w.stride(0), out.stride(0),
            SPLITS=self.splits, BLOCK_M=self.block_m, BLOCK_N=self.block_n,
            BLOCK_K=self.block_k, num_warps=self.warps, num_stages=self.stages)
        return out


def check() -> None:
    """CPU (TRITON_INTERPRET=1) or GPU: ragged shapes, every split count, called twice (the
    tickets must be left zeroed), against an fp32 product."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    for m, n, k, splits in ((5, 70, 300, 1), (5, 70, 300, 3), (16, 40, 200, 4), (1, 33, 96, 2)):
        x = torch.randn(m, k, generator=g).to(device, torch.float16)
        w = (torch.randn(n, k, generator=g) / k**0.5).to(device, torch.float16)
        gemm = SplitK(m, n, k, 32, 32, splits, 4, 3, device)
        ref = F.linear(x.float(), w.float())
        for _ in range(2):
            out = gemm(x, w, torch.full((m, n), float("nan"), dtype=x.dtype, device=device))
            torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
        assert int(gemm.count.abs().sum()) == 0, "tickets were not left zeroed"
    print("check passed")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[64])
    ap.add_argument("--check", action="store_true", help="the self-check only")
    ap.add_argument("--out", default="splitk.json")
    a = ap.parse_args()
    if a.check:
        check()
        return
    from gearshift.kernels.skinny_select import CHOOSER, graph_ms, kernel_ms, row_bucket

    check()
    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = graph_ms(lambda: None, flush)
    rows_out = []
    for m, (name, (n, k)) in itertools.product(a.rows, LAYER.items()):
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x.float(), w.float())
        CHOOSER.choose(x, w, None)  # the skinny chooser's own timings of this shape
        key = (row_bucket(m), n, k, torch.bfloat16, False)
        ms = dict(CHOOSER.timings[key])
        err = {}
        for bn, bk, splits, (warps, stages) in itertools.product(
                (64, 128), (64, 128), (1, 2, 4, 8), ((4, 3), (4, 4), (8, 3))):
            gemm = SplitK(m, n, k, bn, bk, splits, warps, stages, "cuda")
            out = torch.empty(m, n, dtype=x.dtype, device="cuda")
            try:
                gemm(x, w, out)
            except triton.runtime.errors.OutOfResources:
                continue
            err[gemm.name()] = (out.float() - ref).abs().max().item()
            ms[gemm.name()] = kernel_ms(lambda gemm=gemm, x=x, w=w, out=out: gemm(x, w, out),
                                        flush, evict_ms)
        best = min((v, kk) for kk, v in ms.items() if kk.startswith("splitk"))
        gb = n * k * 2 / 1e9
        rows_out.append({"shape": name, "rows": m, "n": n, "k": k, "ms": ms, "err": err,
                         "best": best[1]})
        print(f"{name:8s} m={m:3d} cublas {ms['cublas'] * 1e3:6.1f}us "
              f"({gb / ms['cublas'] * 1e3:5.0f} GB/s)  split-K {best[0] * 1e3:6.1f}us "
              f"({gb / best[0] * 1e3:5.0f} GB/s) {best[1]} err {err[best[1]]:.1e}", flush=True)
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
