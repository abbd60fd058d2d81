"""Engine: the step loop. One step reads in four lines:

    plan = scheduler.schedule()                  # pure CPU: who computes what
    fb, sb = builder.prepare(plan, padding)      # slots + device tensors for exactly this plan
    tokens = runner.run(fb, sb)                  # on the device, no host sync
    outputs = scheduler.commit(plan, tokens)     # or, overlapped: advance now, resolve next call

With overlap scheduling (engine/overlap.py) the host plans step n+1 while step n runs.

Data flow: LLM / AsyncEngine -> Engine.add_request -> step() -> StepOutput per request.
Not thread-safe: one thread calls add_request, abort_request and step.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from gearshift.config import EngineConfig
from gearshift.engine.gc_control import freeze_heap
from gearshift.engine.overlap import PendingStep, TokenFeed
from gearshift.forward_batch import ForwardMode
from gearshift.models.default import DEFAULT_MODEL_DIR
from gearshift.models.loader import resolve_model_config
from gearshift.request import Request, SamplingParams
from gearshift.runner.batch import BatchBuilder
from gearshift.runner.model_runner import ModelRunner
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
from gearshift.scheduler.plan import StepPlan
from gearshift.scheduler.scheduler import Scheduler, StepOutput

log = logging.getLogger("gearshift.engine")

__all__ = ["Engine", "PromptError", "StepOutput"]


class PromptError(ValueError):
    """A prompt the engine cannot serve; the message names the problem."""


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_config, path = resolve_model_config(config.model)
        self.model_name = Path(config.model).name if path else Path(config.model).stem
        if path is not None and path.resolve() == DEFAULT_MODEL_DIR.resolve() / "target":
            self.model_name = "gearshift-default"
        self.tokenizer = load_tokenizer(path) if path else None
        torch.manual_seed(config.seed)
        self.runner = ModelRunner(config, self.model_config, path)
        self.max_model_len = self.runner.max_model_len
        self.eos_token_ids = eos_token_ids(self.model_config, path, self.tokenizer)
        self.slots = SlotPool(self.runner.num_slots)
        self.rows = ReqRowPool(config.max_num_seqs)
        self.scheduler = Scheduler(
            self.slots, self.rows, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=self.max_model_len,
        )
        self.builder = BatchBuilder(self.slots, self.rows, self.runner.kv, self.runner.device)
        self.spec = None
        if config.speculative:
            from gearshift.policy import create_policy
            from gearshift.policy.profile import build_cost_model
            from gearshift.speculative.worker import SpecWorker

            self.spec = SpecWorker(config, self.runner, self.slots, self.builder)
            self.scheduler.policy = create_policy(
                config, lambda: build_cost_model(self.runner, config.num_draft_tokens,
                                                 config.max_num_seqs, self.spec.draft_frac,
                                                 self.spec.tree_nodes),
                pad=self.runner.decode_pad)
            self.scheduler.max_draft_len = config.num_draft_tokens
            self.scheduler.spec_slots = self.spec.slots_needed
            self.scheduler.population = self.spec.population
            self.scheduler.tree_population = self.spec.tree_population
            self.scheduler.draft_topk = config.draft_topk
            self.scheduler.draft_catches_up = self.spec.proposer.keeps_state
        self.runner.prepare_hot_path(self.spec.capture if self.spec else ())
        if self.spec is not None:
            # prefill chunks ride in a chain's causal verify pass (riders need causal
            # extend), but not with CUDA graphs: that pass is eager, while a step with a
            # prefill chunk is a graphed mixed EXTEND step, its decoders at K = 0
            self.scheduler.spec_mixed = config.draft_topk == 1 and self.runner.shape_graphs is None
        self.overlap = config.overlap_schedule
        self.feed = TokenFeed(config.max_num_seqs + 1, self.runner.device)
        self.pending: PendingStep | None = None  # launched, tokens not read yet (overlap)
        self._resolved_device_ms: float | None = None
        self._graphs_seen = self._num_graphs()  # lazily captured graphs so far
        if self.spec is not None:
            self.spec.follow.feed = self.feed
        self._seed_rng = torch.Generator().manual_seed(config.seed)
        self._stats = {"steps": 0, "decode_steps": 0, "extend_steps": 0, "verify_steps": 0,
                       "tokens_computed": 0,
                       "tokens_generated": 0, "step_time_s": 0.0}
        self.last_step: dict = {}  # mode, batch_size, num_tokens, time_s of the latest step
        self._deferred_observation: tuple | None = None  # (policy, plan, gear, ms) to observe
        self.scheduler.on_prepare = self._flush_observation
        if (self.spec is not None and config.spec_warmup and config.spec_policy != "off"
                and self.runner.shape_graphs is not None):
            from gearshift.speculative.warmup import warm_up_speculation

            warm_up_speculation(self)
        if config.gc_freeze or (config.gc_freeze is None and self.runner.graphs is not None):
            # later collections skip the start-up heap (model, libraries, graphs): no
            # 100 ms full collections at random steps while serving
            freeze_heap()

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams) -> None:
        n = len(prompt_token_ids)
        if n == 0:
            raise PromptError("the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise PromptError(f"prompt token id {bad[0]!r} is out of range [0, {vocab})")
        if n + params.max_tokens > self.max_model_len:
            raise PromptError(
                f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) exceeds the maximum "
                f"context length {self.max_model_len}"
            )
        seed = params.seed
        if seed is None:
            seed = int(torch.randint(0, 2**31, (1,), generator=self._seed_rng))
        self.scheduler.add(Request(
            request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params,
            sampling_seed=_mix_seed(seed), eos_token_ids=self.eos_token_ids,
        ))

    def abort_request(self, request_id: str, reason: str = "abort") -> None:
        self.scheduler.abort(request_id, reason)

    @property
    def policy(self):
        """The speculation policy planning each step (None without a draft)."""
        return self.scheduler.policy

    def set_policy(self, policy) -> None:
        """Plan later steps with `policy` (benches compare policies on one engine). A VERIFY
        step's cost still waiting to be observed goes to the policy that ran it."""
        if self.spec is None:
            raise ValueError("set_policy needs an engine with speculative decoding configured")
        self._flush_observation()
        self.scheduler.policy = policy

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self.pending is not None

    def num_running(self) -> int:
        return len(self.scheduler.running)

    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # ------------------------------------------------------------------ the step
    def step(self) -> list[StepOutput]:
        """Run one step; returns what the requests gained. With overlap scheduling (the
        default) a plain step returns the previous step's tokens: its own are read on the
        next call, while the device already runs the step after it."""
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        if plan.mode is not ForwardMode.VERIFY or plan.is_empty:
            self._flush_observation()  # a VERIFY step does it while its device work runs
        if plan.is_empty:
            return self._resolve_pending()
        if plan.mode is ForwardMode.VERIFY:
            return self._verify(plan, time.perf_counter() - t0)
        fb, sb = self.builder.prepare(plan, self.runner.padding(plan))  # the graph's shape
        if any(r.num_pending for r in plan.reqs):
            fb.input_ids = self.feed.resolve_ids(fb.input_ids)
        tokens, aux = self.runner.run(fb, sb)
        events = self.runner.last_events  # this step's; later calls record new ones
        if not self.overlap:
            outputs = self.scheduler.commit(plan, tokens[: plan.batch_size].tolist())  # 1 sync
            if self._draft_follows():  # the draft follows every committed token, at any K
                self.spec.draft_extend_after(plan, aux)
            self._account(plan, outputs, time.perf_counter() - t0, self.runner.last_device_ms())
            self._observe(plan)
            return outputs
        tag = self.feed.tag()
        host, copied = self.feed.publish(fb.req_pool_indices[: tokens.shape[0]], tokens)
        rows = self.scheduler.advance(plan, tag)
        if self._draft_follows():  # on the device (placeholders resolved there)
            self.spec.draft_extend_after(plan, aux)
        outputs = self._resolve_pending()
        self.pending = PendingStep(plan, rows, host, copied, events)
        self._account(plan, outputs, time.perf_counter() - t0, self._resolved_device_ms)
        self._observe(plan, timed=False)  # its device time is observed once resolved
        return outputs

    def counters(self) -> tuple:
        """What runs count (engine stats, graphed / eager steps, speculation's counters),
        for restore_counters (the start-up warm-up is not part of any run)."""
        return (dict(self._stats), self.runner.step_counts.copy(),
                self.spec.counters() if self.spec is not None else None)

    def restore_counters(self, saved: tuple) -> None:
        stats, steps, spec = saved
        self._stats.clear()
        self._stats.update(stats)
        self.runner.step_counts.clear()
        self.runner.step_counts.update(steps)
        if self.spec is not None:
            self.spec.restore_counters(spec)

    def _draft_follows(self) -> bool:
        """The draft covers every committed token (so speculation resumes at full acceptance)
        unless the policy never speculates."""
        return self.spec is not None and self.scheduler.policy.drafts

    def _verify(self, plan: StepPlan, planning_s: float) -> list[StepOutput]:
        """A VERIFY step needs every token on the host (drafting reads them): resolve the
        pending step first, keeping the rows and slots of requests it finishes until this
        step has run (they are in the plan; their results are dropped at commit).
        Its time: planning (`planning_s`, schedule() with the policy: nothing overlaps it
        in a synchronous step) and the step itself, not the wait for the step before."""
        self.scheduler.held = []
        try:
            outputs = self._resolve_pending()
            t0 = time.perf_counter()
            outputs += self.spec.verify_step(plan, self.scheduler)
        finally:
            self.scheduler.release_held()
        self._account(plan, outputs, planning_s + time.perf_counter() - t0,
                      self.runner.last_device_ms())
        self._observe(plan)
        return outputs

    def _resolve_pending(self) -> list[StepOutput]:
        pending, self.pending = self.pending, None
        if pending is None:
            return []
        outputs = self.scheduler.resolve(pending.plan, pending.rows, pending.tokens())
        self._resolved_device_ms = ms = pending.device_ms()
        if self.spec is not None and ms and pending.plan.mode is ForwardMode.DECODE:
            # an overlapped step's wall time is the wait for the step before it (an EXTEND
            # step's, say): its cost is its device time (host work hides behind the device)
            self._observe_cost(pending.plan, 0, ms)
        return outputs

    def _observe(self, plan: StepPlan, timed: bool = True) -> None:
        """Feed the step's cost to the policy, unless the step captured a CUDA graph (a
        one-off that would teach the policy that this gear costs seconds) or its wall time
        is not its cost (`timed`)."""
        captured, self._graphs_seen = self._graphs_seen, self._num_graphs()
        if self.spec is not None and plan.mode is not ForwardMode.EXTEND \
                and captured == self._graphs_seen and timed:
            ms = self.last_step["time_s"] * 1e3
            if plan.mode is ForwardMode.VERIFY:  # the draft's catch-up over earlier plain
                catch_up = self.spec.follow.catch_up_ms()  # steps is their cost, not this K's
                ms -= catch_up
                observe = getattr(self.scheduler.policy, "observe_catch_up", None)
                if observe is not None and catch_up > 0:  # what leaving K = 0 costs per row
                    observe(self.spec.follow.catch_up_rows, catch_up)
                # the policy learns the step's cost inside the next VERIFY step, before its
                # sync (Scheduler.prepare_next), not on the host path between the two steps
                # (~0.1 ms of goodput's host time per VERIFY step on the H200, session 9);
                # its next plan's scores were prepared before this step's sync anyway
                self._deferred_observation = (self.scheduler.policy, plan,
                                              self.spec.gear(plan), ms)
                return
            self._observe_cost(plan, self.spec.gear(plan), ms)

    def _flush_observation(self) -> None:
        """Feed a deferred VERIFY step's cost to the policy that ran it (if the policy has
        changed since, e.g. after the start-up warm-up, to that one)."""
        pending, self._deferred_observation = self._deferred_observation, None
        if pending is not None:
            policy, plan, k, ms = pending
            self._observe_cost(plan, k, ms, policy)

    def _num_graphs(self) -> int:
        return len(getattr(self.runner.shape_graphs, "entries", ()))

    def _observe_cost(self, plan: StepPlan, k: int, ms: float, policy=None) -> None:
        """Feed a step's measured cost to a policy that models costs (default: the current
        one): a synchronous step's wall time (host work, drafting and the device, after the
        step's one sync: what tokens per second really pay), an overlapped plain step's
        device time."""
        observe = getattr(policy or self.scheduler.policy, "observe", None)
        if observe is not None:
            observe(k, plan.batch_size, sum(r.num_tokens for r in plan.reqs), ms)

    def _account(self, plan: StepPlan, outputs: list[StepOutput], dt: float,
                 device_ms: float | None) -> None:
        s = self._stats
        s["steps"] += 1
        s[f"{plan.mode.value}_steps"] += 1
        s["tokens_computed"] += plan.num_tokens
        self.last_step = {"mode": plan.mode.value, "batch_size": plan.batch_size,
                          "num_tokens": plan.num_tokens, "time_s": dt,
                          "device_ms": device_ms,
                          # the cost model's key: 0 plain, K chains, max K + 1 the tree
                          "gear": self.spec.gear(plan) if self.spec is not None else 0}
        s["tokens_generated"] += sum(len(o.new_token_ids) for o in outputs)
        s["step_time_s"] += dt
        log.debug("step %s bs=%d tokens=%d %.2fms", plan.mode.name, plan.batch_size,
                  plan.num_tokens, dt * 1e3)

    # ------------------------------------------------------------------ introspection
    def memory_stats(self) -> dict:
        return {"kv_slots_total": self.slots.total, "kv_slots_free": self.slots.num_free,
                "kv_slots_cached": self.slots.num_cached}

    def stats(self) -> dict:
        out = dict(self._stats, preemptions=self.scheduler.num_preemptions,
                   running=self.num_running(), waiting=self.num_waiting())
        out["graphs"] = self.runner.graph_stats()  # graphed vs eager steps per mode
        if self.spec is not None:
            out["spec"] = self.spec_stats()
        return out

    def spec_stats(self) -> dict:
        """Speculation counters: steps by K, proposed / accepted draft tokens, acceptance
        rate and the histogram of accepted lengths (empty without speculation)."""
        if self.spec is None:
            return {}
        s = self.spec.stats
        proposed, accepted = s["proposed"], s["accepted"]
        return {
            "algorithm": self.config.speculative_algorithm, "policy": self.config.spec_policy,
            "steps_by_k": {int(k.split(".")[1]): v for k, v in s.items() if k.startswith("steps_by_k.")},
            # request-steps that verified chains / draft trees (the plan's tree width)
            "chain_steps": s["chain_steps"], "tree_steps": s["tree_steps"],
            # drafts accepted on tree request-steps, and what their top-1 chains (the
            # draft's argmax path, what a chain step would have proposed) alone accepted
            # there: the measured gain of trees over chains on the same text
            "tree_accepted": s["tree_accepted"], "tree_top1_accepted": s["tree_top1_accepted"],
            "proposed": proposed, "accepted": accepted,
            "acceptance_rate": accepted / proposed if proposed else 0.0,
            # the draft's catch-ups over rows committed at K = 0 (the price of leaving K = 0)
            "catch_up_rows": s["catch_up_rows"], "catch_up_ms": s["catch_up_ms"],
            "accept_len_hist": {int(k.split(".")[1]): v for k, v in s.items()
                                if k.startswith("accept_len.")},
            "controller": dict(getattr(self.scheduler.policy, "last_prediction", {}) or {},
                               **({"measured_ms": self.last_step.get("time_s", 0) * 1e3}
                                  if self.last_step else {})),
        }

    def prefill_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits [len, vocab] of every prompt position in one EXTEND pass (oracle for tests).
        Uses a temporary row and slots, returned before it exits."""
        req = Request("__probe__", list(token_ids), SamplingParams(max_tokens=1), 0)
        plan = StepPlan(mode=ForwardMode.EXTEND)
        plan.add(req, len(token_ids))
        try:
            fb, _ = self.builder.prepare(plan)
            return self.runner.logits(fb, all_tokens=True).cpu()
        finally:
            self.scheduler._release(req)


def _mix_seed(seed: int) -> int:
    """Any integer seed -> 32 bits, deterministically (the sampler hashes it further)."""
    return (seed ^ (seed >> 32) ^ (seed >> 64)) & 0xFFFFFFFF


def load_tokenizer(path: Path):
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    if not any((path / n).is_file() for n in names):
        log.warning("no tokenizer files in %s: only token-id prompts will work", path)
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def eos_token_ids(cfg, path: Path | None, tokenizer) -> tuple[int, ...]:
    ids = set(cfg.eos_token_ids)
    gen = path / "generation_config.json" if path else None
    if gen is not None and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(ids))
