"""Kernel-level breakdown of eager decode steps (torch.profiler), for finding what a
CUDA-graphed step spends beyond weight streaming. Writes a text table.

Usage: python scripts/profile_decode.py --preset llama-3.1-8b --batch-size 1 --out FILE
       (--mixed N --mixed-len L --chunk C: N new prompts arrive after the decoders are warm,
        so the profiled steps are mixed EXTEND steps of chunked prefill riding with decode)
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
    ap.add_argument("--mixed", type=int, default=0)
    ap.add_argument("--mixed-len", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    extra = {"max_num_batched_tokens": a.chunk} if a.chunk else {}
    llm = LLM(a.preset, load_format="dummy", cuda_graphs=False,
              max_num_seqs=max(a.batch_size + a.mixed, 1), **extra)
    eng = llm.engine
    for i in range(a.batch_size):
        # decoders outlive the profile: with max_tokens 64 the first prompts of a chunked
        # prefill had finished before the last one was in (session 13: ~26 of 60 left)
        eng.add_request(f"p{i}", [7] * a.context,
                        SamplingParams(max_tokens=1024, ignore_eos=True))
    while any(r.num_computed_tokens < len(r.prompt_token_ids) for r in eng.scheduler.running) \
            or eng.num_waiting():
        eng.step()
    for _ in range(3):
        eng.step()
    for i in range(a.mixed):
        eng.add_request(f"m{i}", [9] * a.mixed_len, SamplingParams(max_tokens=8, ignore_eos=True))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            eng.step()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
    with open(a.out, "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
