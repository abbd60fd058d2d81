"""Does the start-up warm-up measure what real steps cost? (GPU diagnostic)

On the H200 the warm-up (spec/warmup.py) read K = 4 steps 1.0-1.6 ms dearer than K = 3 at
batch 1-16, while the static policies' real steps differed by ~0.3 ms. This prints, for
the same engine:

  1. the warm-up table as measured at start-up;
  2. a second warm-up on the same engine (every graph exists; nothing is first any more);
  3. steady-state steps on held-out prompts: for each batch size, each K in descending
     then ascending order, `--steps` timed steps after prefill and 4 untimed ones (VERIFY:
     wall ms, as the policy observes them; K = 0: device ms), median and p90;
  4. a torch.profiler table of `--profile-steps` VERIFY steps at K = 3 and at K = 4,
     batch 2 (host and device time per op or graph launch).

Usage:
    python scripts/diag_warmup.py --model /tmp/big --draft-model /tmp/bighead --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from gearshift import LLM, SamplingParams
from gearshift.bench.sweep import make_prompts
from gearshift.policy.static import AlwaysPolicy
from gearshift.speculative.warmup import warm_up_speculation


def steady(llm: LLM, prompts, bs: int, k: int, steps: int) -> dict:
    eng = llm.engine
    sched = eng.scheduler
    sched.policy, sched.max_num_seqs = AlwaysPolicy(k), bs
    params = SamplingParams(max_tokens=1024, temperature=0.0, ignore_eos=True)
    ids = [f"d{bs}-{k}-{i}-{time.monotonic_ns()}" for i in range(bs)]
    for rid, p in zip(ids, prompts):
        eng.add_request(rid, p, params)
    while sched.waiting or any(r.num_computed_tokens < len(r.prompt_token_ids)
                               for r in sched.running):
        eng.step()
    for _ in range(4):
        eng.step()
    wall, dev = [], []
    for _ in range(steps):
        seen = eng._num_graphs()
        eng.step()
        if eng._num_graphs() != seen:
            continue
        wall.append(eng.last_step["time_s"] * 1e3)
        dev.append(eng.last_step.get("device_ms"))
    for rid in ids:
        eng.abort_request(rid)
    while eng.has_unfinished_requests():
        eng.step()
    dev = [d for d in dev if d]
    q = sorted(wall)
    return {"bs": bs, "k": k, "wall_ms_median": round(statistics.median(wall), 3),
            "wall_ms_p90": round(q[int(0.9 * (len(q) - 1))], 3),
            "device_ms_median": round(statistics.median(dev), 3) if dev else None,
            "steps": len(wall)}


def profile(llm: LLM, prompts, k: int, steps: int, path: Path) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    eng = llm.engine
    sched = eng.scheduler
    sched.policy, sched.max_num_seqs = AlwaysPolicy(k), 2
    params = SamplingParams(max_tokens=1024, temperature=0.0, ignore_eos=True)
    ids = [f"p{k}-{i}" for i in range(2)]
    for rid, p in zip(ids, prompts):
        eng.add_request(rid, p, params)
    for _ in range(8):
        eng.step()
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            eng.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    path.write_text(p.key_averages().table(sort_by="self_cuda_time_total", row_limit=40))
    for rid in ids:
        eng.abort_request(rid)
    while eng.has_unfinished_requests():
        eng.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft-model", required=True)
    ap.add_argument("--sizes", default="1,2,4,8,16")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--profile-steps", type=int, default=10)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    llm = LLM(a.model, speculative_algorithm="eagle3", draft_model=a.draft_model,
              num_draft_tokens=4, max_num_seqs=256)  # goodput: warm-up at start-up
    res = {"warmup_1": llm.engine.spec.measured_costs or {}, "start_s": time.perf_counter() - t0}
    policy = llm.engine.scheduler.policy
    res["warmup_2"] = warm_up_speculation(llm.engine)
    llm.engine.scheduler.policy = policy
    sizes = [int(s) for s in a.sizes.split(",")]
    prompts = make_prompts(llm.tokenizer, llm.engine.model_config.vocab_size, max(sizes), 128, 0)
    res["steady"] = [steady(llm, prompts, bs, k, a.steps)
                     for bs in sizes for k in (4, 3, 2, 1, 0, 0, 1, 2, 3, 4)]
    for k in (3, 4):
        profile(llm, prompts, k, a.profile_steps, out / f"profile_k{k}_bs2.txt")
    (out / "diag_warmup.json").write_text(json.dumps(res, indent=1))
    for bs in sizes:
        row = {k: [s["wall_ms_median"] for s in res["steady"] if s["bs"] == bs and s["k"] == k]
               for k in range(5)}
        w1 = {k: next((ms for b, ms in res["warmup_1"].get(k, []) if b == bs), None)
              for k in range(5)}
        w2 = {k: next((ms for b, ms in res["warmup_2"].get(k, []) if b == bs), None)
              for k in range(5)}
        print(f"bs {bs}: steady {row} | warm-up 1 "
              f"{ {k: v and round(v, 2) for k, v in w1.items()} } | warm-up 2 "
              f"{ {k: v and round(v, 2) for k, v in w2.items()} }")


if __name__ == "__main__":
    main()
