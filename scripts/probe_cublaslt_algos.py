"""Does an algorithm from cuBLASLt's wider heuristic list beat torch's cuBLAS pick on the
8B layer products? (`gearshift/models/kernels/cublaslt.py`: up to --count algorithms per
shape, each run by ctypes.)

Shapes: qkv (6144 x 4096), o_proj (4096 x 4096, out += : the residual add), gate_up
(28672 x 4096), down (4096 x 14336, out +=), at the mixed step's 512 rows and the decode
step's 64. Each candidate is timed as the skinny chooser times (CUDA graph, L2 evicted,
skinny_select.kernel_ms) next to torch's cuBLAS (`F.linear` / `addmm_`) and torch's
cuBLASLt pick, and checked against cuBLAS's result.

Usage: python scripts/probe_cublaslt_algos.py [--rows 512 64] [--count 48] --out lt.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.models.kernels.cublaslt import LtGemm  # noqa: E402
from gearshift.models.kernels.skinny_select import graph_ms, kernel_ms  # noqa: E402

SHAPES = {"qkv": (6144, 4096, False), "o_proj": (4096, 4096, True),
          "gate_up": (28672, 4096, False), "down": (4096, 14336, True)}


def torch_fn(x, w, out, acc):
    if acc:
        return lambda: out.addmm_(x, w.t())
    return lambda: torch.mm(x, w.t(), out=out)


def under_lt(fn):
    def run():
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            fn()
        finally:
            torch.backends.cuda.preferred_blas_library("default")
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="*", default=[512, 64])
    ap.add_argument("--count", type=int, default=48)
    ap.add_argument("--out", default="cublaslt_algos.json")
    a = ap.parse_args()
    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = graph_ms(lambda: None, flush)
    g = torch.Generator(device="cuda").manual_seed(0)
    result = {"device": torch.cuda.get_device_name(), "shapes": []}
    for m in a.rows:
        for name, (n, k, acc) in SHAPES.items():
            x = (torch.randn(m, k, device="cuda", generator=g) * 0.1).bfloat16()
            w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
            base = torch.randn(m, n, device="cuda", generator=g).bfloat16()
            out = base.clone()
            ref = base.clone()
            torch_fn(x, w, ref, acc)()
            us = {}
            for label, fn in (("cublas", torch_fn(x, w, out, acc)),
                              ("torch_lt", under_lt(torch_fn(x, w, out, acc)))):
                fn()
                us[label] = kernel_ms(fn, flush, evict_ms) * 1e3
            gemm = LtGemm(m, n, k, torch.bfloat16, accumulate=acc)
            rows = []
            for i, algo in enumerate(gemm.candidates(a.count)):
                out.copy_(base)
                try:
                    gemm.run(algo, x, w, out)
                    torch.cuda.synchronize()
                except RuntimeError as e:
                    rows.append({"i": i, "algo": algo.describe(), "error": str(e)})
                    continue
                err = (out.float() - ref.float()).abs().max().item()
                t = kernel_ms(lambda algo=algo, g=gemm, x=x, w=w, o=out: g.run(algo, x, w, o),
                              flush, evict_ms) * 1e3
                rows.append({"i": i, "algo": algo.describe(), "us": t, "max_err": err})
            timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
            flops = 2 * m * n * k
            print(f"m={m} {name}: cublas {us['cublas']:.1f} us ({flops / us['cublas'] / 1e6:.0f} TF), "
                  f"torch lt {us['torch_lt']:.1f}, {len(rows)} lt algos; best:")
            for r in timed[:4]:
                print(f"   {r['us']:6.1f} us (#{r['i']}) err {r['max_err']:.1e} {r['algo']}")
            result["shapes"].append({"m": m, "name": name, "n": n, "k": k, "accumulate": acc,
                                     "us": us, "lt": rows})
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
