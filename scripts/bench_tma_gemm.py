"""H200 microbenchmark: does a deeper weight pipeline close the skinny GEMMs' gap to the
bandwidth floor? The 8B layer shapes (qkv, o_proj, gate_up, down) at 1 and 64 rows:
cuBLAS, the engine's skinny kernel (models/kernels/skinny_gemm.py) at its chooser
candidates and at 6 / 8 stages, and a TMA variant of the same tile loop (host tensor
descriptors for x and W, so the loads are bulk copies into shared memory that the
pipeliner can keep many stages deep without registers).

Session 13's graphed profiles put the layer GEMMs 16 us a layer over their floors at batch
1 (qkv 15.4 / 11.7, o_proj 11.1 / 7.8, gate_up 60.1 / 54.6, down 31.2 / 27.3 us at
4.3 TB/s) and 26 us at 64 rows. The chooser's candidates all use 4 stages.

Timed as the chooser times (CUDA graph, L2 evicted by a read before each call). Checks
each variant against an fp32 product. Writes JSON; prints the best of each family.

Usage: python scripts/bench_tma_gemm.py --out tma.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from gearshift.models.kernels import skinny_select as sel
from gearshift.models.kernels.skinny_gemm import SkinnyConfig, skinny_linear

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}


@triton.jit
def _tma_skinny_kernel(x_desc, w_desc, Out, M, N, K, stride_om,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       NUM_STAGES: tl.constexpr):
    off_n = tl.program_id(0) * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        x = x_desc.load([0, k0])  # [BLOCK_M, BLOCK_K], rows past M read as zero
        w = w_desc.load([off_n, k0])  # [BLOCK_N, BLOCK_K]
        acc = tl.dot(x, tl.trans(w), acc)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    tl.store(Out + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _tma_fused_kernel(x_desc, w_desc, R, Out, M, N, K, stride_om, stride_rm, eps,
                      RMS: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      NUM_STAGES: tl.constexpr):
    # RMS 1: each row's sum of squares accumulated elementwise from the x tiles, reduced
    # once; RMS 2: reduced every K step. The norm weight is folded into W, so
    # out = rstd * (x @ W.T) (GATED: silu(rstd * gate) * (rstd * up)).
    # RESIDUAL: out = R + x @ W.T, written into R (the residual stream, in place).
    off_n = tl.program_id(0) * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sq = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        x = x_desc.load([0, k0])
        acc = tl.dot(x, tl.trans(w_desc.load([off_n, k0])), acc)
        if GATED:
            acc_up = tl.dot(x, tl.trans(w_desc.load([N + off_n, k0])), acc_up)
        if RMS == 1:
            xf = x.to(tl.float32)
            sq += xf * xf
        if RMS == 2:
            xf = x.to(tl.float32)
            ss += tl.sum(xf * xf, 1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if RMS == 1:
        ss = tl.sum(sq, 1)
    if RMS != 0:
        rstd = 1.0 / tl.sqrt(ss / K + eps)
        acc = acc * rstd[:, None]
        acc_up = acc_up * rstd[:, None]
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if RESIDUAL:
        r_ptrs = R + offs_m[:, None] * stride_rm + offs_n[None, :]
        acc += tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(r_ptrs, acc.to(R.dtype.element_ty), mask=mask)
    else:
        tl.store(Out + offs_m[:, None] * stride_om + offs_n[None, :],
                 acc.to(Out.dtype.element_ty), mask=mask)


def tma_fused(x, w, cfg, out, *, rms=0, gated=False, residual=None, eps=1e-5):
    m, k = x.shape
    n = w.shape[0] // 2 if gated else w.shape[0]
    r = residual if residual is not None else out
    _tma_fused_kernel[(triton.cdiv(n, cfg.block_n),)](
        TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k]),
        TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k]),
        r, out, m, n, k, out.stride(0), r.stride(0), eps,
        RMS=rms, GATED=gated, RESIDUAL=residual is not None,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)
    return out


FUSED_CASES = {  # shape -> (gated, fusion): the chooser's TMA picks of call D
    "qkv": (False, "rms"), "gate_up": (True, "rms"), "o_proj": (False, "residual"),
    "down": (False, "residual")}
FUSED_CONFIGS = {16: [SkinnyConfig(16, 128, 128, 4, 4, True), SkinnyConfig(16, 128, 256, 4, 4, True),
                     SkinnyConfig(16, 64, 256, 4, 6, True), SkinnyConfig(16, 32, 256, 4, 6, True)],
                 64: [SkinnyConfig(64, 64, 128, 4, 6, True), SkinnyConfig(64, 32, 256, 4, 4, True),
                      SkinnyConfig(64, 64, 128, 4, 4, True)]}


def fused_bench(rows, flush, evict_ms) -> list[dict]:
    """Each layer GEMM at TMA tilings, plain and with its fusion (rms: the norm before it,
    its weight folded into W; residual: the add after it, into the residual stream), and
    the unfused chain (norm kernel or add) for reference."""
    from gearshift.models.kernels.norm import fused_add_rms_norm

    res = []
    for name, (gated, fusion) in FUSED_CASES.items():
        n, k = SHAPES[name]
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        g = (1 + 0.1 * torch.randn(k, device="cuda")).to(torch.bfloat16)
        wg = (w.float() * g.float()[None, :]).to(torch.bfloat16)  # norm weight folded in
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            r0 = torch.randn(m, n // 2 if gated else n, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n // 2 if gated else n, device="cuda", dtype=torch.bfloat16)
            h = F.rms_norm(x.float(), (k,), g.float(), 1e-5) if fusion == "rms" else x.float()
            ref = F.linear(h, w.float())
            if gated:
                ref = F.silu(ref[:, :n // 2]) * ref[:, n // 2:]
            if fusion == "residual":
                ref = ref + r0.float()
            # what the fusions remove: the add + RMSNorm kernel between the two GEMMs
            hid = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            res_in, g4 = hid.clone(), torch.ones(4096, device="cuda", dtype=torch.bfloat16)
            chain_us = sel.kernel_ms(lambda h=hid, r=res_in, g=g4: fused_add_rms_norm(h, r, g, 1e-5),
                                     flush, evict_ms) * 1e3
            for cfg in FUSED_CONFIGS[sel.row_block(m)]:
                variants = {"plain": dict(gated=gated)}
                if fusion == "rms":
                    variants.update({"rms1": dict(gated=gated, rms=1), "rms2": dict(gated=gated, rms=2)})
                else:
                    variants["residual"] = dict(gated=gated)
                for vname, kw in variants.items():
                    wt = wg if vname.startswith("rms") else w
                    r = r0.clone() if vname == "residual" else None
                    fn = (lambda x=x, wt=wt, cfg=cfg, out=out, kw=kw, r=r:
                          tma_fused(x, wt, cfg, out, residual=r, **kw))
                    try:
                        fn()
                        torch.cuda.synchronize()
                        got = (r if r is not None else out).float()
                        if vname == "residual":
                            err = (got - ref).abs().max().item()
                        elif vname == "plain":
                            err = float("nan")
                        else:
                            err = (got - ref).abs().max().item()
                        us = sel.kernel_ms(fn, flush, evict_ms) * 1e3
                    except (OutOfResources, RuntimeError) as e:
                        res.append({"shape": name, "rows": m, "config": sel._name(cfg),
                                    "variant": vname, "error": str(e)[:200]})
                        continue
                    res.append({"shape": name, "rows": m, "config": sel._name(cfg), "variant": vname,
                                "us": us, "err": err, "chain_extra_us": chain_us})
                    print(f"{name:8s} m={m:3d} {sel._name(cfg):34s} {vname:8s} {us:6.1f} us  "
                          f"err {err:.1e}  (add + norm kernel {chain_us:.1f} us)", flush=True)
    return res


def tma_linear(x: torch.Tensor, w: torch.Tensor, cfg: SkinnyConfig,
               out: torch.Tensor | None = None) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k])
    _tma_skinny_kernel[(triton.cdiv(n, cfg.block_n),)](
        x_desc, w_desc, out, m, n, k, out.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)
    return out


def configs(rows: int) -> dict[str, list[SkinnyConfig]]:
    bm = sel.row_block(rows)
    chooser = list(sel.CANDIDATES[bm])
    deep = [SkinnyConfig(bm, c.block_n, c.block_k, c.num_warps, s)
            for c in chooser for s in (6, 8)]
    bns = (16, 32, 64, 128) if bm <= 16 else (32, 64, 128)
    tma = [SkinnyConfig(bm, bn, bk, 4, s)
           for bn, bk, s in itertools.product(bns, (128, 256), (4, 6, 8))]
    return {"chooser": chooser, "deep": deep, "tma": tma}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tma.json")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--fused", action="store_true", help="only the fusion comparison")
    a = ap.parse_args()
    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = sel.graph_ms(lambda: None, flush)
    if a.fused:
        with open(a.out, "w") as f:
            json.dump(fused_bench(a.rows, flush, evict_ms), f, indent=1)
        return
    results = []
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        gb = n * k * 2 / 1e9
        for m in a.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), w.float())
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            cublas_us = sel.kernel_ms(lambda x=x, w=w: F.linear(x, w), flush, evict_ms) * 1e3
            best = {}
            for family, cfgs in configs(m).items():
                for cfg in cfgs:
                    args = dict(cfg=cfg, x=x, w=w, out=out)
                    fn = ((lambda a=args: tma_linear(a["x"], a["w"], a["cfg"], a["out"]))
                          if family == "tma" else
                          (lambda a=args: skinny_linear(a["x"], a["w"], config=a["cfg"], out=a["out"])))
                    try:
                        fn()
                        torch.cuda.synchronize()
                        err = (out.float() - ref).abs().max().item()
                        us = sel.kernel_ms(fn, flush, evict_ms) * 1e3
                    except (OutOfResources, RuntimeError) as e:  # tiling does not fit
                        results.append({"shape": name, "rows": m, "family": family,
                                        "config": sel._name(cfg), "error": str(e)[:200]})
                        continue
                    results.append({"shape": name, "rows": m, "family": family,
                                    "config": sel._name(cfg), "us": us, "err": err,
                                    "tbps": gb / us * 1e3})
                    if family not in best or us < best[family][0]:
                        best[family] = (us, sel._name(cfg), err)
            results.append({"shape": name, "rows": m, "family": "cublas", "us": cublas_us,
                            "tbps": gb / cublas_us * 1e3})
            line = "  ".join(f"{f} {u:6.1f} ({c}, err {e:.1e})" for f, (u, c, e) in best.items())
            print(f"{name:8s} m={m:3d} floor {gb / 4.3 * 1e3:6.1f} us  cublas {cublas_us:6.1f}  "
                  f"{line}", flush=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
