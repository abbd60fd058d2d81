"""Kernel micro-benchmark: one depth of a coupled draft chain (speculative/coupled.py), the
race over the draft vocabulary in torch (draft_scores, its argmax, and the log-softmax of
the scores that chains took before) against draft_tokens (the sampler's fused kernel with
the draft vocabulary's columns), at several row counts: half the rows greedy, half sampled
at temperature 1.2, bf16 logits of an EAGLE-3 draft vocabulary (32,000 of Llama 3's
128,256 tokens). Each side is timed with CUDA events over `--iters` calls after a few
untimed ones; the two must pick the same tokens (up to float-rounding near-ties). Writes
JSON; prints a table. `--device cpu` with small sizes is the smoke test.

Usage: python benchmarks/bench_draft_race.py --out draft_race.json [--rows 32 64 256]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gearshift

from gearshift.runner.sampler import SamplingBatch  # noqa: E402
from gearshift.speculative.coupled import draft_scores, draft_tokens  # noqa: E402


def batch(rows: int, device: str) -> SamplingBatch:
    """Every other row greedy, the rest sampled at 1.2 (the mixed workload), coupled."""
    temps = torch.where(torch.arange(rows) % 2 == 0, 0.0, 1.2).to(device)
    sb = SamplingBatch(temperatures=temps, top_p=torch.ones(rows, device=device),
                       top_k=torch.full((rows,), -1, device=device),
                       seeds=torch.arange(rows, device=device) * 7919 + 1,
                       steps=torch.full((rows,), 5, dtype=torch.int64, device=device),
                       all_greedy=False, any_greedy=True, need_top_k=False, need_top_p=False)
    sb.coupled, sb.all_coupled = temps > 0, True
    return sb


def timed_ms(fn, iters: int, device: str) -> float:
    for _ in range(3):
        fn()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def run(rows: int, draft_vocab: int, target_vocab: int, iters: int, device: str) -> dict:
    g = torch.Generator().manual_seed(rows)
    logits = (torch.randn(rows, 1, draft_vocab, generator=g) * 3).to(device, torch.bfloat16)
    cols = torch.randperm(target_vocab, generator=g)[:draft_vocab].sort().values.to(device)
    sb = batch(rows, device)

    def torch_race() -> torch.Tensor:
        race = draft_scores(logits, sb, 2, cols)  # [B, 1, Vd]
        torch.log_softmax(race, dim=-1)
        return race.argmax(-1)

    def fused() -> torch.Tensor:
        return draft_tokens(logits, sb, 2, cols)

    return {"rows": rows, "torch_ms": timed_ms(torch_race, iters, device),
            "fused_ms": timed_ms(fused, iters, device),
            "agree": float((torch_race() == fused()).float().mean())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[32, 64, 256])
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument("--target-vocab", type=int, default=128256)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="draft_race.json")
    args = p.parse_args(argv)
    if args.device == "cuda":
        from gearshift.kernels.sample import warmup

        warmup(args.target_vocab, args.device, (torch.bfloat16, torch.float32))
    results = [run(r, args.draft_vocab, args.target_vocab, args.iters, args.device)
               for r in args.rows]
    print("| rows | torch race ms | fused ms | torch / fused | same tokens |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['rows']} | {r['torch_ms']:.3f} | {r['fused_ms']:.3f} | "
              f"{r['torch_ms'] / r['fused_ms']:.1f}x | {r['agree']:.0%} |")
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    Path(args.out).write_text(json.dumps({"device": device, "args": vars(args),
                                          "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
