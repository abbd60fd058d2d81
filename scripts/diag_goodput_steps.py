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
                          {str(g): [round(t, 2), round(ms, 3)] for g, (t, ms, _) in scores.items()},
                          _why(pol, s.get("batch_size"))])
            if scores:
                pol.last_scores = {}
        prev[0] = now
        return out

    eng.step = wrapped


def _why(pol, bs) -> list:
    """goodput's running gear, why the plan took its gear, and the online observations of
    gears max K and the tree at this batch size ([] for other policies)."""
    if not hasattr(pol, "last_reason") or not bs:
        return []
    b = pol.pad(bs)
    return [pol.current_k, pol.last_reason, pol.cost.observed(pol.max_k, b),
            pol.cost.observed(pol.max_k + 1, b)]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--draft-model", required=True)
    p.add_argument("--concurrency", default="2,4,8,16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=4)
    p.add_argument("--out", default="diag_goodput_steps.json")
    p.add_argument("--policies", default="goodput,goodput-noshare,always-4,tree",
                   help="of: goodput, goodput-noshare, goodput-shadow, always-4, tree, "
                        "always-4-spin-N (a busy wait of N us in the prepare window)")
    args = p.parse_args()
    from gearshift import LLM
    from gearshift.bench import sweep as sw

    concs = [int(x) for x in args.concurrency.split(",")]
    llm = LLM(args.model, draft_model=args.draft_model, speculative_algorithm="eagle3",
              num_draft_tokens=4, draft_topk=4, num_verify_tokens=16, spec_policy="off",
              max_num_seqs=max(concs))
    eng = llm.engine
    warm_s = sw._warm_up(eng)
    policies = {name: make_policy(name, eng) for name in args.policies.split(",")}
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
                            min_requests=16, output_len=128, settle=1)
    n = args.passes * max(sw.per_pass(c, sargs) for c in concs)
    prompts = sw.make_prompts(llm.tokenizer, eng.model_config.vocab_size, n, 128, 0)
    bar = SimpleNamespace(update=lambda x: None)
    out = {"warmup_s": warm_s, "args": vars(args)}

    def save(results):
        for pts in results.values():
            for pt in pts:
                pt.pop("tpot_ms", None)
        out["results"], out["steps_columns"] = results, [
            "c", "policy", "pass", "mode", "gear", "bs", "wall_ms", "device_ms", "scores",
            "goodput: [current gear, reason, observed(max K), observed(tree)]"]
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


def make_policy(name: str, eng):
    """The sweep's policies, and two variants of goodput: `goodput-noshare` (no shared drift:
    the code before session 9) and `goodput-shadow`, which does all of goodput's host work
    (scores in prepare, plan, observations) and then runs K = 4 chains whatever it chose:
    against always-4 it prices goodput's host work apart from its choices (session 10: at
    c = 8 goodput's median K = 4 step took ~0.1 ms longer than always-4's, at equal device
    time, and goodput trailed always-4 by 3.5% in two sweeps)."""
    from gearshift.bench import sweep as sw

    if name == "goodput-noshare":
        pol = sw.policy_object("goodput", eng, 4)
        pol.cost.shared = 0.0
        return pol
    if name.startswith("always-4-spin"):  # always-4 + a busy wait in prepare() (window)
        return _spinning(sw.policy_object("always-4", eng, 4), float(name.split("-")[-1]))
    if name != "goodput-shadow":
        return sw.policy_object(name, eng, 4)
    pol = sw.policy_object("goodput", eng, 4)
    plan = pol.plan

    def shadow_plan(view):
        plan(view)
        pol._topk = 1
        return [min(4, view.max_k) if pol.eligible(r) else 0 for r in view.requests]

    pol.plan = shadow_plan
    return pol


def _spinning(pol, us: float):
    """`always-4-spin-N`: always-4 whose prepare() (called while the device runs the VERIFY
    step, before its sync) busy-waits N us without touching memory. If the window is idle
    host time, its steps cost what always-4's do; if goodput-shadow's still cost ~0.1 ms
    more, what its work does to the host (its caches), not its time, is the price."""
    def prepare(view):
        end = time.perf_counter() + us * 1e-6
        while time.perf_counter() < end:
            pass

    pol.prepare = prepare
    return pol


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
    why = defaultdict(int)  # goodput: (running gear, reason, gear taken) -> VERIFY steps
    for st in STEPS:
        if st[0] == c and st[3] == "verify" and len(st) > 9 and st[9]:
            why[(st[9][0], st[9][1], st[4])] += 1
    if why:
        print("    goodput (running gear, reason, gear taken): steps",
              dict(sorted(why.items(), key=lambda kv: -kv[1])))
    for key in sorted(cells, key=lambda k: (k[2], k[1], k[0])):
        v = cells[key]
        if len(v) >= 5:
            print(f"    bs {key[2]:3d} gear {key[1]} {key[0]:16s} n {len(v):4d} "
                  f"median {statistics.median(v):6.2f} ms")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
