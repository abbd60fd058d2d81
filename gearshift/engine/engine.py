"""Engine: the step loop. Every mode (DECODE, EXTEND, mixed, VERIFY) takes one pipeline:

    plan = scheduler.schedule()                  # pure CPU: who computes what, K per request
    plan.layout = runner.layout(plan)            # its device shape (and CUDA graph)
    batch = builder.prepare(plan)                # exactly the slots the plan counts + tensors
    result = runner.forward(batch) | spec.run(...)  # on the device; VERIFY: draft -> target -> verify
    outputs = scheduler.commit(plan, result)     # keep / free slots by count, tokens, finishes

Plain steps are overlapped (engine/overlap.py): step n+1 is planned and launched while
step n runs, and step n is committed once its tokens are read. A VERIFY step needs every
token on the host (drafting reads them): it commits the pending step first and runs
synchronously, with one host sync.

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
from gearshift.engine.gc_control import freeze_heap
from gearshift.engine.logprob_outputs import attach as attach_logprobs
from gearshift.engine.overlap import PendingStep, TokenFeed
from gearshift.engine.seeds import draw_seed, mix_seed
from gearshift.engine.stats import StepStats, spec_stats
from gearshift.engine.step_trace import StepTrace
from gearshift.engine.tokenizer import eos_token_ids, load_engine_tokenizer
from gearshift.faults import RequestFault
from gearshift.forward_batch import ForwardMode
from gearshift.models.default import is_default_target
from gearshift.models.loader import resolve_model_config
from gearshift.models.parallel import TensorParallel
from gearshift.request import Request, SamplingParams, SamplingParamsError
from gearshift.runner.batch import BatchBuilder
from gearshift.runner.model_runner import ModelRunner
from gearshift.runner.serving_watch import ServingWatch
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
from gearshift.scheduler.plan import StepPlan, StepResult
from gearshift.scheduler.prefix_cache import PrefixCache
from gearshift.scheduler.scheduler import Scheduler, StepOutput
from gearshift.structured.compiler import GrammarCompiler

log = logging.getLogger("gearshift.engine")

__all__ = ["Engine", "PromptError", "StepOutput"]


class PromptError(ValueError):
    """A prompt the engine cannot serve; the message names the problem."""


class Engine:
    leads = True  # plans its own steps (a tensor-parallel follower replays rank 0's)

    def __init__(self, config: EngineConfig, tp: TensorParallel | None = None) -> None:
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
        self.runner.prepare_hot_path(self.spec.capture if self.spec else ())
        if self.spec is not None:
            from gearshift.engine.cost_profile import build_cost_model
            from gearshift.policy import create_policy

            speculation = self.spec.speculation()  # after the graphs exist (mixed steps)
            policy = create_policy(
                config, lambda: build_cost_model(self.runner, config.num_draft_tokens,
                                                 config.max_num_seqs, self.spec.draft_frac,
                                                 self.spec.tree_nodes),
                pad=self.runner.decode_pad, verify_tokens=self.spec.verified_tokens)
        self.scheduler = Scheduler(
            self.slots, self.rows, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=self.max_model_len,
            speculation=speculation, policy=policy)
        self.overlap = config.overlap_schedule
        self.pending: PendingStep | None = None  # launched, tokens not read yet (overlap)
        self._read_device_ms: float | None = None  # the latest read step's device time
        self.costs = CostFeedback(self.scheduler, self.spec, self._num_graphs)
        self._seed_rng = torch.Generator().manual_seed(config.seed)
        self._emit = None  # step()'s early-output callback
        self.step_stats = StepStats()
        self.measured_costs: dict | None = None  # {gear: [[bs, ms]]}: the warm-up's step times
        if self.spec is not None and config.spec_warmup and policy.drafts and self.leads:
            from gearshift.engine.warmup import warm_up_engine

            warm_up_engine(self, priced=policy.cost is not None)  # sets measured_costs
        if config.gc_freeze or (config.gc_freeze is None and bool(self.runner.decode_sizes)):
            freeze_heap()  # collections skip the start-up heap: no 100 ms ones while serving
        self.watch = ServingWatch().start(self.runner)  # graphs / kernels the warm-up missed
        if config.step_trace:  # after the warm-up: its steps are not the run's
            self.step_stats.trace = StepTrace(config.step_trace, self.spec, self.watch)

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
        if plan.mode is not ForwardMode.VERIFY or plan.is_empty:
            self.costs.flush()  # a VERIFY step does it while its device work runs
        if plan.is_empty:
            return self._commit_pending()
        if plan.mode is ForwardMode.VERIFY:
            return self._verify(plan, time.perf_counter() - t0)
        if self.pending is not None and any(
                r.grammar is not None and r.num_pending > (p >= 0)
                for r, p in zip(plan.reqs, plan.placeholders)):
            return self._commit_first(plan, t0)
        return self._plain(plan, t0)

    def _commit_first(self, plan: StepPlan, t0: float) -> list[StepOutput]:
        """Grammar masks need the token in flight: commit its step first (as before a VERIFY
        step); its finished requests keep their rows and slots until this step launched."""
        self.scheduler.hold_releases()
        try:
            return self._plain(plan, t0, self._commit_pending())
        finally:
            self.scheduler.release_held()

    def _plain(self, plan: StepPlan, t0: float, early: list[StepOutput] | None = None
               ) -> list[StepOutput]:
        """A DECODE / EXTEND step; `early`: outputs of the pending step committed already."""
        early = early or []
        try:
            batch = self.builder.prepare(plan)  # laid out for plan.layout
        except RequestFault as fault:  # the step never ran: plan again without that request
            self.scheduler.unbook(plan)
            return early + [self._fail(fault)]
        fb = batch.forward
        if any(r.num_pending > (p >= 0) for r, p in zip(plan.reqs, plan.placeholders)):
            fb.input_ids = self.feed.resolve_ids(fb.input_ids)  # earlier steps' tokens
        tokens, aux = self.runner.forward(batch)
        events = self.runner.last_events  # this step's; later calls record new ones
        if batch.sampling.logprobs is not None:  # copied behind the tokens, read with them
            batch.sampling.logprobs.start_copy()
        if not self.overlap:
            sampled = tokens[: plan.batch_size].tolist()  # the step's one sync
            if self._draft_follows():  # the draft follows every committed token, at any K
                self.spec.after_plain(plan, aux)  # (before commit releases finished ones)
            outputs = self.scheduler.commit(plan, StepResult(batch.slots, _tokens(plan, sampled)))
            attach_logprobs(plan, batch.sampling.logprobs, outputs)
            self._account(plan, outputs, t0, self.runner.last_device_ms())
            return outputs
        host, copied = self.feed.publish(plan.token_tag, tokens)
        if self._draft_follows():  # on the device (placeholders resolved there)
            self.spec.after_plain(plan, aux)
        outputs = early + self._commit_pending()
        self.pending = PendingStep(plan, batch.slots, host, copied, events,
                                   batch.sampling.logprobs)
        # its wall time is the wait for the step before, unless the work ran as launched
        self._account(plan, outputs, t0, self._read_device_ms, timed=self.runner.runs_on_host)
        return outputs

    def _verify(self, plan: StepPlan, planning_s: float) -> list[StepOutput]:
        """A VERIFY step: the pending step is committed first, keeping the rows and slots of
        requests it finishes until this step has run (they are in the plan; commit drops
        their results). Its time: planning (`planning_s`, schedule() with the policy:
        nothing overlaps it in a synchronous step) and the step itself, not the wait for
        the step before. A step that fails before its commit keeps nothing: every slot it
        allocated goes back."""
        self.scheduler.hold_releases()
        emitted: list[StepOutput] = []
        try:
            outputs = self._commit_pending()
            if outputs and self._emit is not None:  # first tokens need not wait for drafting
                self._emit(outputs)
                emitted, outputs = outputs, []
            t0 = time.perf_counter() - planning_s
            try:
                batch = self.builder.prepare(plan)
            except RequestFault as fault:
                return outputs + [self._fail(fault)]
            try:
                result = self.spec.run(plan, batch, before_sync=lambda: self._before_sync(plan),
                                       planning_s=planning_s)
            except BaseException:
                self.scheduler.commit(plan, StepResult(batch.slots, [[] for _ in plan.reqs],
                                                       kept=[[] for _ in plan.reqs]))
                raise
            step_outputs = self.scheduler.commit(plan, result)
            attach_logprobs(plan, batch.sampling.logprobs, step_outputs)
            outputs += step_outputs
            self.spec.after_commit(plan, result)
        finally:
            self.scheduler.release_held()
        self._account(plan, emitted + outputs, t0, self.runner.last_device_ms())
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
        sampled = pending.tokens()
        outputs = self.scheduler.commit(pending.plan,
                                        StepResult(pending.slots, _tokens(pending.plan, sampled)))
        attach_logprobs(pending.plan, pending.logprobs, outputs)
        self._read_device_ms = pending.device_ms()
        self.costs.after_read(pending.plan, self._read_device_ms)
        return outputs

    def _draft_follows(self) -> bool:
        """The draft covers every committed token (so speculation resumes at full acceptance)
        unless the policy never speculates."""
        return self.spec is not None and self.scheduler.policy.drafts

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


def _tokens(plan: StepPlan, sampled: list[int]) -> list[list[int]]:
    """A plain step's tokens per request: its sample where the plan samples."""
    return [[tok] if smp else [] for smp, tok in zip(plan.sample, sampled)]


