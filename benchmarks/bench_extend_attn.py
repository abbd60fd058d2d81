"""Kernel micro-benchmark: the extend (prefill) attention kernel (gearshift/kernels/extend.py)
on the Llama-3.1-8B head shape (32 query heads, 8 KV heads, head_dim 128, bf16), on one GPU:
tile configs against the engine's pick (extend_config of the case's step class, normal or
decode-heavy), timed as the skinny-GEMM chooser times (CUDA graph, L2 evicted before each
call). "default" in the output is the engine's pick for the case.

Cases (requests as (prefix, new tokens); an EXTEND graph pads the rows to max_num_seqs + 1
with empty requests, as the `_graph` cases do):
- `mixed`: a mixed step of the offline run at a 256-token step budget: 60 decoders at
  512-768 context ride along with one 196-token prefill chunk at prefix 316.
- `prefill`: 4 fresh 512-token prompts in one 2,048-token step.
- `mixed_graph`: `mixed` in the 256-token graph's 65 rows.
- `mixed512_graph`: 60 decoders with a 452-token chunk at prefix 60 (budget 512), 65 rows.
- `chunk256_graph`: one lone 256-token chunk at prefix 256 in the 256-token graph.
- `dec60_graph`, `chunk452_graph`: `mixed512_graph`'s two parts alone.
The mixed and chunk cases sit either side of the decode-heavy threshold
(extend.DECODE_HEAVY_MEAN). Configs: each class's tiles with the decoder path (1-token
requests as one tile of the group's heads) off and on, then a grid of other tiles.

Usage: python benchmarks/bench_extend_attn.py --out extend_attn.json [--classes-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import random

import torch
from triton.runtime.errors import OutOfResources

from gearshift.kernels.extend import (
    ExtendConfig,
    extend_attention,
    extend_config,
    is_decode_heavy,
)
from gearshift.kernels.skinny_select import graph_ms, kernel_ms

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
DECODERS = [(random.Random(0).randint(512, 768) - 1, 1) for _ in range(60)]
EMPTY = (0, 0)
CASES = {
    "mixed": DECODERS + [(316, 196)],
    "prefill": [(0, 512)] * 4,
    "mixed_graph": DECODERS + [(316, 196)] + [EMPTY] * 4,
    "mixed512_graph": DECODERS + [(60, 452)] + [EMPTY] * 4,
    "chunk256_graph": [(256, 256)] + [EMPTY] * 64,
    # mixed512_graph's two parts alone (does the launch overlap them?)
    "dec60_graph": DECODERS + [EMPTY] * 5,
    "chunk452_graph": [(60, 452)] + [EMPTY] * 64,
}


def batch(requests: list[tuple[int, int]], g: torch.Generator) -> dict:
    """(prefix, extend) per request -> the kernel's tensors over a shuffled slot pool."""
    seq = [p + n for p, n in requests]
    slots = sum(seq)
    perm = (torch.randperm(slots, device="cuda", generator=g) + 1).to(torch.int32)
    req_to_token = torch.zeros(len(requests) + 1, max(seq), dtype=torch.int32, device="cuda")
    start = 0
    for i, n in enumerate(seq):
        req_to_token[i + 1, :n] = perm[start:start + n]
        start += n
    ext = [n for _, n in requests]

    def ints(xs):
        return torch.tensor(xs, dtype=torch.int32, device="cuda")

    return dict(
        k=torch.randn(slots + 1, KV_HEADS, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16),
        v=torch.randn(slots + 1, KV_HEADS, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16),
        q=torch.randn(sum(ext), HEADS, HEAD_DIM, device="cuda", generator=g).to(torch.bfloat16),
        req_to_token=req_to_token, rows=torch.arange(1, len(requests) + 1, device="cuda"),
        seq_lens=ints(seq), extend_lens=ints(ext),
        starts=ints([sum(ext[:i]) for i in range(len(ext))]), max_extend_len=max(ext),
        kv_gbytes=2 * slots * KV_HEADS * HEAD_DIM * 2 / 1e9)


def run(b: dict, out: torch.Tensor, config: ExtendConfig | None) -> torch.Tensor:
    return extend_attention(b["q"], b["k"], b["v"], b["req_to_token"], b["rows"], b["seq_lens"],
                            b["extend_lens"], b["starts"], HEAD_DIM**-0.5, out,
                            max_extend_len=b["max_extend_len"], config=config)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="extend_attn.json")
    ap.add_argument("--cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--classes-only", action="store_true",
                    help="time the two step classes' configs (decoder path off / on) only")
    a = ap.parse_args()
    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = graph_ms(lambda: None, flush)
    classes = [extend_config(torch.bfloat16, HEADS, KV_HEADS, HEAD_DIM, 9, heavy)
               for heavy in (False, True)]
    # the decoder path (1-token requests as DEC_M-row tiles) off and on at the two
    # classes' tiles, its key block 64 / 128, then other tiles with it on
    configs = ([dataclasses.replace(c, decode_rows=False) for c in classes]
               + [dataclasses.replace(c, decode_rows=True, dec_block_n=bn)
                  for c in classes for bn in (64, 128)]
               + [ExtendConfig(rows // 4, 4, bn, w, s, 128, True, dbn) for rows, bn, w, s, dbn in
                  itertools.product((32, 64, 128), (64, 128), (4, 8), (2, 3), (64, 128))
                  if not a.classes_only])
    result = {"device": torch.cuda.get_device_name(),
              "classes": [list(vars(c).values()) for c in classes], "cases": {}}
    for name, requests in CASES.items():
        if a.cases and name not in a.cases:
            continue
        b = batch(requests, torch.Generator(device="cuda").manual_seed(len(requests)))
        default = classes[is_decode_heavy(sum(n for _, n in requests), len(requests))]
        ref = run(b, torch.empty_like(b["q"]), default)
        rows = []
        for cfg in dict.fromkeys(configs):  # the default once
            out = torch.empty_like(b["q"])
            try:
                run(b, out, cfg)
            except OutOfResources:
                rows.append({"config": list(vars(cfg).values()), "error": "OutOfResources"})
                continue
            ms = kernel_ms(lambda b=b, cfg=cfg, out=out: run(b, out, cfg), flush, evict_ms)
            rows.append({"config": list(vars(cfg).values()), "us": ms * 1e3,
                         "kv_gbps": b["kv_gbytes"] / ms * 1e3, "default": cfg == default,
                         "max_err": (out.float() - ref.float()).abs().max().item()})
        result["cases"][name] = rows
        d = next(r for r in rows if r.get("default"))
        print(f"{name}: default {d['us']:.1f} us ({d['kv_gbps']:.0f} GB/s of K/V); fastest "
              "(block_t, block_g, block_n, warps, stages, scan):")
        for r in rows[:6]:  # the two classes, decoder path off / on (64, 128)
            if "us" in r:
                print(f"   {r['us']:6.1f} us {r['config']} err {r['max_err']:.1e}  (class)")
        for r in sorted((r for r in rows if "us" in r), key=lambda r: r["us"])[:4]:
            print(f"   {r['us']:6.1f} us {r['config']} err {r['max_err']:.1e}")
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
