"""`gearshift bench burst` (issue #4): what a stretch at K = 0 costs the speculation that
follows.

burst: one engine, EAGLE-3 head, goodput policy. R greedy probes (held-out corpus prompts)
  run alone (reference), again with B short requests injected once every probe has
  `inject_at` tokens (the policy falls to K = 0), and alone once more (reference noise).
  A StepTap on the scheduler and the proposer gives per probe decode step: output
  position, K, proposed / accepted drafts, the draft chain. Over the verify steps that
  start at output positions [T1, T2): acceptance (also per K and per depth), and the
  drafts of steps both runs started at the same position; the same acceptance over the
  probes whose text agrees in both runs, also at the same K mix (text_matched). Criterion:
  acceptance within 2%; greedy outputs identical.

Data flow: args -> LLM -> Engine.step loop (plans tapped) -> step records -> JSON, table.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter

import torch

from gearshift.bench.pair import first_divergence
from gearshift.bench.spec_tax import fmt, fmt_list, int_list, json_args
from gearshift.request import SamplingParams

_ids = itertools.count()


class StepTap:
    """Wraps engine.scheduler.schedule and the proposer's propose (instance attributes,
    removed on exit) to note, for each probe decoding in the step: (request, output
    position, K, proposed, accepted) as they stand before the step runs, and where its
    chain of drafts lies in the step's draft tree (one device copy a step, read after the
    run: no extra host sync, no extra launch per probe)."""

    def __init__(self, engine, probe_ids: set[str]) -> None:
        self.scheduler, self.probe_ids = engine.scheduler, probe_ids
        self.proposer = engine.spec.proposer if engine.spec and engine.config.draft_topk == 1 else None
        self.rows: list[tuple] = []
        self.tree_tokens: torch.Tensor | None = None  # [B, N] this step's draft trees (device)
        self.drafts: dict[str, tuple[int, int]] = {}  # request id -> (tree row, K), this step
        self.batch_size = 0

    def __enter__(self) -> StepTap:
        orig = self.scheduler.schedule

        def schedule():
            plan = orig()
            self.batch_size = plan.batch_size
            self.rows = [(r, len(r.output_token_ids), plan.draft_lens[i] if plan.draft_lens else 0,
                          r.spec_proposed, r.spec_accepted)
                         for i, r in enumerate(plan.reqs) if r.request_id in self.probe_ids
                         and plan.extend_lens[i] == 1 and plan.sample[i]]
            return plan

        self.scheduler.schedule = schedule
        if self.proposer is not None:
            propose = self.proposer.propose

            def spy(ctx):
                tree, nodes = propose(ctx)
                self.tree_tokens = tree.tokens.clone()  # [B, N]; column 0 = pending token
                self.drafts = {r.request_id: (i, k) for i, (r, k) in enumerate(
                    zip(ctx.reqs, ctx.draft_lens)) if k and r.request_id in self.probe_ids}
                return tree, nodes

            self.proposer.propose = spy
        return self

    def __exit__(self, *exc) -> None:
        del self.scheduler.schedule
        if self.proposer is not None:
            del self.proposer.propose


def probe_run(llm, probes: list[list[int]], max_tokens: int, burst: list[list[int]] | None = None,
              burst_tokens: int = 64, inject_at: int = 64) -> dict:
    """Run the probes (greedy) to the end; with `burst`, inject those requests once every
    probe has `inject_at` output tokens. -> step records per probe, outputs, burst timing."""
    eng = llm.engine
    run = next(_ids)
    ids = [f"probe{run}-{i}" for i in range(len(probes))]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for rid, p in zip(ids, probes):
        eng.add_request(rid, p, params)
    steps: dict[str, list[dict]] = {rid: [] for rid in ids}
    reqs: dict = {}
    burst_ids: set[str] = set()
    done: set[str] = set()
    info: dict = {}
    t0, n = time.perf_counter(), 0
    with StepTap(eng, set(ids)) as tap:
        while eng.has_unfinished_requests():
            tap.drafts = {}
            outs = eng.step()
            for r, pos, k, p0, a0 in tap.rows:
                reqs[r.request_id] = r
                steps[r.request_id].append({"step": n, "pos": pos, "k": k, "bs": tap.batch_size,
                                            "proposed": r.spec_proposed - p0,
                                            "accepted": r.spec_accepted - a0,
                                            "emitted": len(r.output_token_ids) - pos,
                                            "drafts": (tap.tree_tokens, *tap.drafts[r.request_id])
                                            if r.request_id in tap.drafts else None})
            tokens = [len(reqs[i].output_token_ids) if i in reqs else 0 for i in ids]
            if burst and not burst_ids and min(tokens) >= inject_at:
                bp = SamplingParams(max_tokens=burst_tokens, temperature=0.0, ignore_eos=True)
                for j, p in enumerate(burst):
                    burst_ids.add(f"burst{run}-{j}")
                    eng.add_request(f"burst{run}-{j}", p, bp)
                info.update(size=len(burst), inject_step=n, inject_tokens=tokens)
            done.update(o.request_id for o in outs if o.finished and o.request_id in burst_ids)
            if burst_ids and "end_step" not in info and done == burst_ids:
                info.update(end_step=n, end_tokens=tokens)
            n += 1
    elapsed = time.perf_counter() - t0
    host: dict[int, list] = {}  # id(tree tokens) -> tokens on the host
    for s in (s for rows in steps.values() for s in rows):
        if s["drafts"] is not None:
            t, i, k = s["drafts"]
            s["drafts"] = host.setdefault(id(t), t.tolist())[i][1:1 + k]
    return {"steps": steps, "outputs": [list(reqs[i].output_token_ids) for i in ids],
            "burst": info, "num_steps": n, "elapsed_s": elapsed}


def window_stats(steps: dict[str, list[dict]], t1: int, t2: int) -> dict:
    """Acceptance of the probes' verify steps that start at output positions [t1, t2)."""
    per_probe, rows_all = [], []
    for rows in steps.values():
        rows = [s for s in rows if s["k"] > 0 and t1 <= s["pos"] < t2]
        rows_all += rows
        p, a = sum(s["proposed"] for s in rows), sum(s["accepted"] for s in rows)
        per_probe.append({"proposed": p, "accepted": a, "acceptance_rate": a / p if p else None})
    by_k: dict[int, dict] = {}
    for s in rows_all:
        d = by_k.setdefault(s["k"], {"steps": 0, "proposed": 0, "accepted": 0})
        d["steps"] += 1
        d["proposed"] += s["proposed"]
        d["accepted"] += s["accepted"]
    for d in by_k.values():
        d["acceptance_rate"] = d["accepted"] / d["proposed"] if d["proposed"] else None
    p, a, v = (sum(s["proposed"] for s in rows_all), sum(s["accepted"] for s in rows_all),
               len(rows_all))
    depth = []  # P(draft j accepted | drafts 1..j-1 accepted, K >= j): K-independent
    for j in range(1, max((s["k"] for s in rows_all), default=0) + 1):
        reached = [s for s in rows_all if s["k"] >= j and s["accepted"] >= j - 1]
        depth.append(sum(s["accepted"] >= j for s in reached) / len(reached) if reached else None)
    return {"acceptance_rate": a / p if p else None, "proposed": p, "accepted": a, "verify_steps": v,
            "depth_acceptance": depth,
            "first_draft_acceptance": sum(s["accepted"] > 0 for s in rows_all) / v if v else None,
            "accepted_per_verify": a / v if v else None,
            "k_hist": {k: by_k[k]["steps"] for k in sorted(by_k)},
            "by_k": dict(sorted(by_k.items())), "per_probe": per_probe}


