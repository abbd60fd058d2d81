"""H200 microbenchmark: torch's two BLAS back ends for the Llama-3.1-8B layer GEMMs at the
offline run's row counts (64-row decode, 256-576-row mixed steps), bf16: cuBLAS (torch's
default) against cuBLASLt (`torch.backends.cuda.preferred_blas_library("cublaslt")`),
each `F.linear` timed as the skinny chooser times (CUDA graph, L2 evicted by a read).

Why (session 18): the 512-token mixed steps are 46% of the offline run and their GEMMs
run at 633-754 TFLOP/s on cuBLAS (session 16); the engine never tried the other back end.
Prints us and TFLOP/s per shape and the layer's GEMM sum per row count; writes JSON.

Usage: python scripts/bench_blas_library.py --out blas_library.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from gearshift.kernels.skinny_select import graph_ms, kernel_ms

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336), "lm_head": (128256, 4096)}
LIBRARIES = ("cublas", "cublaslt")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="*", default=[64, 256, 448, 512, 576])
    ap.add_argument("--out", default="blas_library.json")
    a = ap.parse_args()
    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = graph_ms(lambda: None, flush)
    weights = {name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
               for name, (n, k) in SHAPES.items()}
    rows_out = []
    for m in a.rows:
        sums = dict.fromkeys(LIBRARIES, 0.0)
        for name, w in weights.items():
            x = torch.randn(m, w.shape[1], device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), w.float())
            row = {"rows": m, "shape": name}
            for lib in LIBRARIES:
                torch.backends.cuda.preferred_blas_library(lib)
                out = F.linear(x, w)
                err = (out.float() - ref).abs().max().item()
                ms = kernel_ms(lambda x=x, w=w: F.linear(x, w), flush, evict_ms)
                row[lib] = {"us": ms * 1e3, "tflops": 2 * m * w.numel() / ms / 1e9, "max_err": err}
                if name != "lm_head":
                    sums[lib] += ms * 1e3
            torch.backends.cuda.preferred_blas_library("cublas")
            rows_out.append(row)
            print(f"{m:4d} rows {name:8s} " + "  ".join(
                f"{lib} {row[lib]['us']:7.1f} us ({row[lib]['tflops']:4.0f} TF)" for lib in LIBRARIES),
                flush=True)
        print(f"{m:4d} rows layer GEMMs: " + "  ".join(f"{lib} {sums[lib]:.1f} us" for lib in LIBRARIES))
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
