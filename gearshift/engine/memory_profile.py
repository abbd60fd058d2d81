"""Start-up memory profile (GPU, without kv_cache_tokens): the engine is built on a small
provisional KV cache; the largest steps it can plan and every CUDA graph it will capture
run on that cache first, and what they took sizes the real cache from
gpu_memory_utilization x the card's memory (runner/memory_plan.py).

    ModelRunner (weights, provisional cache) -> SpecRunner (draft) ->
    profile_steps(engine), eagerly, before any graph:
        max_num_seqs requests whose prompts fill one prefill budget: the prefill step (the
        draft's pass over it included), then with speculation the tree (tree_width > 1)
        and the deepest chain, then a plain decode step; with speculation the same
        sampled, then nucleus; a hybrid's deepest suffix chains on up to DEEP_ROWS
        requests  -> activations: the peak above everything resident
    -> the engine captures its DECODE / EXTEND graphs, builds its scheduler ->
    size_kv(engine, profile): the capture pass: with speculation the warm-up's every shape
        (capture only, engine/warmup.py) -> graph pools (the reserved memory they keep)
        and the pass's peak of reserved memory (pools, eager steps and the allocator's
        fragmentation together: what the real warm-up will need); every graph dropped
        -> MemoryBudget -> plan_kv_slots -> Engine.resize_kv (the target's and the draft's
           caches, the slot pool); the start-up line says where the memory went
    -> Engine goes on: graphs captured on the real cache, the speculation warm-up;
       after_start(engine): what the device holds then, against the plan.

The capture pass costs start-up a second run of the graph captures; measuring only the
largest shapes missed what the warm-up's many smaller ones keep in the shared pool.
"""

from __future__ import annotations

import gc
import logging
import math
from dataclasses import dataclass

import torch

from gearshift.forward_batch import ForwardMode
from gearshift.policy.static import AlwaysPolicy, PlannedPolicy
from gearshift.request import Request, SamplingParams
from gearshift.runner.layout import DEEP_ROWS
from gearshift.runner.memory_plan import (
    GIB,
    KvPlan,
    MemoryBudget,
    generated_tokens,
    plan_kv_slots,
    profile_slots,
    prompt_len,
    provisional_slots,
)
from gearshift.runner.penalties import TokenCounts
from gearshift.scheduler.plan import StepPlan, StepResult
from gearshift.scheduler.scheduler import Scheduler

log = logging.getLogger("gearshift.runner")

# sampled sets: the draft expansions and verification of sampled requests (as warmup.py)
SAMPLED = {"sampled": dict(temperature=1.0, seed=0),
           "nucleus": dict(temperature=1.0, top_p=0.95, seed=0)}


class CudaMemory:
    """The device's memory counters the profile reads (a test passes a fake)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def settle(self) -> None:
        """Work finished, garbage collected, cached blocks back to the device."""
        torch.cuda.synchronize(self.device)
        gc.collect()
        torch.cuda.empty_cache()

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reserved(self) -> int:
        return torch.cuda.memory_reserved(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def peak_reserved(self) -> int:
        return torch.cuda.max_memory_reserved(self.device)

    def free_total(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info(self.device)


def _admit(engine, sched: Scheduler, name: str, params: SamplingParams,
           num_reqs: int | None) -> list[str]:
    cfg, vocab = engine.config, engine.model_config.vocab_size
    n = prompt_len(cfg, engine.runner.max_positions)
    ids = [f"__profile-{name}-{i}" for i in range(num_reqs or cfg.max_num_seqs)]
    for i, rid in enumerate(ids):
        sched.add(Request(rid, [(7 * i + j) % (vocab - 1) + 1 for j in range(n)], params,
                          sampling_seed=i, coupled=cfg.spec_sampling == "coupled"))
    return ids


def _step(engine, sched: Scheduler) -> StepPlan:
    """One synchronous step through the engine's pipeline (Engine._launch, then commit)."""
    runner, spec, builder = engine.runner, engine.spec, engine.builder
    plan = sched.schedule()
    if plan.is_empty:
        return plan
    plan.layout = runner.layout(plan)
    batch = builder.prepare(plan)
    if plan.mode is ForwardMode.VERIFY:
        result = spec.run(plan, batch)
        sched.commit(plan, result)
        spec.after_commit(plan, result)
        return plan
    tokens, aux = runner.forward(batch)
    sampled = tokens[: plan.batch_size].tolist()
    if plan.draft_follows:
        spec.after_plain(plan, aux)
    sched.commit(plan, StepResult(batch.slots, [[t] if s else [] for s, t in
                                                 zip(plan.sample, sampled)]))
    return plan


def _prefill(engine, sched: Scheduler) -> None:
    while sched.waiting or any(r.num_computed_tokens < len(r.prompt_token_ids)
                               for r in sched.running):
        _step(engine, sched)


def _drop(engine, sched: Scheduler, ids: list[str]) -> None:
    for rid in ids:
        sched.abort(rid)
    engine.slots.clear_cache()