def shared_positions(ref: dict, other: dict, outputs: list[list[int]], t1: int, t2: int) -> dict:
    """Verify steps that both runs started at the same output position of a probe, in the
    window: are their drafts identical (over the shorter K)? A draft that saw every token
    committed at K = 0 proposes what it would have proposed without the stop."""
    n = same = ok_ref = ok_other = 0
    for rows_a, rows_b, out in zip(ref.values(), other.values(), outputs):
        drafts = {s["pos"]: s["drafts"] for s in rows_a if s["drafts"] and t1 <= s["pos"] < t2}
        for s in rows_b:
            d = drafts.get(s["pos"]) if s["drafts"] else None
            if d is None or s["pos"] >= len(out):
                continue
            m = min(len(d), len(s["drafts"]))
            n += 1
            same += d[:m] == s["drafts"][:m]
            ok_ref += d[0] == out[s["pos"]]
            ok_other += s["drafts"][0] == out[s["pos"]]
    return {"steps": n, "identical_drafts": same, "identical_fraction": same / n if n else None,
            "first_draft_correct": [ok_ref / n, ok_other / n] if n else None}


def burst_stats(run: dict, t1: int) -> dict:
    """K = 0 steps of the probes while the burst ran, and where speculation resumed."""
    info = dict(run["burst"])
    if "inject_step" not in info:
        return info
    end = info.get("end_step", run["num_steps"])
    during = [s for rows in run["steps"].values() for s in rows if info["inject_step"] < s["step"] <= end]
    info.update(
        probe_steps=len(during), probe_steps_k0=sum(s["k"] == 0 for s in during),
        engine_steps_k0=len({s["step"] for s in during if s["k"] == 0}),
        k_hist=dict(sorted(Counter(s["k"] for s in during).items())),
        max_batch=max((s["bs"] for s in during), default=0),
        resumed_at_tokens=[next((s["pos"] for s in rows if s["step"] > end and s["k"] > 0), None)
                           for rows in run["steps"].values()],
        finished_before_window=bool(info.get("end_tokens")) and max(info["end_tokens"]) < t1)
    return info


