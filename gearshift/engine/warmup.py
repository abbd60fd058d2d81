"""Speculation warm-up at start-up: every (padded batch size, K) a step can take is run
through the real step pipeline, so that

  * the CUDA graphs of speculative steps (draft expansion, target VERIFY, greedy
    verification, draft-extend over K+1 tokens) are captured before serving, not lazily
    in the middle of a run (a capture costs tens of milliseconds: a policy that explores
    or changes K would pay it while users wait), and
  * the goodput policy starts from measured step times t(K, padded batch): the wall time
    of real steps (host work, drafting, verification, commit) instead of a model of them.

    for bs in decode graph sizes (largest first), fitting the KV pool:
        bs dummy requests, short prompts -> prefill
        for gear in tree, num_draft .. 1, 0:  run `repeats` steps in that gear (the tree
                                 only when the engine verifies trees; gear num_draft + 1);
                                 the first may capture graphs, the others are timed
        K = max, 0, max:         untimed: the draft's catch-up shapes (a backlog of
                                 several rows, then of one: speculative/draft_follow.py)
        mixed K:                 untimed, one step per shape of chains of different K
                                 verified as one extend: each deepest K and token bucket
                                 bs * j, j = 2 .. K + 1 (graphs.mixed_verify_tokens)
        deep suffix chains:      a hybrid's, bs <= DEEP_ROWS: untimed, one step per deep
                                 depth and token bucket (deep_plans)
        abort them (slots and rows back to the pool)
        sampled, then nucleus:   bs sampled requests (top-p the second time), untimed, one
                                 step a gear: their draft expansions' graphs
    -> {gear: [(bs, ms)]} -> policy.cost.set_measured(...)

On a CPU (`warm_up_engine`), where there is no graph to capture, only the timed steps run,
at batch sizes up to CPU_MAX_BATCH, for a policy that prices gears (goodput). Proposers
that draft only where they find a match (suffix decoding) draft every planned node while
it runs (`Proposer.full_drafts`), so each K is captured and timed at its real size.

Counters (engine stats, speculation stats, the population's acceptance evidence, the
runner's graphed / eager step counts) are restored afterwards: the warm-up is not part of any run.
Data flow: Engine.__init__ -> warm_up_speculation(engine) -> CostModel.
"""

from __future__ import annotations

import logging
import statistics
import time
from contextlib import nullcontext

import torch

from gearshift.config import ConfigError
from gearshift.engine.cost_profile import profile_batch_sizes
from gearshift.engine.gc_control import gc_paused
from gearshift.policy.base import Policy
from gearshift.policy.static import AlwaysPolicy, PlannedPolicy
from gearshift.progress import progress
from gearshift.request import SamplingParams
from gearshift.runner.graphs import mixed_verify_tokens
from gearshift.runner.layout import DEEP_ROWS
from gearshift.runner.memory_plan import WARMUP_PROMPT_LEN as PROMPT_LEN
from gearshift.runner.memory_plan import warmup_generated

log = logging.getLogger("gearshift.speculative")



def _step_ms(engine, k: int, first: bool) -> float | None:
    """A VERIFY step's wall time (synchronous: host work included). A plain step overlaps
    with the next one's preparation, so its wall time is the wait for the step before it
    (noisy, nothing at all for the first one after a VERIFY step): take the device time of
    the step before, which the engine reads one step late."""
    if k:
        return engine.last_step["time_s"] * 1e3
    if first:
        return None
    return engine.last_step.get("device_ms") or engine.last_step["time_s"] * 1e3


def apply_measured(policy: Policy, measured: dict | None) -> None:
    """Give a cost-modelling policy (goodput) the warm-up's measured step times."""
    if policy.cost is not None and measured:
        for k, pts in measured.items():
            policy.cost.set_measured(k, pts)


# sampled requests expand their drafts on graphs of their own (per spec_sampling mode and
# whether top-k / top-p filter): warmed in the engine's mode, with and without the filter
SAMPLED = {"sampled": dict(temperature=1.0), "nucleus": dict(temperature=1.0, top_p=0.95)}


