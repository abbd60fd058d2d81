"""H200 microbenchmark: the layer GEMMs of a mixed step (256-512 rows) through cuBLAS and
through the engine's TMA tile kernel (models/kernels/skinny_gemm.py, SkinnyConfig.tma,
several row blocks since session 16) at compute-bound tilings.

Why: session 15 read its profile of 512-token mixed steps (Llama-3.1-8B shapes) as cuBLAS
at 427 TFLOP/s on o_proj (4096 x 4096, 192 x 128 tiles: 88 thread blocks on 132 SMs),
where 128 x 128 tiles would make 128. The gated form (SiLU in the epilogue) would also
save the SiLU kernel (11.4 us a layer at 512 rows).

Session 16 (H200, call E): no tiling beat cuBLAS at 256 or 512 rows. o_proj at 512 rows:
cuBLAS 27.2 us (633 TFLOP/s), the best TMA tiling 27.4; gate_up + SiLU 173.2 against
186.7; down 79.7 against 83.6; qkv 38.1 against 48.4. The 427 reading was qkv's kernel
(scripts/probe_cublas_kernels.py): o_proj runs cuBLAS's 128 x 128 tiles.

Timed as the chooser times (CUDA graph, L2 evicted by a read before each call), each
variant checked against an fp32 product. Writes JSON; prints every variant with TFLOP/s.

Usage: python scripts/bench_wide_gemm.py --out wide.json [--rows 256 512]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from gearshift.kernels import skinny_select as sel
from gearshift.kernels.activation import silu_and_mul
from gearshift.kernels.skinny_gemm import SkinnyConfig, skinny_linear

SHAPES = {"qkv": (6144, 4096, False), "o_proj": (4096, 4096, False),
          "gate_up": (28672, 4096, True), "down": (4096, 14336, False)}
CONFIGS = [SkinnyConfig(128, 128, 64, 8, 3, True), SkinnyConfig(128, 128, 64, 8, 4, True),
           SkinnyConfig(128, 256, 64, 8, 3, True), SkinnyConfig(64, 128, 64, 4, 4, True),
           SkinnyConfig(128, 64, 64, 4, 4, True), SkinnyConfig(64, 256, 64, 8, 3, True),
           SkinnyConfig(128, 128, 128, 8, 2, True), SkinnyConfig(128, 128, 64, 8, 4, False)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="wide_gemm.json")
    ap.add_argument("--rows", type=int, nargs="*", default=[256, 512])
    args = ap.parse_args()
    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = sel.graph_ms(lambda: None, flush)
    results = []
    for name, (n, k, gated) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        for m in args.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), w.float())
            if gated:
                ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2:]
            flops = 2.0 * m * n * k
            def cublas(x=x, w=w, gated=gated):
                return silu_and_mul(F.linear(x, w)) if gated else F.linear(x, w)

            variants = {"cublas" + ("+silu" if gated else ""): cublas}
            for cfg in CONFIGS:
                variants[sel._name(cfg)] = (lambda cfg=cfg, x=x, w=w, gated=gated:
                                            skinny_linear(x, w, config=cfg, gated=gated))
            for vname, fn in variants.items():
                try:
                    err = (fn().float() - ref).abs().max().item()
                    ms = sel.kernel_ms(fn, flush, evict_ms)
                except OutOfResources:
                    print(f"{name:8s} m{m:4d} {vname:40s} out of resources")
                    continue
                row = {"shape": name, "rows": m, "n": n, "k": k, "gated": gated, "variant": vname,
                       "us": ms * 1e3, "tflops": flops / ms / 1e9, "max_err": err}
                results.append(row)
                print(f"{name:8s} m{m:4d} {vname:40s} {row['us']:8.1f} us {row['tflops']:6.0f} TFLOP/s"
                      f" err {err:.1e}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