def _gears(engine) -> list[AlwaysPolicy]:
    """The widest VERIFY steps: the tree (tree_width > 1), the deepest chain."""
    spec, k = engine.spec, engine.config.num_draft_tokens
    if spec is None:
        return []
    return ([AlwaysPolicy(k, spec.topk)] if spec.topk > 1 else []) + [AlwaysPolicy(k, 1)]


def run_largest_steps(engine, sched: Scheduler, mem: CudaMemory, num_reqs: int | None = None,
                      gears: list[AlwaysPolicy] | None = None
                      ) -> tuple[int, list[tuple[int, int]]]:
    """The profile's steps (module doc) on `sched` for `num_reqs` requests (max_num_seqs)
    and `gears` (_gears); -> (the highest allocation seen, (tokens, peak bytes above the
    memory allocated before it) of each VERIFY step)."""
    cfg, spec = engine.config, engine.spec
    gears = _gears(engine) if gears is None else gears
    verify, top = [], 0
    for name, extra in [("greedy", dict(temperature=0.0)),
                        *(SAMPLED.items() if spec is not None else ())]:
        if spec is not None:
            sched.set_policy(gears[0])  # drafts: the draft follows the prefill
        ids = _admit(engine, sched, name, SamplingParams(
            max_tokens=generated_tokens(cfg) + 4, ignore_eos=True, **extra), num_reqs)
        _prefill(engine, sched)
        for gear in gears:
            sched.set_policy(gear)
            top, base = max(top, mem.peak()), mem.allocated()
            mem.reset_peak()  # this step's own peak, for the VERIFY graphs' allowance
            plan = _step(engine, sched)
            if plan.mode is ForwardMode.VERIFY:
                verify.append((sum(plan.num_nodes), mem.peak() - base))
        if name == "greedy" and num_reqs is None:
            if spec is not None:
                sched.set_policy(AlwaysPolicy(0))
            _step(engine, sched)  # the largest plain decode step
        _drop(engine, sched, ids)
    return max(top, mem.peak()), verify


def _draft_bytes(engine) -> int:
    spec = engine.spec
    own = spec.proposer.weights() if spec else None
    if own is None:
        return 0
    target = {p.data_ptr() for p in engine.runner.model.parameters()}
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in own.parameters()
            if p.data_ptr() not in target}  # EAGLE-3 shares the target's embedding
    return sum(seen.values())


@dataclass
class StepProfile:
    """The eager pass's measurements (profile_steps), for size_kv."""

    mem: CudaMemory
    resident: int  # allocated before the profile's steps (weights, caches, buffers)
    activations: int  # the largest step's peak above `resident`
    before_graphs: int  # reserved once the eager pass settled: the capture pass's base
    saved: tuple  # the runner's step counts, the acceptance counters (restored after)


def _scheduler(engine) -> Scheduler:
    """A scheduler of the profile's own over the engine's pools (its steps are no run's)."""
    cfg, spec = engine.config, engine.spec
    return Scheduler(engine.slots, engine.rows, max_num_seqs=cfg.max_num_seqs,
                     max_num_batched_tokens=cfg.max_num_batched_tokens,
                     max_model_len=engine.runner.max_model_len,
                     speculation=spec.speculation() if spec is not None else None,
                     policy=AlwaysPolicy(0) if spec is not None else None, overlap=False)


def profile_steps(engine, mem: CudaMemory | None = None) -> StepProfile:
    """The eager pass (module doc) on the provisional cache, before any graph exists;
    the peak counters are then reset for the capture pass."""
    runner, spec = engine.runner, engine.spec
    mem = mem or CudaMemory(runner.device)
    saved = (runner.step_counts.copy(), spec.acceptance.counters() if spec else None)
    if spec is not None:  # the target's features for the draft, as once graphs exist
        runner.capture = spec.capture
    sched = _scheduler(engine)
    mem.settle()
    resident = mem.allocated()
    mem.reset_peak()
    top, _ = run_largest_steps(engine, sched, mem)  # (inference mode: as Engine.step)
    if spec is not None and spec.suffix_draft_tokens > spec.num_draft_tokens:
        n = min(engine.config.max_num_seqs, DEEP_ROWS)  # the deepest suffix chains' step
        deep = PlannedPolicy([spec.suffix_draft_tokens] * n, suffix=True)
        top = max(top, run_largest_steps(engine, sched, mem, n, [deep])[0])
    mem.settle()
    activations = max(top, mem.peak()) - resident
    before_graphs = mem.reserved()
    mem.reset_peak()
    return StepProfile(mem, resident, activations, before_graphs, saved)