def k_matched(ref: dict, other: dict) -> tuple[float | None, float | None, float]:
    """Per-token acceptance falls with K, and the policy may pick another K mix in each
    run: both runs' per-K acceptance over the K values both used, weighted by `other`'s
    proposals per K. -> (reference, other, share of `other`'s proposals covered)."""
    common = [k for k, d in other["by_k"].items() if d["proposed"] and ref["by_k"].get(k, {}).get(
        "proposed")]
    w = sum(other["by_k"][k]["proposed"] for k in common)
    if not w:
        return None, None, 0.0
    cover = w / sum(d["proposed"] for d in other["by_k"].values())
    return *(sum(other["by_k"][k]["proposed"] * run["by_k"][k]["acceptance_rate"]
                     for k in common) / w for run in (ref, other)), cover


def compare(ref: dict, burst: dict) -> dict:
    a_k, b_k, cover = k_matched(ref, burst)
    out: dict = {"k_matched_coverage": cover}
    ref, burst = dict(ref, acceptance_rate_k_matched=a_k), dict(burst, acceptance_rate_k_matched=b_k)
    for key in ("acceptance_rate", "acceptance_rate_k_matched", "first_draft_acceptance",
                "accepted_per_verify"):
        a, b = ref[key], burst[key]
        diff = None if a is None or b is None else b - a
        out[key] = {"reference": a, "after_burst": b, "abs_diff": diff,
                    "rel_diff": diff / a if diff is not None and a else None}
    return out


def text_matched(ref: dict[str, list[dict]], other: dict[str, list[dict]], div: list[int | None],
                 t1: int, t2: int) -> dict:
    """`compare` over the probes whose greedy outputs agree in both runs through the window
    (the drafts of its last steps included): the same text, so what differs is the draft's
    state and the K mix (the K-matched rate takes that out too). bf16 numerics follow the
    batch's shape, so a probe's text can fork early in one run, and the policy's K mix moves
    as its costs calibrate: together they moved the all-probe rate by 2.6-3.5% between two
    runs that never stopped (H200, session 12). ref / other: per probe step records."""
    kmax = max((s["k"] for run in (ref, other) for rows in run.values() for s in rows), default=0)
    keep = [i for i, d in enumerate(div) if d is None or d >= t2 + kmax]
    a, b = ({rid: rows for i, (rid, rows) in enumerate(run.items()) if i in keep}
            for run in (ref, other))
    return {"probes": keep, **compare(window_stats(a, t1, t2), window_stats(b, t1, t2))}


