"""H200 microbenchmark: decoder layers of the Llama-3.1-8B shape in a DECODE CUDA graph,
with and without L2 weight prefetch on a side stream (models/prefetch.py).

Builds `--layers` decoder layers with dummy bf16 weights (the engine's loader and layer
code, Triton attention over a shuffled slot pool), captures one DECODE forward per
(case, variant) and replays them in interleaved rounds. Reports µs per layer (median and
best of the rounds) and checks that every variant's output equals the baseline's bit for
bit (a prefetch writes nothing). Also times prefetch_l2 alone over the o_proj weight.

A variant is a GEARSHIFT_L2_PREFETCH spec (`after_qkv=all,after_o=16M`; empty: none),
optionally with `evict_last` and `programs=N` among its items.

Usage: python scripts/bench_l2_prefetch.py --out prefetch.json [--cases 1x1024,64x640]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch

from gearshift.attention.base import KVCache
from gearshift.attention.triton_backend import TritonBackend
from gearshift.forward_batch import ForwardBatch, ForwardMode
from gearshift.models.kernels.prefetch import prefetch_l2
from gearshift.models.loader import load_model, resolve_model_config
from gearshift.models.prefetch import PrefetchPlan, attach

DEFAULT_VARIANTS = [
    "",
    "after_down=24M",
    "after_down=48M",
    "after_down=24M,load",
    "after_qkv=all,load",
    "after_qkv=all,programs=8",
    "after_o=16M,after_down=24M",
    "after_qkv=all,after_o=16M,after_down=24M,load",
]


def gemm_after_prefetch(w: torch.Tensor, flush: torch.Tensor, reps: int = 200) -> dict:
    """Does a prefetch put w in L2? One-row x @ w.T timed cold (after an L2 flush) and right
    after prefetch_l2(w) as hint / as loads: differences of graphs [flush, (prefetch), gemm]
    and [flush, (prefetch)]."""
    x = torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device)

    def graph_of(fn):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return g

    gemm = lambda: torch.nn.functional.linear(x, w)  # noqa: E731
    out = {}
    for name, pre in (("cold", None), ("hint", {}), ("load", {"load": True}),
                      ("load_evict_last", {"load": True, "evict_last": True})):
        def body(pre=pre):
            flush.zero_()
            if pre is not None:
                prefetch_l2(w, **pre)
        g_without = graph_of(body)
        g_with = graph_of(lambda body=body: (body(), gemm()))
        t_without = statistics.median(time_graph(g_without, reps) for _ in range(5))
        t_with = statistics.median(time_graph(g_with, reps) for _ in range(5))
        out[name] = {"gemm_us": (t_with - t_without) * 1e3, "setup_us": t_without * 1e3}
        print(f"o_proj gemm after {name:16s}: {out[name]['gemm_us']:6.1f} us "
              f"(flush + prefetch {out[name]['setup_us']:.1f} us)", flush=True)
    return out


def plan_of(spec: str) -> PrefetchPlan | None:
    if not spec:
        return None
    items = [s for s in spec.split(",") if s]
    kw = {"evict_last": "evict_last" in items, "load": "load" in items}
    for s in items:
        if s.startswith("programs="):
            kw["programs"] = int(s.split("=")[1])
    points = ",".join(s for s in items
                      if s not in ("evict_last", "load") and not s.startswith("programs="))
    return PrefetchPlan.parse(points, **kw)


def decode_batch(bs: int, ctx: int, kv: KVCache, device) -> ForwardBatch:
    g = torch.Generator(device=device).manual_seed(bs * 31 + ctx)
    perm = torch.randperm(bs * ctx, device=device, generator=g) + 1  # slot 0: the dummy
    kv.req_to_token[1:bs + 1, :ctx] = perm.view(bs, ctx).to(torch.int32)
    rows = torch.arange(1, bs + 1, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    return ForwardBatch(
        mode=ForwardMode.DECODE, batch_size=bs, padded_batch_size=bs, num_tokens=bs,
        input_ids=torch.randint(0, 1000, (bs,), device=device, generator=g),
        positions=torch.full((bs,), ctx - 1, dtype=torch.int64, device=device),
        out_cache_loc=kv.req_to_token[rows, ctx - 1].long(),
        req_pool_indices=rows, seq_lens=torch.full((bs,), ctx, **i32),
        extend_lens=torch.ones(bs, **i32), extend_start_loc=torch.arange(bs, **i32),
        prefix_lens=torch.full((bs,), ctx - 1, **i32),
        logits_indices=torch.arange(bs, device=device),
        seq_lens_cpu=[ctx] * bs, extend_lens_cpu=[1] * bs, prefix_lens_cpu=[ctx - 1] * bs,
        max_seq_len=ctx, max_extend_len=1,
    )


def time_graph(graph: torch.cuda.CUDAGraph, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="prefetch.json")
    ap.add_argument("--cases", default="1x1024,64x640", help="BSxCONTEXT,...")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--variants", nargs="*", default=DEFAULT_VARIANTS)
    a = ap.parse_args()
    device = torch.device("cuda")
    cfg, _ = resolve_model_config("llama-3.1-8b")
    cfg = dataclasses.replace(cfg, num_layers=a.layers)
    model = load_model(cfg, None, dtype="bfloat16", device="cuda", max_positions=4096)
    cases = [tuple(map(int, c.split("x"))) for c in a.cases.split(",")]
    max_slots = max(bs * ctx for bs, ctx in cases)
    kv = KVCache.allocate(cfg.num_layers, max_slots, cfg.num_kv_heads, cfg.head_dim,
                          max(bs for bs, _ in cases), max(ctx for _, ctx in cases) + 1,
                          torch.bfloat16, device)
    kv.k.normal_(0, 1)
    kv.v.normal_(0, 1)
    backend = TritonBackend(kv, cfg.head_dim ** -0.5)
    result = {"layers": a.layers, "cases": {}}

    o_w = model.layers[0].self_attn.o_proj.weight
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    for programs in (16, 32, 66, 132):
        times = []
        for _ in range(20):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            prefetch_l2(o_w, programs=programs)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        us = statistics.median(times)
        mb = o_w.numel() * 2 / 1e6
        print(f"prefetch_l2 o_proj {mb:.1f} MB programs={programs}: {us:.1f} us "
              f"({mb / us:.2f} TB/s)", flush=True)
        result.setdefault("prefetch_alone", []).append({"programs": programs, "us": us, "mb": mb})
    result["gemm_after_prefetch"] = gemm_after_prefetch(o_w, flush)

    for bs, ctx in cases:
        fb = decode_batch(bs, ctx, kv, device)
        backend.reserve_decode_workspace(bs, cfg.num_heads, cfg.head_dim)
        for _ in range(3):  # the skinny chooser times its shapes at first eager use
            model(fb.input_ids, fb.positions, fb, backend)
        torch.cuda.synchronize()
        graphs, outs = {}, {}
        stream = torch.cuda.Stream()
        for spec in a.variants:
            attach(model, plan_of(spec), device)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                model(fb.input_ids, fb.positions, fb, backend)  # warm-up off the graph
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                out = model(fb.input_ids, fb.positions, fb, backend)
            graphs[spec], outs[spec] = graph, out
        attach(model, None, device)
        samples = {spec: [] for spec in a.variants}
        for spec in a.variants:
            graphs[spec].replay()
        torch.cuda.synchronize()
        ref = outs[""].clone() if "" in outs else None
        same = {spec: ref is None or bool(torch.equal(outs[spec], ref)) for spec in a.variants}
        for r in range(a.rounds):
            order = a.variants if r % 2 == 0 else a.variants[::-1]
            for spec in order:
                samples[spec].append(time_graph(graphs[spec], a.reps) * 1e3 / a.layers)
        rows = []
        base = statistics.median(samples[a.variants[0]])
        for spec in a.variants:
            med, best = statistics.median(samples[spec]), min(samples[spec])
            rows.append({"variant": spec or "none", "us_per_layer_median": med,
                         "us_per_layer_best": best, "same_output": same[spec],
                         "samples": samples[spec]})
            print(f"bs {bs:3d} ctx {ctx:5d} {spec or 'none':60s} {med:7.2f} us/layer "
                  f"(best {best:7.2f}, {med / base - 1:+.1%}) same={same[spec]}", flush=True)
        result["cases"][f"{bs}x{ctx}"] = rows
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
