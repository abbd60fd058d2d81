"""Continuous-batching scheduler (pure CPU; unit-tested with fake step results).

Data flow: Engine.step(): plan = schedule() -> BatchBuilder.prepare(plan) -> runner ->
commit(plan, sampled token ids) -> StepOutputs.

Policy per step:
  1. Running requests, oldest first, each get the tokens they still need (1 for decode,
     the rest of the prompt in chunks for a partial prefill) within the token budget.
     If the KV pool cannot hold them, the newest running request is preempted: its slots
     are freed and it goes back to the front of the queue, to be recomputed later from
     prompt + output so far (nothing is lost; seeded sampling is position-keyed).
  2. Waiting requests are admitted FIFO while the token budget, the KV pool (keeping one
     free slot per running request in reserve) and max_num_seqs allow; a long prompt is
     prefilled in chunks over several steps.
  3. A pure decode batch asks the speculation policy (if any) for K per request, before
     anything is allocated; if the pool cannot hold the drafts, the step plans K = 0.
The plan counts slots; BatchBuilder.prepare / SpecWorker.prepare allocate exactly that.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gearshift.forward_batch import ForwardMode
from gearshift.policy.base import Policy, PolicyView
from gearshift.request import Request, RequestStatus
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
from gearshift.scheduler.plan import StepPlan


@dataclass(slots=True)
class StepOutput:
    """What one step did to one request; consumed by OutputProcessor and the server."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "length" | "stop" | "abort" | None
    spec: tuple[int, int] | None = None  # (proposed, accepted) so far, when speculation is on


