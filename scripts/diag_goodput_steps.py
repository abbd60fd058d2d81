"""Why goodput trails the best static policy by 3% at c = 2..16 (H200, session 9 calls C/D):
every step of the sweep's closed loops, recorded, for goodput, goodput without the cost
model's shared drift (`CostModel.shared = 0`, the code before session 9), always-4 and the
tree, interleaved as in `bench sweep` (same prompts per pass).

Per step: policy, c, pass, mode, gear, batch size, wall period (ms, from the previous
step's return, as the sweep times it), device ms, and for goodput the gear it chose and
its scores then (predicted ms and tokens per gear). Writes the sweep points and the steps
to JSON, and prints per (c, policy): tok/s per pass, and the median VERIFY period per
(gear, batch size), so goodput's steps compare with the static policies' at equal shapes.

    python scripts/diag_goodput_steps.py --model /tmp/big --draft-model /tmp/bighead \
        --concurrency 2,4,8,16 --rounds 3 --passes 4 --out steps.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS: list[list] = []
STATE = {"on": False, "label": None, "c": 0, "pass": {}}


def record(eng, names: dict) -> None:
    step = eng.step
    prev = [time.perf_counter()]

    def wrapped():
        out = step()
        now = time.perf_counter()
        if STATE["on"]:
            s, pol = eng.last_step, eng.scheduler.policy
            scores = getattr(pol, "last_scores", None) or {}
            STEPS.append([STATE["c"], names[id(pol)], STATE["pass"][names[id(pol)]],
                          s.get("mode"), s.get("gear"), s.get("batch_size"),
                          round((now - prev[0]) * 1e3, 3), round(s.get("device_ms") or 0.0, 3),
                          {str(g): [round(t, 2), round(ms, 3)] for g, (t, ms, _) in scores.items()}])
            if scores:
                pol.last_scores = {}
        prev[0] = now
        return out

    eng.step = wrapped


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--draft-model", required=True)
    p.add_argument("--concurrency", default="2,4,8,16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=4)
    p.add_argument("--out", default="diag_goodput_steps.json")
    args = p.parse_args()
    from gearshift import LLM
    from gearshift.bench import sweep as sw

    concs = [int(x) for x in args.concurrency.split(",")]
    llm = LLM(args.model, draft_model=args.draft_model, speculative_algorithm="eagle3",
              num_draft_tokens=4, draft_topk=4, num_verify_tokens=16, spec_policy="off",
              max_num_seqs=max(concs))
    eng = llm.engine
    warm_s = sw._warm_up(eng)
    policies = {"goodput": sw.policy_object("goodput", eng, 4),
                "goodput-noshare": sw.policy_object("goodput", eng, 4),
                "always-4": sw.policy_object("always-4", eng, 4),
                "tree": sw.policy_object("tree", eng, 4)}
    policies["goodput-noshare"].cost.shared = 0.0
    names = {id(v): k for k, v in policies.items()}
    record(eng, names)
    run_point, warm_up = sw.run_point, sw.warm_up

    def timed_point(engine, prompts, c, output_len):
        name = names[id(engine.scheduler.policy)]
        STATE["c"] = c
        STATE["pass"][name] = STATE["pass"].get(name, -1) + 1
        return run_point(engine, prompts, c, output_len)

    def quiet_warm_up(*a, **k):
        STATE["on"] = False
        warm_up(*a, **k)
        STATE["on"] = True

    sw.run_point, sw.warm_up = timed_point, quiet_warm_up
    sargs = SimpleNamespace(concurrency=concs, rounds=args.rounds, passes=args.passes,
                            min_requests=16, output_len=128)
    n = args.passes * max(sw.per_pass(c, sargs) for c in concs)
    prompts = sw.make_prompts(llm.tokenizer, eng.model_config.vocab_size, n, 128, 0)
    bar = SimpleNamespace(update=lambda x: None)
    out = {"warmup_s": warm_s, "args": vars(args)}

    def save(results):
        for pts in results.values():
            for pt in pts:
                pt.pop("tpot_ms", None)
        out["results"], out["steps_columns"] = results, [
            "c", "policy", "pass", "mode", "gear", "bs", "wall_ms", "device_ms", "scores"]
        out["steps"] = STEPS
        with open(args.out, "w") as f:
            json.dump(out, f)

    for c in concs:  # one c at a time: the per-pass state restarts (STATE["pass"])
        STATE["pass"] = {}
        res = sw.sweep(eng, policies, prompts, SimpleNamespace(**{**vars(sargs), "concurrency": [c]}),
                       bar)
        for name, pts in res.items():
            out.setdefault("points", {}).setdefault(name, []).extend(pts)
        save(out["points"])
        summarize(c, res)
    return 0


def summarize(c: int, res: dict) -> None:
    print(f"c = {c}")
    for name, pts in res.items():
        print(f"  {name:16s} {pts[0]['output_tok_per_s']:8.0f} tok/s  passes "
              f"{pts[0]['pass_tok_per_s']}  K mix {pts[0]['request_steps_by_k']} "
              f"tree {pts[0]['request_steps_tree']}")
    cells = defaultdict(list)
    for st in STEPS:
        if st[0] == c and st[3] == "verify":
            cells[(st[1], st[4], st[5])].append(st[6])
    for key in sorted(cells, key=lambda k: (k[2], k[1], k[0])):
        v = cells[key]
        if len(v) >= 5:
            print(f"    bs {key[2]:3d} gear {key[1]} {key[0]:16s} n {len(v):4d} "
                  f"median {statistics.median(v):6.2f} ms")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