def _capture_pass(engine, profile: StepProfile) -> tuple[int, int]:
    """Every graph the engine will capture, on the provisional cache: the DECODE / EXTEND
    graphs (already captured by the engine), then with speculation the warm-up's every
    shape, capture only. -> (graph pools: the reserved memory they keep, the pass's peak
    of reserved memory: pools, eager steps and the allocator's fragmentation at once),
    both above the eager pass's settled state; the graphs are dropped."""
    from gearshift.engine.warmup import warm_up_speculation

    mem, runner, spec = profile.mem, engine.runner, engine.spec
    if spec is not None and runner.tp is None:
        warm_up_speculation(engine, repeats=0, measure=False)
    elif spec is not None:  # ranks step in lockstep only on their own identical plans here
        sched = _scheduler(engine)
        run_largest_steps(engine, sched, mem)
        limit, nodes = runner.max_verify_graph_tokens, spec.nodes(engine.config.num_draft_tokens,
                                                                  spec.topk)
        graphed = [s for s in runner.decode_sizes if s * nodes <= limit]
        if spec.topk > 1 and engine.config.max_num_seqs * nodes > limit and graphed:
            run_largest_steps(engine, sched, mem, max(graphed), _gears(engine)[:1])
    peak = max(mem.peak_reserved(), mem.reserved()) - profile.before_graphs
    mem.settle()
    pools = max(mem.reserved() - profile.before_graphs, 0)
    runner.drop_graphs()
    mem.settle()
    kept = mem.reserved() - profile.before_graphs  # the decode workspace stays
    if kept > max(pools // 4, 256 * 2**20):
        log.warning("memory profile: %.2f GiB of the %.2f GiB the CUDA graphs took stayed "
                    "reserved after they were dropped", kept / GIB, pools / GIB)
    return pools, max(peak, pools)


def size_kv(engine, profile: StepProfile) -> KvPlan:
    """After the engine is built on the provisional cache (graphs captured, scheduler
    made): the capture pass, then the KV cache sized (module doc), reallocated and
    adopted by the engine; its graphs are captured again by the caller. -> the plan, also
    kept as runner.memory_plan and logged."""
    runner, cfg, spec, mem = engine.runner, engine.config, engine.spec, profile.mem
    graph_pools = warmup_peak = 0
    if runner.shape_graphs is not None:
        graph_pools, warmup_peak = _capture_pass(engine, profile)
    mem.settle()
    free, total = mem.free_total()
    outside = max(total - free - mem.reserved(), 0)
    held = mem.allocated()
    engine.resize_kv(0)
    mem.settle()
    kv_bytes = held - mem.allocated()
    weights, draft = runner.weights_bytes, _draft_bytes(engine)
    buffers = profile.resident - kv_bytes - weights - draft
    if runner._counts is None:  # penalties' counts: made at the first penalised request
        buffers += TokenCounts.nbytes(cfg.max_num_seqs + 1, engine.model_config.vocab_size)
    provisional = provisional_slots(cfg, runner.max_positions)
    budget = MemoryBudget(
        total=total, utilization=cfg.gpu_memory_utilization, weights=weights, draft=draft,
        buffers=max(buffers, 0), activations=profile.activations, graph_pools=graph_pools,
        warmup_peak=warmup_peak, outside_torch=outside,
        bytes_per_slot=math.ceil(kv_bytes / provisional),
        min_slots=profile_slots(cfg, runner.max_positions))
    plan = plan_kv_slots(budget)
    slots = plan.slots if runner.tp is None else runner.tp.comm.min_int(plan.slots)
    if slots != plan.slots:
        plan = KvPlan(budget, slots)
    engine.resize_kv(slots)
    runner.step_counts.clear()
    runner.step_counts.update(profile.saved[0])
    if spec is not None:
        spec.acceptance.restore_counters(profile.saved[1])
    runner.memory_plan = plan
    log.info("%s", plan.describe())
    return plan


def captures_graphs(config) -> bool:
    """Whether the runner captures CUDA graphs (ModelRunner.prepare_hot_path)."""
    return config.use_cuda_graphs and config.attention_backend == "triton"


def after_start(engine) -> dict | None:
    """Device memory once start-up is over (graphs captured, warm-up run) against the
    profile's plan, logged; -> the numbers in bytes (None: the cache was not profiled)."""
    plan, dev = engine.runner.memory_plan, engine.runner.device
    if plan is None or dev.type != "cuda":
        return None
    mem = CudaMemory(dev)
    mem.settle()
    free, total = mem.free_total()
    b = plan.budget
    out = dict(reserved=mem.reserved(), allocated=mem.allocated(), used=total - free,
               planned=b.usable - b.activations, activations=b.activations,
               graphs_planned=b.graph_pools,
               graphs=mem.reserved() - b.weights - b.draft - b.buffers - plan.kv_bytes)
    log.info("memory after start-up: %.2f GiB in use on the device, %.2f GiB planned before "
             "the activations peak (%.2f GiB); CUDA graphs and buffers made since the "
             "profile %.2f GiB (planned %.2f GiB)", out["used"] / GIB, out["planned"] / GIB,
             b.activations / GIB, out["graphs"] / GIB, b.graph_pools / GIB)
    if out["used"] + b.activations > total:
        log.warning("the largest step may not fit beside what start-up left: pass a smaller "
                    "--gpu-memory-utilization")
    return out
