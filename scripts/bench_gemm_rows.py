"""H200 microbenchmark: the mid-size GEMMs of a mixed EXTEND step (128-512 rows: a prefill
chunk with the decoders riding along) on the Llama-3.1-8B layer shapes, cuBLAS against
the Triton tile kernel (skinny_gemm, tiling M too) over a grid of tilings, timed as the
skinny chooser times (CUDA graph, L2 evicted). Prints µs, TFLOP/s and the step's GEMM
time (x 32 layers) per row count, and writes JSON.

Why (session 13): the offline run's 256-token mixed step takes ~9.5 ms, against ~4.5 ms
of its FLOPs at 800 TFLOP/s and ~3.8 ms of weight streaming; attention is ~2 ms of it.
At 256 rows cuBLAS's usual 128 x 128 tiles give o_proj and down (N = 4096) 64 tiles on
132 SMs, so the question is whether narrower tiles fill the GPU better.

Usage: python scripts/bench_gemm_rows.py --rows 128 256 512 --out gemm_rows.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from gearshift.kernels.skinny_gemm import SkinnyConfig, skinny_linear
from gearshift.kernels.skinny_select import _name, graph_ms, kernel_ms

LAYER = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096),
         "down": (4096, 14336)}
LAYERS = 32
TILINGS = [SkinnyConfig(bm, bn, bk, w, s) for bm, bn, bk, (w, s) in itertools.product(
    (64, 128), (64, 128), (64, 128), ((4, 3), (4, 4), (8, 3), (8, 4)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--out", default="gemm_rows.json")
    a = ap.parse_args()
    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = graph_ms(lambda: None, flush)
    out = []
    for m in a.rows:
        step = {"cublas": 0.0, "best": 0.0}
        for name, (n, k) in LAYER.items():
            w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), w.float())
            ms = {"cublas": kernel_ms(lambda x=x, w=w: F.linear(x, w), flush, evict_ms)}
            err = {}
            for cfg in TILINGS:
                try:
                    y = skinny_linear(x, w, config=cfg)
                except OutOfResources:
                    continue
                err[_name(cfg)] = (y.float() - ref).abs().max().item()
                ms[_name(cfg)] = kernel_ms(lambda cfg=cfg, x=x, w=w: skinny_linear(x, w, config=cfg),
                                           flush, evict_ms)
            best = min((v, kk) for kk, v in ms.items() if kk != "cublas")
            tflop = 2 * m * n * k / 1e12
            row = {"shape": name, "rows": m, "n": n, "k": k, "cublas_ms": ms["cublas"],
                   "best": best[1], "best_ms": best[0], "best_err": err[best[1]],
                   "cublas_tflops": tflop / ms["cublas"] * 1e3, "best_tflops": tflop / best[0] * 1e3,
                   "all_ms": ms}
            out.append(row)
            step["cublas"] += LAYERS * ms["cublas"]
            step["best"] += LAYERS * min(ms["cublas"], best[0])
            print(f"{name:8s} m={m:4d} cublas {ms['cublas'] * 1e3:7.1f}us "
                  f"({row['cublas_tflops']:4.0f} TFLOP/s)  triton {best[0] * 1e3:7.1f}us "
                  f"({row['best_tflops']:4.0f}) {best[1]} err {row['best_err']:.1e}", flush=True)
        print(f"m={m}: layer GEMMs x {LAYERS}: cuBLAS {step['cublas']:.2f} ms, "
              f"best of both {step['best']:.2f} ms", flush=True)
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