def burst_experiment(llm, probes: list[list[int]], burst: list[list[int]], *, max_tokens: int,
                     burst_tokens: int, inject_at: int, window: tuple[int, int],
                     reference_runs: int = 2) -> dict:
    """warm-up -> reference -> burst -> reference (reference_runs = 2): acceptance in
    `window`. The warm-up (probes to `inject_at` tokens) compiles / captures the shapes the
    probes use, so the reference's measured step times do not steer the policy elsewhere."""
    t1, t2 = window
    probe_run(llm, probes, max(inject_at, 2))
    refs = [probe_run(llm, probes, max_tokens)]
    b = probe_run(llm, probes, max_tokens, burst, burst_tokens, inject_at)
    refs += [probe_run(llm, probes, max_tokens) for _ in range(reference_runs - 1)]
    ref_w = [window_stats(r["steps"], t1, t2) for r in refs]
    burst_w = window_stats(b["steps"], t1, t2)
    div = [first_divergence(x, y) for x, y in zip(refs[0]["outputs"], b["outputs"])]
    result = {"window": [t1, t2], "probes": len(probes), "reference": ref_w[0], "after_burst": burst_w,
              "burst": burst_stats(b, t1), "comparison": compare(ref_w[0], burst_w),
              "shared_positions": shared_positions(refs[0]["steps"], b["steps"], refs[0]["outputs"],
                                                   t1, t2),
              "text_matched": text_matched(refs[0]["steps"], b["steps"], div, t1, t2),
              "outputs_identical": all(d is None for d in div), "first_divergence": div,
              "elapsed_s": {"reference": refs[0]["elapsed_s"], "burst": b["elapsed_s"]},
              "step_records": {name: _compact(run["steps"]) for name, run in
                               zip(("reference", "after_burst", "reference_2"), (refs[0], b, *refs[1:]))}}
    if len(refs) > 1:  # run-to-run noise of the reference itself (policy / cost state moved on)
        result["reference_2"] = ref_w[1]
        result["reference_noise"] = compare(ref_w[0], ref_w[1])["acceptance_rate"]
        result["reference_outputs_identical"] = refs[0]["outputs"] == refs[1]["outputs"]
        result["reference_noise_text_matched"] = text_matched(
            refs[0]["steps"], refs[1]["steps"],
            [first_divergence(x, y) for x, y in zip(refs[0]["outputs"], refs[1]["outputs"])], t1, t2)
    c, ck = result["comparison"]["acceptance_rate"], result["comparison"]["acceptance_rate_k_matched"]
    tm = result["text_matched"]["acceptance_rate_k_matched"]
    result["checks"] = {
        "k0_during_burst": result["burst"].get("probe_steps_k0", 0) > 0,
        "burst_finished_before_window": result["burst"].get("finished_before_window", False),
        "outputs_identical": result["outputs_identical"],
        "within_2pct_abs": None if c["abs_diff"] is None else abs(c["abs_diff"]) <= 0.02,
        "within_2pct_rel": None if c["rel_diff"] is None else abs(c["rel_diff"]) <= 0.02,
        "k_matched_within_2pct_rel": None if ck["rel_diff"] is None else abs(ck["rel_diff"]) <= 0.02,
        "text_k_matched_within_2pct_rel": None if tm["rel_diff"] is None else abs(tm["rel_diff"]) <= 0.02,
    }
    return result


RECORD_KEYS = ("step", "pos", "k", "bs", "proposed", "accepted")  # a saved step record's fields


def _compact(steps: dict[str, list[dict]]) -> dict[str, list[list[int]]]:
    """Per probe: [step, output position, K, batch size, proposed, accepted] per decode step."""
    return {rid: [[s[k] for k in RECORD_KEYS] for s in rows] for rid, rows in steps.items()}


def expand(records: dict[str, list[list[int]]]) -> dict[str, list[dict]]:
    """The inverse of _compact: a saved JSON's step records as window_stats reads them."""
    return {rid: [dict(zip(RECORD_KEYS, row)) for row in rows] for rid, rows in records.items()}


