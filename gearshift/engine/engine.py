"""Engine: the step loop. Every mode (DECODE, EXTEND, mixed, VERIFY) takes one path:

    plan = scheduler.schedule()                  # pure CPU: who computes what, K per request,
                                                 # the draft's catch-up, sync / commit_first
    plan.layout = runner.layout(plan)            # its device shape (and CUDA graph)
    batch = builder.prepare(plan)                # exactly the slots the plan counts + tensors
    step = launch: runner.forward | spec.run     # on the device; VERIFY: draft -> target -> verify
    outputs = scheduler.commit(plan, result)     # keep / free slots by count, tokens, finishes

How it runs is the plan's: a plain step is overlapped (engine/overlap.py): step n+1 is
planned and launched while step n runs, and step n is committed once its tokens are read.
A VERIFY step needs every token on the host (drafting reads them): `commit_first` commits
the pending step before it, `sync` reads its result (one host sync) and commits it at once.
A plain step whose grammar masks need a token in flight commits first too, then overlaps.

Data flow: LLM / AsyncEngine -> Engine.add_request -> step() -> StepOutput per request.
Not thread-safe: one thread calls add_request, abort_request and step.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from gearshift.config import EngineConfig
from gearshift.engine.cost_feedback import CostFeedback
from gearshift.engine.gc_control import freeze_heap, thaw_heap
from gearshift.engine.logprob_outputs import attach as attach_logprobs
from gearshift.engine.overlap import PendingStep, TokenFeed
from gearshift.engine.seeds import draw_seed, mix_seed
from gearshift.engine.stats import StepStats, spec_stats
from gearshift.engine.step_trace import StepTrace
from gearshift.faults import RequestFault
from gearshift.forward_batch import ForwardMode
from gearshift.models.default import is_default_target
from gearshift.models.loader import resolve_model_config
from gearshift.models.parallel import TensorParallel
from gearshift.policy.base import Policy
from gearshift.request import Request, SamplingParams, SamplingParamsError
from gearshift.runner.batch import BatchBuilder
from gearshift.runner.model_runner import ModelRunner
from gearshift.runner.serving_watch import ServingWatch
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
from gearshift.scheduler.plan import StepPlan, StepResult
from gearshift.scheduler.prefix_cache import PrefixCache
from gearshift.scheduler.scheduler import Scheduler, StepOutput
from gearshift.structured.compiler import GrammarCompiler
from gearshift.tokenizer import eos_token_ids, load_engine_tokenizer

log = logging.getLogger("gearshift.engine")

__all__ = ["Engine", "PromptError", "StepOutput"]


class PromptError(ValueError):
    """A prompt the engine cannot serve; the message names the problem."""


class Engine:
    leads = True  # plans its own steps (a tensor-parallel follower replays rank 0's)

    def __init__(self, config: EngineConfig, tp: TensorParallel | None = None) -> None:
        thaw_heap()  # an earlier engine's frozen heap: its dropped cycles free their memory
        self.config = config
        self.model_config, path = resolve_model_config(config.model)
        self.model_name = Path(config.model).name if path else Path(config.model).stem
        if path is not None and is_default_target(str(path)):
            self.model_name = "gearshift-default"
        self.model_name = config.served_model_name or self.model_name
        self.tokenizer = load_engine_tokenizer(config, path)
        torch.manual_seed(config.seed)
        self.runner = ModelRunner(config, self.model_config, path, tp)
        self.max_model_len = self.runner.max_model_len
        self.eos_token_ids = eos_token_ids(self.model_config, path, self.tokenizer)
        # structured output: thread-safe (the server compiles requests' grammars off its loop)
        self.grammars = GrammarCompiler(self.tokenizer, self.model_config.vocab_size,
                                        self.eos_token_ids)
        self.slots = SlotPool(self.runner.num_slots,
                              PrefixCache() if config.enable_prefix_caching else None)
        self.rows = ReqRowPool(config.max_num_seqs)
        self.builder = BatchBuilder(self.slots, self.rows, self.runner.kv, self.runner.device)
        self.feed = TokenFeed(config.max_num_seqs + 1, self.runner.device)
        self.spec = None
        speculation = policy = None
        if config.speculative:
            from gearshift.speculative.runner import SpecRunner

            self.spec = SpecRunner(config, self.runner, self.builder, self.feed)
        profile = None
        if self.runner.kv_provisional:  # GPU: the largest steps' peak sizes the KV cache
            from gearshift.engine.memory_profile import profile_steps

            profile = profile_steps(self)
        self.runner.prepare_hot_path(self.spec.capture if self.spec else ())
        if self.spec is not None:
            speculation = self.spec.speculation()  # after the graphs exist (mixed steps)
            policy = self._create_policy()
        self.scheduler = Scheduler(
            self.slots, self.rows, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=self.max_model_len,
            speculation=speculation, policy=policy, overlap=config.overlap_schedule)
        self.overlap = config.overlap_schedule
        self.pending: PendingStep | None = None  # launched, tokens not read yet (overlap)
        self._read_device_ms: float | None = None  # the latest read step's device time
        self.costs = CostFeedback(self.scheduler, self.spec, self._num_graphs)
        self._seed_rng = torch.Generator().manual_seed(config.seed)
        self._emit = None  # step()'s early-output callback
        self.step_stats = StepStats()
        self.measured_costs: dict | None = None  # {gear: [[bs, ms]]}: the warm-up's step times
        if profile is not None:  # every graph captured once, then the cache sized and moved
            from gearshift.engine.memory_profile import size_kv

            size_kv(self, profile)
            self.runner.prepare_hot_path(self.spec.capture if self.spec else ())
        if self.spec is not None and config.spec_warmup and policy.drafts and self.leads:
            from gearshift.engine.warmup import warm_up_engine

            warm_up_engine(self, priced=policy.cost is not None)  # sets measured_costs
        if self.runner.memory_plan is not None:  # the profile's plan against the device now
            from gearshift.engine.memory_profile import after_start

            after_start(self)
        if config.gc_freeze or (config.gc_freeze is None and bool(self.runner.decode_sizes)):
            freeze_heap()  # collections skip the start-up heap: no 100 ms ones while serving
        self.watch = ServingWatch().start(self.runner)  # graphs / kernels the warm-up missed
        if config.step_trace:  # after the warm-up: its steps are not the run's
            self.step_stats.trace = StepTrace(config.step_trace, self.spec, self.watch)

    def resize_kv(self, num_slots: int) -> None:
        """Move to a KV cache of `num_slots` slots (the start-up memory profile; no request
        in flight, no graph captured): the target's and the draft's caches, the slot pool
        and the context limit."""
        self.runner.resize_kv(num_slots)
        if self.spec is not None:
            self.spec.proposer.resize_slots(num_slots)
        self.slots.reset(num_slots)
        self.max_model_len = self.scheduler.max_model_len = self.runner.max_model_len

    def _create_policy(self) -> Policy:
        """The policy that plans each step: config.spec_policy, priced by the step-time model
        (a tensor-parallel engine wraps it: distributed/engine.py)."""
        from gearshift.engine.cost_profile import build_cost_model
        from gearshift.policy import create_policy

        config, spec = self.config, self.spec
        return create_policy(
            config, lambda: build_cost_model(self.runner, config.num_draft_tokens,
                                             config.max_num_seqs, spec.draft_frac,
                                             spec.tree_nodes),
            pad=self.runner.decode_pad, verify_tokens=spec.verified_tokens)

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams) -> int:
        """Queue a request; -> the seed it samples with (params.seed, or one drawn now)."""
        n = len(prompt_token_ids)
        if n == 0:
            raise PromptError("the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise PromptError(f"prompt token id {bad[0]!r} is out of range [0, {vocab})")
        if params.top_k > vocab:
            raise SamplingParamsError(f"top_k ({params.top_k}) exceeds the vocabulary size {vocab}")
        bad = [t for t in params.stop_token_ids or () if t >= vocab]
        if bad:
            raise SamplingParamsError(f"stop_token_ids: {bad[0]} is out of range [0, {vocab})")
        bad = [t for t in params.logit_bias or () if t >= vocab]
        if bad:  # the sampler indexes the vocabulary with them
            raise SamplingParamsError(f"logit_bias: token id {bad[0]} is out of range [0, {vocab})")
        if n + params.max_tokens > self.max_model_len:
            raise PromptError(f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) exceeds "
                              f"the maximum context length {self.max_model_len}")
        so = params.structured_output  # an invalid one: StructuredOutputError names the field
        grammar = self.grammars.grammar(so) if so is not None else None
        seed = params.seed if params.seed is not None else draw_seed(self._seed_rng)
        self.scheduler.add(Request(
            request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params,
            sampling_seed=mix_seed(seed), eos_token_ids=self.eos_token_ids, grammar=grammar,
            coupled=(params.spec_sampling or self.config.spec_sampling) == "coupled",
            arrival_time=time.perf_counter()))
        return seed

    def abort_request(self, request_id: str, reason: str = "abort") -> None:
        self.scheduler.abort(request_id, reason)

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def policy(self):
        """The speculation policy planning each step (None without a draft)."""
        return self.scheduler.policy

    def set_policy(self, policy) -> None:
        """Plan later steps with `policy` (benches compare policies on one engine). A VERIFY
        step's cost still waiting to be observed goes to the policy that ran it. Under a
        policy that never drafts no target features are kept, so for EAGLE-3 one that
        drafts takes over only while no request runs (waiting ones may), and prefixes
        cached until then are dropped."""
        if self.spec is None:
            raise ValueError("set_policy needs an engine with speculative decoding configured")
        if policy.drafts and not self.scheduler.policy.drafts \
                and self.spec.proposer.needs_features:
            # a draft model catches up from tokens; EAGLE-3 would read features never kept
            if self.scheduler.running:
                raise ValueError("a policy that drafts can take over from one that never "
                                 "does only between requests (none running)")
            self.reset_prefix_cache()
        self.costs.flush()
        self.scheduler.set_policy(policy)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self.pending is not None

    def num_running(self) -> int:
        return len(self.scheduler.running)

    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # ------------------------------------------------------------------ the step
    def step(self, emit=None) -> list[StepOutput]:
        """Run one step; returns what the requests gained. With overlap scheduling (the
        default) a plain step returns the previous step's tokens: its own are read on the
        next call, while the device already runs the step after it. `emit(outputs)`: where
        a VERIFY step first commits the step before it (a prefill's first token, say), those
        outputs go out at once rather than after the VERIFY step."""
        t0 = time.perf_counter()
        plan = self._schedule()
        self._emit = emit
        outputs = plan.failed + self._run(plan, t0) if plan.failed else self._run(plan, t0)
        if self.step_stats.trace is not None and not self.has_unfinished_requests():
            self.step_stats.trace.flush()  # idle next: a server may end by a signal, no atexit
        return outputs

    def _schedule(self) -> StepPlan:
        plan = self.scheduler.schedule()
        if not plan.is_empty:
            plan.layout = self.runner.layout(plan)  # fixed with the plan: its device shape
        return plan

    def _run(self, plan: StepPlan, t0: float) -> list[StepOutput]:
        """The one step path; the plan says how it runs (scheduler.py, planning step 4):
        `commit_first`: the step in flight is committed before this one is built (drafting
        or grammar masks read its tokens), and requests that commit finishes keep their rows
        and slots until this step has launched (it was planned over them); `sync`: this
        step's tokens are read and committed before step() returns, else on the next call
        while the device runs the step after it (overlap)."""
        if plan.mode is not ForwardMode.VERIFY:
            self.costs.flush()  # a VERIFY step does it while its device work runs
        if plan.is_empty:
            return self._commit_pending()
        planning_s = time.perf_counter() - t0 if plan.sync else 0.0  # schedule(), the policy
        if not plan.commit_first:
            return self._launch_and_commit(plan, t0, planning_s, [])
        self.scheduler.hold_releases()
        try:
            return self._launch_and_commit(plan, t0, planning_s, self._commit_pending())
        finally:
            self.scheduler.release_held()

    def _launch_and_commit(self, plan: StepPlan, t0: float, planning_s: float,
                           early: list[StepOutput]) -> list[StepOutput]:
        """`early`: the outputs of the step before, committed first. A synchronous step's
        time is its planning (`planning_s`: nothing overlaps it) and itself, not the wait
        for the step before; an overlapped step's is that wait (observed only where the
        device runs a step as it is launched: else by its device time, once read)."""
        emitted: list[StepOutput] = []
        if plan.sync:
            if early and self._emit is not None:  # first tokens need not wait for this step
                self._emit(early)
                emitted, early = early, []
            t0 = time.perf_counter() - planning_s
        try:
            batch = self.builder.prepare(plan)  # laid out for plan.layout
        except RequestFault as fault:  # the step never ran: plan again without that request
            self.scheduler.unbook(plan)
            return early + [self._fail(fault)]
        step = self._launch(plan, batch, planning_s)
        if plan.sync:
            outputs = early + self._commit(step)
            device_ms, timed = self.runner.last_device_ms(), True
        else:
            outputs = early + self._commit_pending()
            self.pending = step
            device_ms, timed = self._read_device_ms, self.runner.runs_on_host
        self._account(plan, emitted + outputs, t0, device_ms, timed)
        return outputs

    def _launch(self, plan: StepPlan, batch, planning_s: float) -> PendingStep:
        """Put the step on the device; the draft does what the plan says of it (catch-up and
        proposal inside a VERIFY step, which reads its result; a plain step's tokens it
        follows behind the target's pass). A VERIFY step that fails keeps nothing: every
        slot it allocated goes back."""
        if plan.mode is ForwardMode.VERIFY:
            try:
                result = self.spec.run(plan, batch, before_sync=lambda: self._before_sync(plan),
                                       planning_s=planning_s)
            except BaseException:
                self.scheduler.commit(plan, StepResult(batch.slots, [[] for _ in plan.reqs],
                                                       kept=[[] for _ in plan.reqs]))
                raise
            return PendingStep(plan, batch.slots, None, None, None, batch.sampling.logprobs,
                               done=result)
        fb = batch.forward
        if any(r.num_pending > (p >= 0) for r, p in zip(plan.reqs, plan.placeholders)):
            fb.input_ids = self.feed.resolve_ids(fb.input_ids)  # earlier steps' tokens
        tokens, aux = self.runner.forward(batch)
        events = self.runner.last_events  # this step's; later calls record new ones
        if batch.sampling.logprobs is not None:  # copied behind the tokens, read with them
            batch.sampling.logprobs.start_copy()
        host, copied = self.feed.publish(plan.token_tag, tokens)
        if plan.draft_follows:  # the draft covers every committed token (placeholders
            self.spec.after_plain(plan, aux)  # resolved on the device), so K > 0 resumes
        return PendingStep(plan, batch.slots, host, copied, events, batch.sampling.logprobs)

    def _commit(self, step: PendingStep) -> list[StepOutput]:
        """A launched step's result onto its requests (waiting for its tokens alone); after
        a VERIFY step the draft moves on over what was kept."""
        result = step.result()
        outputs = self.scheduler.commit(step.plan, result)
        attach_logprobs(step.plan, step.logprobs, outputs)
        if step.done is not None:
            self.spec.after_commit(step.plan, result)
        return outputs

    def _fail(self, fault: RequestFault) -> StepOutput:
        log.error("request %s failed: %s", fault.req.request_id, fault.cause, exc_info=fault.cause)
        return self.scheduler.fail(fault.req, f"{type(fault.cause).__name__}: {fault.cause}")

    def _before_sync(self, plan: StepPlan) -> None:
        """Host work while a VERIFY step's device runs: the previous VERIFY step's cost, then
        the policy's scores for the next plan."""
        self.costs.flush()
        self.scheduler.prepare_next(plan)

    def _commit_pending(self) -> list[StepOutput]:
        pending, self.pending = self.pending, None
        if pending is None:
            return []
        outputs = self._commit(pending)
        self._read_device_ms = pending.device_ms()
        self.costs.after_read(pending.plan, self._read_device_ms)
        return outputs

    def _num_graphs(self) -> int:
        return len(getattr(self.runner.shape_graphs, "entries", ()))

    def _account(self, plan: StepPlan, outputs: list[StepOutput], t0: float,
                 device_ms: float | None, timed: bool = True) -> None:
        dt = time.perf_counter() - t0
        gear = self.spec.gear(plan) if self.spec is not None else 0
        self.step_stats.account(plan, outputs, dt, device_ms, gear)
        self.costs.after_step(plan, dt * 1e3, timed)

    # ------------------------------------------------------------------ introspection
    @property
    def last_step(self) -> dict:
        """mode, batch_size, num_tokens, time_s, device_ms and gear of the latest step."""
        return self.step_stats.last_step

    def counters(self) -> tuple:
        """What runs count (engine stats, graphed / eager steps, speculation's counters),
        for restore_counters (the start-up warm-up is not part of any run)."""
        return (dict(self.step_stats.counts), self.runner.step_counts.copy(),
                self.spec.acceptance.counters() if self.spec is not None else None)

    def restore_counters(self, saved: tuple) -> None:
        stats, steps, spec = saved
        self.step_stats.counts.clear()
        self.step_stats.counts.update(stats)
        self.runner.step_counts.clear()
        self.runner.step_counts.update(steps)
        if self.spec is not None:
            self.spec.acceptance.restore_counters(spec)

    def reset_prefix_cache(self) -> int:
        """Drop every cached prefix no running request holds; -> slots freed."""
        return self.slots.clear_cache()

    def prefix_cache_stats(self) -> dict:
        return self.slots.cache.stats() if self.slots.cache is not None else {}

    def memory_stats(self) -> dict:
        return self.slots.stats()

    def stats(self) -> dict:
        out = dict(self.step_stats.counts, preemptions=self.scheduler.num_preemptions,
                   running=self.num_running(), waiting=self.num_waiting())
        out["graphs"] = self.runner.graph_stats()  # graphed vs eager steps per mode
        out["late"] = self.watch.stats()  # captured / compiled after the warm-up
        if self.slots.cache is not None:
            out["prefix_cache"] = self.prefix_cache_stats()
        if self.spec is not None:
            out["spec"] = self.spec_stats()
        return out

    def spec_stats(self) -> dict:
        return spec_stats(self)

    def prefill_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits [len, vocab] of every prompt position in one EXTEND pass (oracle for tests).
        Uses a temporary row and slots, returned before it exits."""
        req = Request("__probe__", list(token_ids), SamplingParams(max_tokens=1), 0)
        plan = StepPlan(mode=ForwardMode.EXTEND)
        plan.add(req, len(token_ids))
        try:
            batch = self.builder.prepare(plan)
            return self.runner.forward(batch, all_logits=True)[0].cpu()
        finally:
            self.scheduler._release(req)