class Scheduler:
    def __init__(self, slots: SlotPool, rows: ReqRowPool, *, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int, policy: Policy | None = None,
                 max_draft_len: int = 0, spec_slots=None) -> None:
        self.slots, self.rows = slots, rows
        self.policy = policy  # None: no speculation configured
        self.max_draft_len = max_draft_len
        self.spec_slots = spec_slots  # (K, topk) -> KV slots a speculating request needs
        self.population = lambda: None  # SpecWorker's acceptance evidence over recent requests
        self.tree_population = lambda: None  # ... from its tree steps
        self.draft_topk = 1  # the engine's tree width (1: chains only)
        self.draft_catches_up = False  # the proposer keeps state that catches up (PolicyView)
        self.on_prepare = None  # called first in prepare_next (Engine: deferred observations)
        self.spec_mixed = False  # prefill chunks may ride along in VERIFY steps (chains)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._arrivals = 0
        self.held: list[Request] | None = None  # releases postponed while a step is built

    # ------------------------------------------------------------------ requests
    def add(self, req: Request) -> None:
        req.arrival_index = self._arrivals
        self._arrivals += 1
        self.waiting.append(req)

    def abort(self, request_id: str, reason: str = "abort") -> Request | None:
        for req in self.running:
            if req.request_id == request_id:
                self.running.remove(req)
                self._finish(req, reason)
                return req
        for req in self.waiting:
            if req.request_id == request_id:
                self.waiting.remove(req)
                self._finish(req, reason)
                return req
        return None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ planning
    def schedule(self) -> StepPlan:
        plan = StepPlan(mode=ForwardMode.EXTEND)
        budget = self.max_num_batched_tokens
        free = self.slots.num_free
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while n > free and self.running[-1] is not req:
                free += self._preempt(self.running[-1], plan)
            if n > free:  # even alone it does not fit: preempt it too
                self._preempt(req, plan)
                break
            plan.add(req, n)
            budget -= n
            free -= n
            i += 1
        reserve = len(self.running)  # one slot per running request for its next decode
        admit = not plan.preempted  # under KV pressure, admit nothing new this step
        while admit and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.req_pool_index < 0 and self.rows.num_free == 0:
                break
            if req.num_pending:  # preempted with a token still on the device: next step
                break
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n > free - reserve:
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            plan.add(req, n)
            budget -= n
            free -= n
            reserve += 1
        decoding = [i for i, (n, s) in enumerate(zip(plan.extend_lens, plan.sample))
                    if n == 1 and s]
        if plan.reqs and len(decoding) == plan.batch_size:
            plan.mode = ForwardMode.DECODE
        if self.policy is not None and decoding and (
                plan.mode is ForwardMode.DECODE or self.spec_mixed):
            self._plan_speculation(plan, decoding, free)
        return plan

    def _plan_speculation(self, plan: StepPlan, decoding: list[int], free: int) -> None:
        """Decide K for the decoding requests now, before allocation: the plan is final from
        here on. Prefill chunks in the same plan (`spec_mixed`) keep K = 0."""
        dec = [plan.reqs[i] for i in decoding]
        view = self._view(dec)
        room = self.max_model_len  # drafts may not run past the context limit
        ks = [0] * plan.batch_size
        # K is not cut to a request's remaining max_tokens: commit stops at the limit, and a
        # uniform K keeps the step on its captured graphs (a mixed-K batch runs eagerly)
        for i, r, k in zip(decoding, dec, self.policy.plan(view)):
            ks[i] = max(min(k, self.max_draft_len, room - r.num_tokens - 1), 0)
        topk = self.policy.step_topk(view)
        extra = sum(self.spec_slots(k, topk) - 1 for k in ks if k)
        if not any(ks) or extra > free:
            return
        plan.draft_lens, plan.draft_topk = ks, topk
        plan.mode = ForwardMode.VERIFY

    def _view(self, decoding: list[Request]) -> PolicyView:
        return PolicyView(decoding, len(self.waiting), self.max_draft_len, self.population(),
                          self.draft_topk, self.tree_population(), self.draft_catches_up)

    def prepare_next(self, plan: StepPlan) -> None:
        """While the device runs `plan` (a VERIFY step) and before the host waits for it: the
        policy may prepare the next plan for this step's decoding requests (goodput scores
        its gears here, not on the next step's critical path). `on_prepare` first: the
        engine's deferred observation of the VERIFY step before."""
        if self.on_prepare is not None:
            self.on_prepare()
        if self.policy is None:
            return
        dec = [r for r, n, smp in zip(plan.reqs, plan.extend_lens, plan.sample) if n == 1 and smp]
        if dec:
            self.policy.prepare(self._view(dec))

    def _preempt(self, req: Request, plan: StepPlan) -> int:
        freed = len(req.slots)
        self.running.remove(req)
        self._release(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = req.draft_rows = 0
        self.waiting.appendleft(req)
        plan.preempted.append(req)
        self.num_preemptions += 1
        return freed

    # ------------------------------------------------------------------ commit
    def commit(self, plan: StepPlan, sampled: list[int]) -> list[StepOutput]:
        """`sampled[i]` is the token sampled for plan.reqs[i] (ignored where not plan.sample[i])."""
        outputs: list[StepOutput] = []
        for req, n, do_sample, tok in zip(plan.reqs, plan.extend_lens, plan.sample, sampled):
            if req.is_finished:  # aborted while the step ran
                continue
            req.num_computed_tokens += n
            if not do_sample:
                continue
            req.output_token_ids.append(tok)
            reason = self._finish_reason(req, tok)
            if reason is not None:
                self.running.remove(req)
                self._finish(req, reason)
            outputs.append(StepOutput(req.request_id, [tok], reason is not None, reason,
                                      self._spec_counts(req)))
        return outputs

    # ------------------------------------------------------------------ overlap scheduling
    def advance(self, plan: StepPlan, tag: int) -> list[tuple[int, bool] | None]:
        """Overlap mode, once the step is launched and before its tokens are known: count
        its tokens as computed and give each sampling request a placeholder for the token
        being sampled, so the next step can be planned now. A request that reaches its
        length limit leaves the batch here (its slots go back at once: later steps run
        after this one on the device). The placeholder is -(tag + row + 1): TokenFeed maps
        it to the token on the device. Returns per request (output index, closed) or None,
        for resolve()."""
        rows: list[tuple[int, bool] | None] = []
        for req, n, do_sample in zip(plan.reqs, plan.extend_lens, plan.sample):
            if req.is_finished:
                rows.append(None)
                continue
            req.num_computed_tokens += n
            if not do_sample:
                rows.append(None)
                continue
            req.output_token_ids.append(-(tag + req.req_pool_index + 1))
            req.num_pending += 1
            rows.append((len(req.output_token_ids) - 1, self._length_reached(req)))
            if rows[-1][1]:
                self.running.remove(req)
                self._finish(req, None)
                req.closing = True
        return rows

    def resolve(self, plan: StepPlan, rows: list[tuple[int, bool] | None],
                sampled: list[int]) -> list[StepOutput]:
        """The step's tokens are known: fill the placeholders, finish on EOS / stop ids (a
        request finishing here may already be in the next step: its placeholder there is
        dropped and that step's token ignored) and report the step's outputs."""
        outputs: list[StepOutput] = []
        for req, row, tok in zip(plan.reqs, rows, sampled):
            if row is None:
                continue
            idx, closed = row
            req.num_pending -= 1
            if req.is_finished and not req.closing:
                continue  # aborted, or finished by an earlier token
            req.output_token_ids[idx] = tok
            reason = self._stop_reason(req, tok) or ("length" if closed else None)
            if reason is not None:
                if not closed:  # drop the placeholders of steps already launched
                    del req.output_token_ids[idx + 1:]
                req.closing = False
                if req in self.running:
                    self.running.remove(req)
                elif req in self.waiting:
                    self.waiting.remove(req)
                self._finish(req, reason)
            outputs.append(StepOutput(req.request_id, [tok], reason is not None, reason,
                                      self._spec_counts(req)))
        return outputs

    def _spec_counts(self, req: Request) -> tuple[int, int] | None:
        return (req.spec_proposed, req.spec_accepted) if self.policy is not None else None

    def commit_spec(self, plan: StepPlan, new_tokens: list[list[int]],
                    kept_slots: list[list[int]], freed_slots: list[list[int]]) -> list[StepOutput]:
        """A VERIFY step: `new_tokens[i]` = accepted drafts + bonus for plan.reqs[i];
        `kept_slots[i]` hold the KV of the pending token and the accepted drafts (in
        position order); `freed_slots[i]` are the rejected candidates and draft scratch."""
        outputs: list[StepOutput] = []
        for req, toks, kept, freed in zip(plan.reqs, new_tokens, kept_slots, freed_slots):
            self.slots.free(freed)
            if req.is_finished:
                self.slots.free(kept)
                continue
            req.slots.extend(kept)
            req.num_computed_tokens += len(kept)
            if not toks:  # a prefill chunk that does not reach the end of the prompt
                continue
            emitted: list[int] = []
            reason = None
            for tok in toks:
                req.output_token_ids.append(tok)
                emitted.append(tok)
                reason = self._finish_reason(req, tok)
                if reason is not None:
                    break
            if reason is not None:
                self.running.remove(req)
                self._finish(req, reason)
            outputs.append(StepOutput(req.request_id, emitted, reason is not None, reason,
                                      self._spec_counts(req)))
        return outputs

    def _finish_reason(self, req: Request, tok: int) -> str | None:
        return self._stop_reason(req, tok) or ("length" if self._length_reached(req) else None)

    def _length_reached(self, req: Request) -> bool:
        """After appending its latest token: the request may produce no more."""
        return len(req.output_token_ids) >= req.params.max_tokens \
            or req.num_tokens >= self.max_model_len

    @staticmethod
    def _stop_reason(req: Request, tok: int) -> str | None:
        p = req.params
        if not p.ignore_eos and tok in req.eos_token_ids:
            return "stop"
        if p.stop_token_ids and tok in p.stop_token_ids:
            return "stop"
        return None

    def _finish(self, req: Request, reason: str | None) -> None:
        self._release(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason

    def _release(self, req: Request) -> None:
        if self.held is not None:  # a step is being built over this request's row and slots
            self.held.append(req)
            return
        self.slots.free(req.slots)
        req.slots = []
        if req.req_pool_index >= 0:
            self.rows.free(req.req_pool_index)
            req.req_pool_index = -1

    def release_held(self) -> None:
        held, self.held = self.held or [], None
        for req in held:
            self._release(req)