def _memory(engine) -> str:
    """Where the GPU's memory was when the warm-up ran out, for the start-up error."""
    device = engine.runner.device
    if device.type != "cuda":
        return ""
    gib = 2**30
    free, _ = torch.cuda.mem_get_info(device)
    return (f"; the KV cache's {engine.slots.total:,} slots allocated, PyTorch held "
            f"{torch.cuda.memory_reserved(device) / gib:.1f} GiB "
            f"({torch.cuda.memory_allocated(device) / gib:.1f} GiB in use), "
            f"{free / gib:.1f} GiB free")


def _admit(engine, bs: int, name: str, params: SamplingParams) -> list[str]:
    """bs dummy requests of PROMPT_LEN tokens, prefilled at K = 0. -> their ids."""
    ids = [f"__warmup-{name}-{bs}-{i}" for i in range(bs)]
    for i, rid in enumerate(ids):
        engine.add_request(rid, [(7 * i + j) % engine.model_config.vocab_size + 1
                                 for j in range(PROMPT_LEN)], params)
    engine.set_policy(AlwaysPolicy(0))
    sched = engine.scheduler
    while sched.waiting or any(r.num_computed_tokens < len(r.prompt_token_ids)
                               for r in sched.running):
        engine.step()
    return ids


def _keep_room(engine, ids: list[str], bs: int, name: str, params: SamplingParams,
               need: int) -> list[str]:
    """The dummy batch, admitted afresh when a request has fewer than `need` tokens left to
    generate: a deep draft's warm-up outgrows a short context (max_model_len), and a request
    near its end would make the scheduler plan a shorter K than the shape being warmed."""
    sched = engine.scheduler
    if len(sched.running) == bs and all(
            r.params.max_tokens - len(r.output_token_ids) >= need for r in sched.running):
        return ids
    policy = sched.policy
    _drop(engine, ids)
    ids = _admit(engine, bs, name, params)
    engine.set_policy(policy)
    return ids


def _drop(engine, ids: list[str]) -> None:
    """Abort the dummy requests: their slots and rows back to the pool."""
    for rid in ids:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()


def mixed_plans(bs: int, num_draft: int) -> list[list[int]]:
    """K per request of `bs` requests for every mixed graph shape: each deepest K (the
    draft's depth, greedy verification's width) and token bucket bs * j it reaches (j = 2
    .. K + 1): bs * (j - 1) - 1 drafts, deepest first, so the chains differ."""
    plans = []
    for depth in range(1, num_draft + 1) if bs > 1 else ():
        for j in range(2, depth + 2):
            q, r = divmod(bs * (j - 1) - 1, depth)
            if q:
                plans.append(([depth] * q + [r] + [0] * bs)[:bs])
    return plans


def deep_plans(bs: int, k: int, depths: tuple[int, ...], per_row: tuple[int, ...], cap: int,
               split: bool) -> list[list[int]]:
    """K per request of `bs` requests for every graph shape of a hybrid's suffix chains past
    the model's K: each deep depth D (greedy verification's and the draft follow-up's width
    D + 1; split-K: the tree pass's too) and, verified as one extend, each token bucket bs * j
    (j of `per_row`; those past K + 1 at the first depth that reaches them) that chains whose
    deepest lies in (the depth below, D] reach within `cap` tokens: as many as fit it."""
    plans, seen, low = [], set(range(2, k + 2)), k
    for d in depths:
        mine = []
        for j in () if split else per_row:
            drafts = min(bs * (j - 1) - 1, bs * d, cap - bs)
            if drafts <= low or (j in seen and mine) or \
                    mixed_verify_tokens(bs, bs + drafts, per_row) != bs * j:
                continue
            first = min(d, drafts)
            q, r = divmod(drafts - first, d)
            mine.append(([first] + [d] * q + [r] + [0] * bs)[:bs])
            seen.add(j)
        plans += mine or [([d] + [0] * bs)[:bs]]
        low = d
    return plans


