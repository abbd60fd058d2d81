"""Kernel-level breakdown of eager decode steps (torch.profiler), for finding what a
CUDA-graphed step spends beyond weight streaming. Writes a text table.

Usage: python scripts/profile_decode.py --preset llama-3.1-8b --batch-size 1 --out FILE
"""

from __future__ import annotations

import argparse

from torch.profiler import ProfilerActivity, profile

from gearshift import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-3.1-8b")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--out", default="profile.txt")
    a = ap.parse_args()
    llm = LLM(a.preset, load_format="dummy", cuda_graphs=False, max_num_seqs=max(a.batch_size, 1))
    eng = llm.engine
    for i in range(a.batch_size):
        eng.add_request(f"p{i}", [7] * a.context, SamplingParams(max_tokens=64, ignore_eos=True))
    while any(r.num_computed_tokens < len(r.prompt_token_ids) for r in eng.scheduler.running) \
            or eng.num_waiting():
        eng.step()
    for _ in range(3):
        eng.step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            eng.step()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
    with open(a.out, "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
