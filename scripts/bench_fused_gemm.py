"""Experiment (session 14, H200): why the skinny GEMM with a fused RMSNorm prologue was 2-3x
slower than the unfused path (norm kernel + cuBLAS) at start-up, and which formulation of
the prologue keeps the weight stream at full speed.

Session 14's first measurement (`device_s14_b.sh`): qkv with the norm fused took 51 us at
1 row and 58 us at 64 rows, against 19-20 us for rms_norm + cuBLAS; the gated gate_up
(norm + SiLU) 120 / 139 us against 65 / 70. The variants (MODE):
  0  no norm at all (the plain kernel: the bandwidth to match)
  1  x * g into the dot, each row's sum of squares reduced every K step (the first try)
  2  x * g into the dot, squares accumulated elementwise, reduced once after the loop
  3  as 2 without the multiply by g (x straight into the dot: g folded into W)
  4  a first pass over x for the sums of squares, then x * g into the dot
  5  as 4 without the multiply by g
  6  as 3, but the squares come from a second load of the x tile (another eviction policy,
     so it is not merged with the dot's): no load feeds both a dot and elementwise code.
     Session 14 found mode 3 near the plain kernel at 64 rows (gate_up 61.4 us against the
     unfused chain's 68.9) but computing wrong results at some tilings; prepared for the
     next session, not yet measured.
Numbers: us a call, timed as the skinny chooser times (CUDA graph, L2 evicted).

Usage: python scripts/bench_fused_gemm.py --out fused.json
       TRITON_INTERPRET=1 python scripts/bench_fused_gemm.py --check   (CPU self-check)
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
SHAPES = {"qkv": (6144, 4096, False), "gate_up": (2 * 14336, 4096, True)}
CONFIGS = {1: ((16, 32, 256, 4, 4), (16, 16, 256, 4, 4), (16, 32, 128, 4, 4)),
           64: ((64, 32, 128, 4, 4), (64, 64, 128, 4, 4), (64, 16, 128, 4, 4))}


@triton.jit
def _kernel(X, W, G, Out, M, N, K, eps, stride_xm, stride_wn, stride_om,
            MODE: tl.constexpr, GATED: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    x_ptrs = X + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    up_ptrs = w_ptrs + N.to(tl.int64) * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    sq = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    if MODE == 4 or MODE == 5:
        p = x_ptrs
        for _k0 in range(0, K, BLOCK_K):
            xf = tl.load(p, mask=m_ok[:, None], other=0.0).to(tl.float32)
            sq += xf * xf
            p += BLOCK_K
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        if MODE == 1:
            xf = x.to(tl.float32)
            sumsq += tl.sum(xf * xf, axis=1)
        if MODE == 2 or MODE == 3:
            xf = x.to(tl.float32)
            sq += xf * xf
        if MODE == 6:
            xf = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0, eviction_policy="evict_last").to(tl.float32)
            sq += xf * xf
        if MODE == 1 or MODE == 2 or MODE == 4:
            g = tl.load(G + k0 + offs_k).to(tl.float32)
            x = (x.to(tl.float32) * g[None, :]).to(W.dtype.element_ty)
        acc = tl.dot(x, tl.trans(w), acc)
        if GATED:
            u = tl.load(up_ptrs, mask=n_ok[:, None], other=0.0)
            acc_up = tl.dot(x, tl.trans(u), acc_up)
            up_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if MODE >= 1:
        if MODE >= 2:
            sumsq = tl.sum(sq, axis=1)
        scale = tl.rsqrt(sumsq / K + eps)
        acc = acc * scale[:, None]
        acc_up = acc_up * scale[:, None]
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    out_ptrs = Out + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def run(mode, gated, cfg, x, w, g, out):
    bm, bn, bk, warps, stages = cfg
    n = w.shape[0] // 2 if gated else w.shape[0]
    _kernel[(triton.cdiv(n, bn),)](
        x, w, g, out, x.shape[0], n, x.shape[1], 1e-5, x.stride(0), w.stride(0), out.stride(0),
        MODE=mode, GATED=gated, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=1 if _INTERPRET else warps, num_stages=1 if _INTERPRET else stages)
    return out


def reference(mode, gated, x, w, g):
    xf = x.float()
    if mode in (1, 2, 4):
        xf = xf * g.float()
    y = F.linear(xf, w.float())
    if mode:
        y = y * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    if gated:
        a, b = y.chunk(2, dim=-1)
        y = F.silu(a) * b
    return y


def check() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    for mode, gated in itertools.product(range(7), (False, True)):
        x = (3 * torch.randn(5, 128, generator=gen)).to(device, torch.float16)
        w = (torch.randn(64, 128, generator=gen) / 128**0.5).to(device, torch.float16)
        g = (0.5 + torch.rand(128, generator=gen)).to(device, torch.float16)
        out = torch.empty(5, 32 if gated else 64, dtype=x.dtype, device=device)
        got = run(mode, gated, (16, 16, 32, 4, 2), x, w, g, out)
        torch.testing.assert_close(got.float(), reference(mode, gated, x, w, g), atol=3e-2, rtol=3e-2)
    print("check passed")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="the self-check only")
    ap.add_argument("--out", default="fused.json")
    ap.add_argument("--modes", type=int, nargs="+", default=list(range(7)))
    a = ap.parse_args()
    check()
    if a.check:
        return
    from gearshift.kernels.activation import silu_and_mul
    from gearshift.kernels.norm import rms_norm
    from gearshift.kernels.skinny_select import graph_ms, kernel_ms

    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = graph_ms(lambda: None, flush)
    rows = []
    for m, (name, (n, k, gated)) in itertools.product((1, 64), SHAPES.items()):
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        g = torch.ones(k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n // 2 if gated else n, device="cuda", dtype=torch.bfloat16)

        def unfused(x=x, w=w, g=g, gated=gated):
            y = F.linear(rms_norm(x, g, 1e-5), w)
            return silu_and_mul(y) if gated else y

        ms = {"cublas": kernel_ms(lambda x=x, w=w: F.linear(x, w), flush, evict_ms),
              "unfused": kernel_ms(unfused, flush, evict_ms)}
        for mode, cfg in itertools.product(a.modes, CONFIGS[m]):
            label = f"mode{mode}_m{cfg[0]}_n{cfg[1]}_k{cfg[2]}_w{cfg[3]}_s{cfg[4]}"
            try:
                run(mode, gated, cfg, x, w, g, out)
            except triton.runtime.errors.OutOfResources:
                continue
            err = (out.float() - reference(mode, gated, x, w, g)).abs().max().item()
            ms[label] = kernel_ms(lambda mode=mode, cfg=cfg, x=x, w=w, g=g, out=out, gated=gated:
                                  run(mode, gated, cfg, x, w, g, out), flush, evict_ms)
            print(f"{name:8s} m={m:3d} {label:34s} {ms[label] * 1e3:7.1f} us  err {err:.1e}", flush=True)
        print(f"{name:8s} m={m:3d} cublas {ms['cublas'] * 1e3:.1f} us, unfused chain "
              f"{ms['unfused'] * 1e3:.1f} us", flush=True)
        rows.append({"shape": name, "rows": m, "n": n, "k": k, "gated": gated, "ms": ms})
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
