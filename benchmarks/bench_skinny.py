"""Kernel micro-benchmark: the skinny GEMM (gearshift/kernels/skinny_gemm.py) against its
cuBLAS / cuBLASLt form on the Llama-3.1-8B layer shapes (qkv, o_proj, gate_up, down,
lm_head) at 1..64 rows, bf16, on one GPU.

Each product is timed by the engine's own chooser (kernels/skinny_select.py: inside a CUDA
graph, L2 evicted by a read before every call), so a row here is what the engine would
pick at start-up on this GPU, with every candidate's time beside it. `--fused` times each
shape in the kind the fused decoder layer runs (qkv: RMSNorm inside, o_proj / down: the
residual add in the epilogue, gate_up: RMSNorm + SiLU-and-mul); `--wide` adds a grid of
wider tilings to the engine's candidates. Each kernel result is checked against an fp32
product. Writes JSON; prints a table with GB/s of weights streamed.

Usage: python benchmarks/bench_skinny.py --out skinny.json [--fused] [--wide]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from gearshift.kernels import skinny_select as sel
from gearshift.kernels.skinny_gemm import SkinnyConfig, skinny_linear

# name: (N, K, the kind the fused decoder layer runs it as)
SHAPES = {"qkv": (6144, 4096, "rms"), "o_proj": (4096, 4096, "acc"),
          "gate_up": (28672, 4096, "gated_rms"), "down": (4096, 14336, "acc"),
          "lm_head": (128256, 4096, "plain")}
EPS = 1e-6  # the chooser's rms products use a unit norm weight and this eps


def wide_candidates() -> dict[int, list[SkinnyConfig]]:
    """Wider tilings than the engine's: every program re-reads the whole x tile, so wider
    column blocks cut that traffic at 32-64 rows. Tilings that do not fit the GPU's shared
    memory are timed as inf by the chooser."""
    tma = [(bn, bk, s) for bn in (32, 64, 128) for bk in (128, 256) for s in (4, 6)]
    return {
        16: [SkinnyConfig(16, bn, bk, w, s) for bn in (16, 32) for bk in (128, 256, 512)
             for w, s in ((4, 3), (4, 4), (8, 4))]
        + [SkinnyConfig(16, bn, bk, 4, s, tma=True) for bn, bk, s in tma],
        32: [SkinnyConfig(32, bn, bk, w, s) for bn in (32, 64, 128) for bk in (128, 256)
             for w, s in ((4, 4), (8, 4))]
        + [SkinnyConfig(32, bn, bk, 4, s, tma=True) for bn, bk, s in tma],
        64: [SkinnyConfig(64, bn, bk, w, s) for bn in (32, 64, 128) for bk in (64, 128, 256)
             for w, s in ((4, 4), (8, 3), (8, 4))]
        + [SkinnyConfig(64, bn, bk, 4, s, tma=True) for bn, bk, s in tma],
    }


def reference(kind: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The product of `kind` in fp32 (acc: into a zero output, so the plain product)."""
    xf = x.float()
    if kind in ("rms", "gated_rms"):
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    h = F.linear(xf, w.float())
    if kind in ("gated", "gated_rms"):
        gate, up = h.chunk(2, dim=-1)
        h = F.silu(gate) * up
    return h


def run_kernel(kind: str, x: torch.Tensor, w: torch.Tensor, cfg: SkinnyConfig) -> torch.Tensor:
    """The skinny kernel's product of `kind` (acc: into a zero output)."""
    gated = kind in ("gated", "gated_rms")
    rms = (torch.ones(x.shape[1], dtype=x.dtype, device=x.device), EPS) if "rms" in kind else None
    if kind == "acc":
        out = torch.zeros(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
        return skinny_linear(x, w, config=cfg, out=out, accumulate=True)
    return skinny_linear(x, w, config=cfg, gated=gated, rms=rms)


def name_of(choice: SkinnyConfig | str | None) -> str:
    return sel._name(choice) if isinstance(choice, SkinnyConfig) else choice or "cublas"


def measure(chooser: sel.SkinnyChooser, name: str, kind: str, w: torch.Tensor, m: int) -> dict:
    """One (shape, kind, rows) through the chooser: its pick and every candidate's time."""
    n, k = w.shape
    x = torch.randn(m, k, device=w.device, dtype=w.dtype)
    choice = chooser.choose(x, w, None, kind)
    ms = chooser.timings[(sel.row_bucket(m), n, k, w.dtype, False, kind)]
    blas = {c: ms[c] for c in ("cublas", sel.CUBLASLT) if c in ms}
    kernels = {c: t for c, t in ms.items() if c not in blas and t != float("inf")}
    out_n = n // 2 if kind in ("gated", "gated_rms") else n
    gb = n * k * w.element_size() / 1e9
    row = {"shape": name, "kind": kind, "n": out_n, "k": k, "rows": m, "chosen": name_of(choice),
           "blas_ms": blas, "all_ms": ms}
    if kernels:
        best = min(kernels, key=kernels.get)
        cfg = next(c for c in sel.candidates(m, x.device, kind) if sel._name(c) == best)
        ref = reference(kind, x, w)
        row.update(best_skinny=best, best_skinny_ms=kernels[best],
                   skinny_gbps=gb / kernels[best] * 1e3,
                   max_err_skinny=(run_kernel(kind, x, w, cfg).float() - ref).abs().max().item())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="skinny.json")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--fused", action="store_true",
                    help="time each shape in the fused decoder layer's kind (default: plain)")
    ap.add_argument("--wide", action="store_true", help="add wider tilings to the candidates")
    a = ap.parse_args()
    if max(a.rows) > sel.MAX_ROWS:
        ap.error(f"--rows: the chooser times products of at most {sel.MAX_ROWS} rows")
    if a.wide:
        for rows, configs in wide_candidates().items():
            sel.CANDIDATES[rows] = tuple(dict.fromkeys(sel.CANDIDATES[rows] + tuple(configs)))
    chooser = sel.SkinnyChooser("auto")
    rows_out = []
    for name in a.shapes:
        n, k, fused_kind = SHAPES[name]
        kind = fused_kind if a.fused else "plain"
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        for m in a.rows:
            row = measure(chooser, name, kind, w, m)
            rows_out.append(row)
            blas = "  ".join(f"{c} {t * 1e3:7.1f}us" for c, t in row["blas_ms"].items())
            kernel = (f"skinny {row['best_skinny_ms'] * 1e3:7.1f}us ({row['skinny_gbps']:5.0f} GB/s) "
                      f"{row['best_skinny']} err {row['max_err_skinny']:.1e}"
                      if "best_skinny" in row else "no kernel tiling fits")
            print(f"{name:8s} {kind:9s} m={m:3d}  {blas}  {kernel}  -> {row['chosen']}", flush=True)
        del w
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
