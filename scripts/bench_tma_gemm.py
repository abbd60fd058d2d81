"""H200 microbenchmark: does a deeper weight pipeline close the skinny GEMMs' gap to the
bandwidth floor? The 8B layer shapes (qkv, o_proj, gate_up, down) at 1 and 64 rows:
cuBLAS, the engine's skinny kernel (models/kernels/skinny_gemm.py) at its chooser
candidates and at 6 / 8 stages, and a TMA variant of the same tile loop (host tensor
descriptors for x and W, so the loads are bulk copies into shared memory that the
pipeliner can keep many stages deep without registers). Since session 15 the engine's
kernel has the TMA tilings (SkinnyConfig.tma) and this script times that kernel;
`--fused` times its `rms` / `accumulate` forms (call F also measured an rms variant that
reduced the squares every K step, dropped: slower at 64 rows).

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
from triton.runtime.errors import OutOfResources

from gearshift.kernels import skinny_select as sel
from gearshift.kernels.skinny_gemm import SkinnyConfig, skinny_linear

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}


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
    from gearshift.kernels.norm import fused_add_rms_norm

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
            ones = torch.ones(k, device="cuda", dtype=torch.bfloat16)
            for cfg in FUSED_CONFIGS[sel.row_block(m)]:
                variants = {"plain": dict(gated=gated)}
                if fusion == "rms":
                    variants["rms"] = dict(gated=gated, rms=(ones, 1e-5))
                else:
                    variants["residual"] = dict(gated=gated, accumulate=True)
                for vname, kw in variants.items():
                    wt = wg if vname == "rms" else w
                    dest = r0.clone() if vname == "residual" else out
                    fn = (lambda x=x, wt=wt, cfg=cfg, dest=dest, kw=kw:
                          skinny_linear(x, wt, config=cfg, out=dest, **kw))
                    try:
                        fn()
                        torch.cuda.synchronize()
                        err = float("nan") if vname == "plain" else (dest.float() - ref).abs().max().item()
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


def configs(rows: int) -> dict[str, list[SkinnyConfig]]:
    bm = sel.row_block(rows)
    chooser = list(sel.CANDIDATES[bm])
    deep = [SkinnyConfig(bm, c.block_n, c.block_k, c.num_warps, s)
            for c in chooser for s in (6, 8)]
    bns = (16, 32, 64, 128) if bm <= 16 else (32, 64, 128)
    tma = [SkinnyConfig(bm, bn, bk, 4, s, tma=True)
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
                    fn = (lambda x=x, w=w, cfg=cfg, out=out: skinny_linear(x, w, config=cfg, out=out))
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