def run_burst(args) -> int:
    from gearshift import LLM
    from gearshift.bench.offline import environment
    from gearshift.bench.sweep import make_prompts
    from gearshift.engine_args import engine_kwargs

    kw = engine_kwargs(args)
    kw["max_num_seqs"] = args.max_num_seqs or args.probes + args.burst_size
    llm = LLM(**kw)
    vocab = llm.engine.model_config.vocab_size
    probes = make_prompts(llm.tokenizer, vocab, args.probes, args.input_len, args.seed)
    burst = make_prompts(llm.tokenizer, vocab, args.probes + args.burst_size, args.burst_input_len,
                         args.seed + 1)[args.probes:]
    result = burst_experiment(llm, probes, burst, max_tokens=args.probe_tokens,
                              burst_tokens=args.burst_output_len, inject_at=args.inject_at,
                              window=tuple(args.window), reference_runs=args.reference_runs)
    result.update(bench="burst", env=environment(llm) | {"spec": llm.engine.spec_stats()},
                  args=json_args(args))
    _print_burst(result)
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


def _print_burst(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"probe acceptance in output window {r['window']} ({r['probes']} probes)")
    for col in ("run", "acceptance", "first draft", "accepted/verify", "verify steps", "K hist"):
        t.add_column(col, justify="right")
    for name in ("reference", "after_burst", "reference_2"):
        w = r.get(name)
        if w:
            t.add_row(name, *(("-" if w[k] is None else f"{w[k]:.4f}") for k in
                              ("acceptance_rate", "first_draft_acceptance", "accepted_per_verify")),
                      str(w["verify_steps"]), str(w["k_hist"]))
    con = Console()
    con.print(t)
    b, c = r["burst"], r["comparison"]["acceptance_rate"]
    con.print(f"burst: {b.get('size')} requests at probe tokens {b.get('inject_tokens')}, over at "
              f"{b.get('end_tokens')}; probe steps at K=0 during it: {b.get('probe_steps_k0')} of "
              f"{b.get('probe_steps')} (max batch {b.get('max_batch')}); resumed at "
              f"{b.get('resumed_at_tokens')}")
    ck = r["comparison"]["acceptance_rate_k_matched"]
    con.print(f"acceptance after burst - reference: abs {fmt(c['abs_diff'])}, rel {fmt(c['rel_diff'])}"
              f"; K-matched: {fmt(ck['reference'])} vs {fmt(ck['after_burst'])}, rel "
              f"{fmt(ck['rel_diff'])}")
    sp = r["shared_positions"]
    con.print(f"same-position verify steps: {sp['steps']}, identical drafts {sp['identical_drafts']};"
              f" depth acceptance ref {fmt_list(r['reference']['depth_acceptance'])} after "
              f"{fmt_list(r['after_burst']['depth_acceptance'])}")
    tm = r["text_matched"]
    c, ck = tm["acceptance_rate"], tm["acceptance_rate_k_matched"]
    con.print(f"text-matched ({len(tm['probes'])} of {r['probes']} probes write the same text in "
              f"both runs): {fmt(c['reference'])} vs {fmt(c['after_burst'])}, rel {fmt(c['rel_diff'])};"
              f" K-matched {fmt(ck['reference'])} vs {fmt(ck['after_burst'])}, rel {fmt(ck['rel_diff'])}")
    con.print(f"checks: {r['checks']}")


def add_burst_args(p) -> None:
    from gearshift.engine_args import add_engine_args

    add_engine_args(p)
    p.set_defaults(speculative_algorithm="eagle3")
    p.add_argument("--probes", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128, help="probe prompt tokens")
    p.add_argument("--probe-tokens", type=int, default=576, help="max_tokens per probe")
    p.add_argument("--inject-at", type=int, default=64, help="probe tokens before the burst")
    p.add_argument("--burst-size", type=int, default=256)
    p.add_argument("--burst-input-len", type=int, default=128)
    p.add_argument("--burst-output-len", type=int, default=64)
    p.add_argument("--window", type=int_list, default=[320, 576], help="T1,T2: probe output positions")
    p.add_argument("--reference-runs", type=int, default=2, help="2: reference again after the burst")
    p.add_argument("--output-json", default="bench_burst.json")
