"""The extend kernel's decoder path (1-token requests riding in a mixed step): its key block
and its loops' pipeline depth (ExtendConfig.dec_block_n / dec_stages), with what each
compiled variant takes of an SM (registers, shared memory: programs an SM).

Session 19 (scripts/bench_extend_attn.py): 60 decoders alone read their K/V at 2.9 TB/s
inside the extend launch (52 us a layer), the decode kernel at ~4; a 512-token mixed step's
launch took 65 us. Same cases and timing as bench_extend_attn.py (CUDA graph, L2 evicted).

Usage: python scripts/bench_extend_decoders.py --out extend_decoders.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_extend_attn import CASES, HEAD_DIM, HEADS, KV_HEADS, batch, run  # noqa: E402

from gearshift.attention.kernels import extend as ext  # noqa: E402
from gearshift.models.kernels.skinny_select import graph_ms, kernel_ms  # noqa: E402

SMEM_PER_SM = 228 * 1024  # H100 / H200: 228 KB an SM, 227 KB usable by one program


def compiled_kernels(fn) -> list:
    """Every compiled variant of a Triton JIT function (Triton 3.x's device caches)."""
    found = []
    for entry in getattr(fn, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        found.extend(cache.values())
    return found


def occupancy(k) -> dict:
    warps = k.metadata.num_warps
    shared = k.metadata.shared
    by_regs = 65536 // max(k.n_regs * 32 * warps, 1)
    by_smem = SMEM_PER_SM // max(shared + 1024, 1)  # 1 KB reserved a program
    return {"regs": k.n_regs, "spills": k.n_spills, "shared": shared, "warps": warps,
            "programs_per_sm": min(by_regs, by_smem, 64 // warps, 32)}


DECODE_CASES = {"batch64_ctx640": [(639, 1)] * 64,
                "riders60": [(p, 1) for p, _ in CASES["dec60_graph"] if p > 0]}
# (BLOCK_N, warps, stages, prefetch): the engine's one-split config first
DECODE_CONFIGS = [(64, 2, 2, False), (32, 2, 1, True), (32, 4, 1, True), (64, 4, 1, True)]


def decode_bench(flush, evict_ms, kernels: dict) -> dict:
    """The decode kernel (RoPE + K/V store inside, one split) at batch 64 and on the 60
    riders, its key loop prefetched by hand or not."""
    from gearshift.attention.kernels import decode as dec

    out = {}
    for name, requests in DECODE_CASES.items():
        d = batch(requests, torch.Generator(device="cuda").manual_seed(1))
        bs = len(requests)
        g = torch.Generator(device="cuda").manual_seed(2)
        k_new = torch.randn(bs, KV_HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
        cos = torch.rand(2048, HEAD_DIM // 2, device="cuda", generator=g)
        rope = dec.RopeInputs(k_new, torch.randn_like(k_new), d["seq_lens"].long() - 1, cos,
                              torch.rand_like(cos), d["req_to_token"][d["rows"], d["seq_lens"].long() - 1])
        ref = None
        rows = []
        for bn, warps, stages, pf in DECODE_CONFIGS:
            o = torch.empty_like(d["q"])

            def call(o=o, bn=bn, warps=warps, stages=stages, pf=pf, d=d, rope=rope):
                dec.decode_attention(d["q"], d["k"], d["v"], d["req_to_token"], d["rows"],
                                     d["seq_lens"], HEAD_DIM**-0.5, o, num_kv_splits=1,
                                     blocks=(bn, warps, stages), rope=rope, prefetch=pf)
            before = set(map(id, compiled_kernels(dec._decode_split_kernel)))
            call()
            for k in compiled_kernels(dec._decode_split_kernel):
                if id(k) not in before:
                    kernels[f"decode {bn}x{warps} stages {stages} prefetch {pf}"] = occupancy(k)
            ref = o if ref is None else ref
            us = kernel_ms(call, flush, evict_ms) * 1e3
            rows.append({"blocks": [bn, warps, stages], "prefetch": pf, "us": us,
                         "kv_gbps": d["kv_gbytes"] / us * 1e6,
                         "max_err": (o.float() - ref.float()).abs().max().item()})
            print(f"decode {name} {bn}x{warps} stages {stages} prefetch {pf:d}: {us:6.1f} us "
                  f"{rows[-1]['kv_gbps']:5.0f} GB/s err {rows[-1]['max_err']:.1e}")
        out[name] = rows
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="extend_decoders.json")
    ap.add_argument("--cases", nargs="*", default=["mixed512_graph", "dec60_graph",
                                                    "chunk452_graph", "prefill"])
    a = ap.parse_args()
    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = graph_ms(lambda: None, flush)
    base = ext.extend_config(torch.bfloat16, HEADS, KV_HEADS, HEAD_DIM, 9, False)
    # session 20: the decoder path's loads issued by hand a block ahead (dec_prefetch)
    configs = [base] + [dataclasses.replace(base, dec_block_n=bn, dec_prefetch=True)
                        for bn in (32, 64)]
    result = {"device": torch.cuda.get_device_name(), "cases": {}, "kernels": {}}
    for name in a.cases:
        b = batch(CASES[name], torch.Generator(device="cuda").manual_seed(len(CASES[name])))
        ref = run(b, torch.empty_like(b["q"]), base)
        rows = []
        for cfg in configs:
            out = torch.empty_like(b["q"])
            before = set(map(id, compiled_kernels(ext._extend_kernel)))
            try:
                run(b, out, cfg)
            except OutOfResources as e:
                rows.append({"config": dataclasses.asdict(cfg), "error": str(e)[:200]})
                continue
            new = [k for k in compiled_kernels(ext._extend_kernel) if id(k) not in before]
            for k in new:
                result["kernels"][str(dataclasses.astuple(cfg))] = occupancy(k)
            ms = kernel_ms(lambda b=b, cfg=cfg, out=out: run(b, out, cfg), flush, evict_ms)
            rows.append({"config": dataclasses.asdict(cfg), "us": ms * 1e3,
                         "kv_gbps": b["kv_gbytes"] / ms * 1e3,
                         "max_err": (out.float() - ref.float()).abs().max().item()})
        result["cases"][name] = rows
        print(f"{name}:")
        for r in rows:
            c = r["config"]
            tag = f"dec_block_n {c['dec_block_n']:3d} dec_prefetch {c['dec_prefetch']:d}"
            print(f"   {tag}: " + (f"{r['us']:6.1f} us  {r['kv_gbps']:5.0f} GB/s  err {r['max_err']:.1e}"
                                   if "us" in r else r["error"][:80]))
    result["decode"] = decode_bench(flush, evict_ms, result["kernels"])
    print("compiled variants (regs, spills, shared bytes, warps, programs an SM):")
    for key, occ in result["kernels"].items():
        print("  ", key, occ)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
