"""H200 microbenchmark of the skinny GEMM against cuBLAS on the Llama-3.1-8B linear shapes
(qkv, o_proj, gate_up, down, lm_head) at 1..64 rows: every tiling in a wide candidate set,
timed as the runtime chooser times them (in CUDA graphs, L2 evicted), plus the max
error against an fp32 product. Writes JSON; prints a table with GB/s.

Usage: python scripts/bench_skinny.py --out skinny.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from gearshift.kernels import skinny_select as sel
from gearshift.kernels.skinny_gemm import SkinnyConfig, skinny_linear

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336), "lm_head": (128256, 4096)}
WIDE = {
    16: [SkinnyConfig(16, bn, bk, w, s) for bn in (16, 32) for bk in (128, 256, 512)
         for w, s in ((4, 3), (4, 4), (8, 4))],
    # 32 / 64 rows: session 5's set (BLOCK_N 16 / 32) lost to cuBLAS at 64 rows on every 8B
    # shape, BLOCK_N 32 always ahead of 16. Every program re-reads the whole x tile, so
    # wider column blocks cut that traffic: BLOCK_N up to 128, 8 warps. Tilings whose
    # shared memory does not fit are skipped by the chooser (timed as inf).
    32: [SkinnyConfig(32, bn, bk, w, s) for bn in (32, 64, 128) for bk in (128, 256)
         for w, s in ((4, 4), (8, 4))],
    64: [SkinnyConfig(64, bn, bk, w, s) for bn in (32, 64, 128) for bk in (64, 128, 256)
         for w, s in ((4, 4), (8, 3), (8, 4))],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="skinny.json")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    a = ap.parse_args()
    sel.CANDIDATES.update({k: tuple(v) for k, v in WIDE.items()})
    chooser = sel.SkinnyChooser("auto")
    rows_out = []
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        for m in a.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            choice = chooser.choose(x, w, None)
            key = (sel.row_bucket(m), n, k, torch.bfloat16, False)
            ms = chooser.timings[key]
            ref = F.linear(x.float(), w.float())
            cfg = choice or sel.CANDIDATES[sel.row_block(m)][0]
            err = (skinny_linear(x, w, config=cfg).float() - ref).abs().max().item()
            err_cublas = (F.linear(x, w).float() - ref).abs().max().item()
            best = min((v, kk) for kk, v in ms.items() if kk != "cublas")  # inf: did not fit
            gb = n * k * 2 / 1e9
            row = {"shape": name, "n": n, "k": k, "rows": m, "cublas_ms": ms["cublas"],
                   "best_skinny": best[1], "best_skinny_ms": best[0],
                   "chosen": sel._name(choice) if choice else "cublas",
                   "cublas_gbps": gb / ms["cublas"] * 1e3, "skinny_gbps": gb / best[0] * 1e3,
                   "max_err_skinny": err, "max_err_cublas": err_cublas, "all_ms": ms}
            rows_out.append(row)
            print(f"{name:8s} m={m:3d} cublas {ms['cublas']*1e3:8.1f}us ({row['cublas_gbps']:6.0f} GB/s)"
                  f"  skinny {best[0]*1e3:8.1f}us ({row['skinny_gbps']:6.0f} GB/s) {best[1]}"
                  f"  err {err:.2e}/{err_cublas:.2e}", flush=True)
        del w
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
