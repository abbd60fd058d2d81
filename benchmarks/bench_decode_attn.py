"""Kernel micro-benchmark: the split-K decode attention kernel (gearshift/kernels/decode.py)
on the Llama-3.1-8B head shape (32 query heads, 8 KV heads, head_dim 128, bf16), on one GPU.

Each (KV splits, BLOCK_N, warps, stages) is timed against the engine's own pick
(pick_num_kv_splits, decode_blocks) at batch 1 / 1k context and batch 64 / 640 context
(the batch-1 decode and offline-throughput figures of docs/benchmarks.md; `--cases` for
others). Timed as the skinny-GEMM chooser times (in a CUDA graph, L2 evicted by a read
before every call: in a decode step the weights have just streamed through L2). Each
request's K/V slots are a shuffled run of the pool, as after many allocations. Writes
JSON; prints the fastest configs per case with GB/s of K/V read.

Usage: python benchmarks/bench_decode_attn.py --out decode_attn.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
from triton.runtime.errors import OutOfResources

from gearshift.kernels.decode import (
    alloc_decode_workspace,
    decode_attention,
    decode_blocks,
    num_sms,
    pick_num_kv_splits,
)
from gearshift.kernels.skinny_select import graph_ms, kernel_ms

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def case(bs: int, ctx: int, configs, flush: torch.Tensor, evict_ms: float) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(bs * 7 + ctx)
    slots = bs * ctx
    k = torch.randn(slots + 1, KV_HEADS, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(slots + 1, KV_HEADS, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16)
    perm = torch.randperm(slots, device="cuda", generator=g) + 1  # slot 0: the dummy
    req_to_token = torch.zeros(bs + 1, ctx, dtype=torch.int32, device="cuda")
    req_to_token[1:] = perm.view(bs, ctx).to(torch.int32)
    rows = torch.arange(1, bs + 1, device="cuda")
    seq_lens = torch.full((bs,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(bs, HEADS, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16)
    ref = torch.empty_like(q)
    sms = num_sms("cuda")
    default_splits = pick_num_kv_splits(bs, KV_HEADS, sms)
    decode_attention(q, k, v, req_to_token, rows, seq_lens, HEAD_DIM**-0.5, ref,
                     num_kv_splits=default_splits)
    gbytes = 2 * bs * ctx * KV_HEADS * HEAD_DIM * 2 / 1e9
    out = []
    for splits, blocks in configs:
        work = alloc_decode_workspace(bs, HEADS, HEAD_DIM, splits, "cuda")
        o = torch.empty_like(q)

        def fn(splits=splits, blocks=blocks, work=work, o=o):
            decode_attention(q, k, v, req_to_token, rows, seq_lens, HEAD_DIM**-0.5, o,
                             num_kv_splits=splits, workspace=work, blocks=blocks)
        try:
            fn()
        except OutOfResources:  # a tiling this GPU cannot hold: report it
            out.append({"splits": splits, "blocks": list(blocks), "error": "OutOfResources"})
            continue
        ms = kernel_ms(fn, flush, evict_ms)
        out.append({"splits": splits, "blocks": list(blocks), "us": ms * 1e3,
                    "gbps": gbytes / ms * 1e3, "max_err": (o.float() - ref.float()).abs().max().item(),
                    "default": splits == default_splits
                    and blocks == decode_blocks(bs, KV_HEADS, splits, sms)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="decode_attn.json")
    ap.add_argument("--cases", default="1x1024,64x640", help="BSxCONTEXT,...")
    ap.add_argument("--blocks", nargs="*", help="BLOCK_N,WARPS,STAGES ... (default: a grid)")
    a = ap.parse_args()
    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = graph_ms(lambda: None, flush)
    blocks = ([tuple(int(x) for x in b.split(",")) for b in a.blocks] if a.blocks else
              [(bn, w, s) for bn, w, s in itertools.product((32, 64, 128), (4, 8), (2, 3))])
    result = {"device": torch.cuda.get_device_name(), "cases": {}}
    for spec in a.cases.split(","):
        bs, ctx = (int(x) for x in spec.split("x"))
        configs = [(sp, b) for sp in (1, 2, 4, 8, 16, 32) for b in blocks]
        rows = case(bs, ctx, configs, flush, evict_ms)
        result["cases"][spec] = rows
        ok = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
        default = next((r for r in rows if r.get("default") and "us" in r), None)
        print(f"batch {bs}, context {ctx}: " + (
            f"default {default['us']:.1f} us ({default['gbps']:.0f} GB/s), splits "
            f"{default['splits']}, blocks {default['blocks']}" if default
            else "the engine's default config is not in --blocks"))
        for r in ok[:5]:
            print(f"   {r['us']:6.1f} us ({r['gbps']:5.0f} GB/s) splits {r['splits']:2d} "
                  f"blocks {r['blocks']} err {r['max_err']:.1e}")
        for b in blocks:  # us by splits, per block config
            print(f"   blocks {list(b)}: " + " ".join(
                f"{r['splits']}:{r['us']:.1f}" for r in rows if tuple(r["blocks"]) == b and "us" in r))
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
