"""The decode kernel (RoPE + K/V store inside, one split: large batches) with each block's
slots read one iteration ahead (decode_attention's slots_ahead: Triton then double-buffers
the K/V gathers) against today's loop, at batch 64 / 640 context and on 60 riders at
512-768 context. Timed as the skinny chooser times (CUDA graph, L2 evicted).

Why (session 20): in the sm90 TTGIR of today's loop the gathers go to one shared buffer,
issued after the block's dots and waited for at the top of the next iteration, because
their addresses come from a load of the same iteration.

Usage: python scripts/bench_decode_ahead.py --out decode_ahead.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_extend_attn import DECODERS, HEAD_DIM, KV_HEADS, batch  # noqa: E402

from gearshift.attention.kernels import decode as dec  # noqa: E402
from gearshift.models.kernels.skinny_select import graph_ms, kernel_ms  # noqa: E402

CASES = {"batch64_ctx640": [(639, 1)] * 64, "riders60": DECODERS}
# (BLOCK_N, warps, stages, slots_ahead): the engine's one-split config first
CONFIGS = [(64, 2, 2, False), (32, 2, 3, True), (32, 2, 4, True), (64, 2, 3, True),
           (64, 4, 3, True), (32, 4, 3, True)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="decode_ahead.json")
    a = ap.parse_args()
    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = graph_ms(lambda: None, flush)
    result = {"device": torch.cuda.get_device_name(), "cases": {}}
    for name, requests in CASES.items():
        d = batch(requests, torch.Generator(device="cuda").manual_seed(1))
        bs = len(requests)
        g = torch.Generator(device="cuda").manual_seed(2)
        k_new = torch.randn(bs, KV_HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
        cos = torch.rand(2048, HEAD_DIM // 2, device="cuda", generator=g)
        pos = d["seq_lens"].long() - 1
        rope = dec.RopeInputs(k_new, torch.randn_like(k_new), pos, cos, torch.rand_like(cos),
                              d["req_to_token"][d["rows"], pos])
        ref, rows = None, []
        for bn, warps, stages, ahead in CONFIGS:
            o = torch.empty_like(d["q"])

            def call(o=o, bn=bn, warps=warps, stages=stages, ahead=ahead, d=d, rope=rope):
                dec.decode_attention(d["q"], d["k"], d["v"], d["req_to_token"], d["rows"],
                                     d["seq_lens"], HEAD_DIM**-0.5, o, num_kv_splits=1,
                                     blocks=(bn, warps, stages), rope=rope, slots_ahead=ahead)
            call()
            ref = o if ref is None else ref
            us = kernel_ms(call, flush, evict_ms) * 1e3
            rows.append({"blocks": [bn, warps, stages], "slots_ahead": ahead, "us": us,
                         "kv_gbps": d["kv_gbytes"] / us * 1e6,
                         "max_err": (o.float() - ref.float()).abs().max().item()})
            r = rows[-1]
            print(f"{name} {bn}x{warps}x{stages} ahead {ahead:d}: {us:6.1f} us "
                  f"{r['kv_gbps']:5.0f} GB/s err {r['max_err']:.1e}", flush=True)
        result["cases"][name] = rows
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