# A CPU measures its batch sizes up to this one at start-up (a few steps each: about a
# second on the embedded model); larger ones keep the prior's shape at the measured level
# until real steps price them (CostModel.set_measured)
CPU_MAX_BATCH = 8


def warm_up_engine(engine, priced: bool) -> dict:
    """The start-up warm-up this engine's device needs. With CUDA graphs: every speculative
    step shape (graphs, then costs). Where the device runs on the host (a CPU, one rank):
    if `priced` (the policy prices gears), the timed steps of the smallest batch sizes.
    -> what was measured ({} when nothing ran)."""
    runner = engine.runner
    if runner.shape_graphs is not None:
        return warm_up_speculation(engine)
    if priced and runner.runs_on_host and runner.tp is None:
        sizes = [s for s in profile_batch_sizes(engine.config.max_num_seqs) if s <= CPU_MAX_BATCH]
        return warm_up_speculation(engine, sizes, repeats=2, capture=False)
    return {}


def warm_up_speculation(engine, sizes: list[int] | None = None, repeats: int = 3,
                        capture: bool = True, measure: bool = True) -> dict:
    """Run the warm-up (see module doc); -> {gear: [[bs, median ms], ...]} measured.
    `capture=False` (no graphs to capture: a CPU): the timed steps alone. `measure=False`
    (the start-up memory profile's capture pass, with repeats=0): every shape once, the
    policy's costs untouched."""
    spec, sched = engine.spec, engine.scheduler
    num_draft = engine.config.num_draft_tokens  # the configured draft depth
    tree = spec.topk > 1  # gear num_draft + 1: the tree; chains by AlwaysPolicy(K, topk=1)
    if sizes is None:
        sizes = list(engine.runner.decode_sizes)  # the decode graphs' batch sizes
    # tokens a request commits (with graphs, the untimed steps' too; at most what the
    # context holds: past it, _keep_room admits the batch again), plus one VERIFY step's
    # node and scratch slots
    generated = min(warmup_generated(num_draft, tree, repeats, capture),
                    engine.max_model_len - PROMPT_LEN - 1)
    runner = engine.runner
    deepest = max(runner.deep_depths, default=0) if capture else 0  # a hybrid's suffix chains
    per_request = PROMPT_LEN + generated + max(spec.slots_needed(num_draft, spec.topk),
                                               spec.nodes(deepest, 1))  # (suffix: no scratch)
    sizes = [s for s in sizes if s <= engine.config.max_num_seqs
             and s * per_request <= engine.slots.num_free]
    if not sizes or engine.has_unfinished_requests():
        return {}
    # K = max .. 1 (timed), K = 0 (timed; the draft falls behind), then untimed steps whose
    # catch-ups use the other draft-extend shapes: a backlog of several rows, then of one
    # (each timed K starts with one untimed step; the table is a prior that the first
    # online observation replaces, so one pass suffices)
    schedule = [*((k, repeats + 1, True) for k in range(num_draft + tree, 0, -1)),
                (0, repeats + 2, True)]
    if capture:
        schedule += [(num_draft, 1, False), (0, 1, False), (num_draft, 1, False)]

    def gear(k: int) -> AlwaysPolicy:  # gear num_draft + 1: the tree
        return AlwaysPolicy(min(k, num_draft), spec.topk if k > num_draft else 1)

    t0 = time.perf_counter()
    # counters, incl. the population's acceptance evidence: dummy prompts are no evidence
    saved_policy, saved_counters = sched.policy, engine.counters()
    measured: dict[int, list[list[float]]] = {k: [] for k in range(num_draft + 1 + tree)}
    params = SamplingParams(max_tokens=generated + 1, temperature=0.0, ignore_eos=True)
    need = num_draft + 2  # a step's tokens at most (K + 1) and the one that ends a request
    watch = getattr(engine, "watch", None)  # set: a warm-up after the engine's own (a bench's)
    # a collection inside a timed step is not that gear's cost, nor its captures late ones
    with gc_paused(), watch.paused() if watch is not None else nullcontext():
        try:
            spec.proposer.full_drafts = True  # a model-free proposer drafts every planned node
            for bs in progress(sorted(sizes, reverse=True), desc="speculation warm-up",
                               unit="batch size"):  # largest first: smaller graphs reuse its pool
                phase = "greedy, the prefill"
                ids = _admit(engine, bs, "greedy", params)
                for k, n, timed in schedule:
                    phase = f"greedy, K = {k}" if k <= num_draft else "greedy, the tree"
                    engine.set_policy(gear(k))
                    times = []
                    for i in range(n):
                        ids = _keep_room(engine, ids, bs, "greedy", params, need)
                        seen = engine._num_graphs()
                        engine.step()
                        if engine._num_graphs() == seen and len(sched.running) == bs and i:
                            times.append(_step_ms(engine, min(k, num_draft), first=i == 1))
                    times = [t for t in times if t is not None]
                    if timed and times:
                        measured[k].append([float(bs), statistics.median(times)])
                mixed = capture and not spec.split_k_chains(bs)
                for ks in mixed_plans(bs, num_draft) if mixed else []:
                    phase = "greedy, a K per request"
                    engine.set_policy(PlannedPolicy(ks))
                    ids = _keep_room(engine, ids, bs, "greedy", params, need)
                    engine.step()
                deep = deep_plans(bs, num_draft, runner.deep_depths, runner.verify_per_row,
                                  spec.max_verify_tokens(), not mixed) \
                    if deepest and bs <= DEEP_ROWS else []
                for ks in deep:
                    phase = f"greedy, suffix chains of K = {max(ks)}"
                    engine.set_policy(PlannedPolicy(ks, suffix=True))
                    ids = _keep_room(engine, ids, bs, "greedy", params, deepest + 2)
                    engine.step()
                _drop(engine, ids)
                for name, sampled in SAMPLED.items() if capture else ():  # their draft
                    # expansions' graphs, one step a gear
                    phase = f"{name}, the prefill"
                    sampled_params = SamplingParams(max_tokens=generated + 1, ignore_eos=True,
                                                    seed=0, **sampled)
                    ids = _admit(engine, bs, name, sampled_params)
                    for k in range(num_draft + tree, 0, -1):
                        phase = f"{name}, K = {k}" if k <= num_draft else f"{name}, the tree"
                        engine.set_policy(gear(k))
                        ids = _keep_room(engine, ids, bs, name, sampled_params, need)
                        engine.step()
                    _drop(engine, ids)
        except torch.OutOfMemoryError as e:  # a start-up error the user can act on
            raise ConfigError(
                f"the GPU ran out of memory in the speculation warm-up at {bs} requests a "
                f"step ({phase}{_memory(engine)}); pass a smaller --max-num-seqs, "
                "--gpu-memory-utilization (the share of the GPU's memory the engine may use) or "
                "--kv-cache-tokens") from e
        finally:
            spec.proposer.full_drafts = False
            engine.set_policy(saved_policy)
            engine.reset_prefix_cache()  # its dummy prompts are nobody's prefix
            engine.restore_counters(saved_counters)
    if not measure:
        log.info("memory profile: %d batch sizes x K 0..%d%s captured in %.1fs (%d graphs)",
                 len(sizes), num_draft, " + tree" if tree else "", time.perf_counter() - t0,
                 engine._num_graphs())
        return {}
    measured = {k: sorted(pts) for k, pts in measured.items() if pts}
    engine.measured_costs = measured
    apply_measured(sched.policy, measured)
    log.info("speculation warm-up: %d batch sizes x K 0..%d%s in %.1fs (%d graphs)", len(sizes),
             num_draft, " + tree" if tree else "", time.perf_counter() - t0, engine._num_graphs())
    return measured
