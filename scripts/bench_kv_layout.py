"""H200 microbenchmark: how the attention kernels' time depends on where each request's
K/V slots lie in the pool (Llama-3.1-8B heads, bf16), at the engine's own configs.

Layouts: each request's slots are runs of RUN consecutive slots, the runs shuffled over the
pool (RUN 1: every token anywhere, as a token-granular free list leaves the pool after
many steps of 64 decoders taking one slot each; RUN = context: one contiguous run each).

Cases: `extend` is the offline run's 256-token mixed step in its graph's 65 rows (60
decoders at 512-768 context with a 196-token chunk; bench_extend_attn.py's mixed_graph);
`decode` is batch 64 at 640 context. Why (session 13): the engine's profile of that mixed
step measured the extend kernel at 37 µs a layer on a fresh pool (eager) and 66 µs in the
offline run's steady state (graphed), where bench_extend_attn.py's shuffled slots gave 68.

Usage: python scripts/bench_kv_layout.py --runs 1 16 64 1024 --out kv_layout.json
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from gearshift.kernels.decode import (
    alloc_decode_workspace,
    decode_attention,
    pick_num_kv_splits,
)
from gearshift.kernels.extend import extend_attention
from gearshift.kernels.skinny_select import graph_ms, kernel_ms

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
DECODERS = [(random.Random(0).randint(512, 768) - 1, 1) for _ in range(60)]
CASES = {"extend": DECODERS + [(316, 196)] + [(0, 0)] * 4, "decode": [(639, 1)] * 64}


def layout(seq: list[int], run: int, g: torch.Generator) -> torch.Tensor:
    """req_to_token [len(seq) + 1, max(seq)]: request i's positions over runs of `run`
    consecutive slots (1.. sum(seq)), the runs in a random order."""
    runs = []  # (request, first position, length)
    for i, n in enumerate(seq):
        runs += [(i, p, min(run, n - p)) for p in range(0, n, run)]
    order = torch.randperm(len(runs), generator=g).tolist()
    table = torch.zeros(len(seq) + 1, max(seq), dtype=torch.int32)
    slot = 1
    for j in order:
        i, p, n = runs[j]
        table[i + 1, p:p + n] = torch.arange(slot, slot + n, dtype=torch.int32)
        slot += n
    return table.cuda()


def timed(requests: list[tuple[int, int]], run: int, flush, evict_ms) -> float:
    g = torch.Generator().manual_seed(run)
    seq = [p + n for p, n in requests]
    slots, bs, ext = sum(seq), len(requests), [n for _, n in requests]
    kv = [torch.randn(slots + 1, KV_HEADS, HEAD_DIM, generator=g).to("cuda", torch.bfloat16)
          for _ in range(2)]
    table = layout(seq, run, g)
    rows = torch.arange(1, bs + 1, device="cuda")
    ints = lambda xs: torch.tensor(xs, dtype=torch.int32, device="cuda")  # noqa: E731
    q = torch.randn(sum(ext), HEADS, HEAD_DIM, generator=g).to("cuda", torch.bfloat16)
    out, seq_lens = torch.empty_like(q), ints(seq)
    if all(n == 1 for n in ext):
        splits = pick_num_kv_splits(bs, KV_HEADS)
        work = alloc_decode_workspace(bs, HEADS, HEAD_DIM, splits, "cuda")
        fn = lambda: decode_attention(q, *kv, table, rows, seq_lens, HEAD_DIM**-0.5, out,  # noqa: E731
                                      num_kv_splits=splits, workspace=work)
    else:
        lens, starts = ints(ext), ints([sum(ext[:i]) for i in range(bs)])
        fn = lambda: extend_attention(q, *kv, table, rows, seq_lens, lens, starts,  # noqa: E731
                                      HEAD_DIM**-0.5, out, max_extend_len=max(ext))
    fn()
    return kernel_ms(fn, flush, evict_ms) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, nargs="+", default=[1, 16, 64, 1024])
    ap.add_argument("--out", default="kv_layout.json")
    a = ap.parse_args()
    flush = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
    evict_ms = graph_ms(lambda: None, flush)
    result = {"device": torch.cuda.get_device_name(), "us": {}}
    for name, requests in CASES.items():
        result["us"][name] = {run: timed(requests, run, flush, evict_ms) for run in a.runs}
        print(name, " ".join(f"run {r}: {us:.1f} us" for r, us in result["us"][name].items()),
              flush=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
