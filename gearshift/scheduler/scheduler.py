"""Continuous-batching scheduler (pure CPU; unit-tested with fake step results).

Data flow: Engine.step(): plan = schedule() -> BatchBuilder.prepare(plan) -> runner ->
commit(plan, result) -> StepOutputs. schedule() and commit() are the scheduler's two
entry points: every mode (DECODE, EXTEND, mixed, VERIFY) goes through both.

Planning, per step:
  1. Running requests, oldest first, each get the tokens they still need (1 for decode,
     the rest of the prompt in chunks for a partial prefill) within the token budget.
     If the KV pool cannot hold them, the newest running request is preempted: its slots
     are freed and it goes back to the front of the queue, to be recomputed later from
     prompt + output so far (nothing is lost; seeded sampling is position-keyed).
  2. Waiting requests are admitted FIFO while the token budget, the KV pool (keeping one
     free slot per running request in reserve) and max_num_seqs allow; a long prompt is
     prefilled in chunks over several steps.
     A plan that leaves prefill for the next step says so (`prefill_continues`): the
     draft's pass over its chunks waits for the last of them (speculative/draft_follow.py).
  3. A pure decode batch asks the speculation policy (if any) for K per request, before
     anything is allocated; if the pool cannot hold the drafts, the step plans K = 0.
  4. A plain plan is booked at once: its tokens count as computed and each token it will
     sample stands in the request's output as a placeholder, so the next step can be
     planned while this one runs (overlap scheduling). The plan says how the engine runs
     it: a VERIFY step commits the step in flight first and runs synchronously (`sync`);
     a plain step commits it first where a grammar mask needs its token (`commit_first`).

Commit (commit.py, the Committer half): keep or free each step's slots, append its tokens,
finish requests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gearshift.forward_batch import ForwardMode
from gearshift.policy.base import Policy, PolicyView
from gearshift.request import Request, RequestStatus
from gearshift.scheduler.commit import Committer, StepOutput
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
from gearshift.scheduler.plan import Speculation, StepPlan
from gearshift.scheduler.prefix_cache import Match

__all__ = ["CacheHit", "Scheduler", "StepOutput"]


@dataclass(slots=True)
class CacheHit:
    match: Match  # the cached prefix
    evictable: int  # its slots that only the cache holds now (available until held)


class Scheduler(Committer):
    def __init__(self, slots: SlotPool, rows: ReqRowPool, *, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int,
                 speculation: Speculation | None = None, policy: Policy | None = None,
                 overlap: bool = True) -> None:
        if (speculation is None) != (policy is None):
            raise ValueError("speculation and its policy come together")
        self.slots, self.rows = slots, rows
        self.speculation = speculation
        self.policy = policy  # None: no speculation configured
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.overlap = overlap  # plain steps may be read a step late (else every plan is sync)
        self.tag_stride = max_num_seqs + 1  # placeholder values per parity (engine/overlap.py)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._next_tag = 0
        self.held: list[Request] | None = None  # releases postponed while a step is built

    def set_policy(self, policy: Policy) -> None:
        """Plan later steps with `policy` (the engine's set_policy)."""
        if self.speculation is None:
            raise ValueError("no speculation configured: a policy has nothing to plan")
        self.policy = policy

    # ------------------------------------------------------------------ requests
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def abort(self, request_id: str, reason: str = "abort") -> Request | None:
        for queue in (self.running, self.waiting):
            for req in queue:
                if req.request_id == request_id:
                    queue.remove(req)
                    req.closing = False
                    self._finish(req, reason)
                    return req
        return None

    def fail(self, req: Request, error: str) -> StepOutput:
        """Finish `req` with reason "error" (its slots and row go back); -> its last output."""
        for queue in (self.running, self.waiting):
            if req in queue:
                queue.remove(req)
        req.closing = False
        self._finish(req, "error")
        return StepOutput(req.request_id, [], True, "error", self._spec_counts(req), error)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ planning
    def schedule(self) -> StepPlan:
        self._retire_closing()
        plan = StepPlan(mode=ForwardMode.EXTEND)
        budget = self.max_num_batched_tokens
        planned = 0  # slots this plan will allocate
        free = self.slots.num_available
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while n > free and self.running[-1] is not req:
                self._preempt(self.running[-1], plan)
                free = self.slots.num_available - planned  # its slots may stay cached
            if n > free:  # even alone it does not fit: preempt it too
                self._preempt(req, plan)
                break
            plan.add(req, n)
            budget -= n
            free -= n
            planned += n
            i += 1
        reserve = len(self.running)  # one slot per running request for its next decode
        admit = not plan.preempted  # under KV pressure, admit nothing new this step
        while admit and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.req_pool_index < 0 and self.rows.num_free == 0:
                break
            if req.num_pending:  # preempted with a token still on the device: next step
                break
            try:
                hit = self._lookup(req)
            except Exception as e:  # noqa: BLE001 - this request fails, the others go on
                plan.failed.append(self.fail(req, f"{type(e).__name__}: {e}"))
                continue
            n = min(req.num_tokens - req.num_computed_tokens - (hit.match.length if hit else 0), budget)
            if n > free - reserve - (hit.evictable if hit else 0):
                break
            self.waiting.popleft()
            if hit is not None:
                free -= self._use_cached(req, hit)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            plan.add(req, n)
            budget -= n
            free -= n
            planned += n
            reserve += 1
        plan.prefill_continues = not all(plan.sample) or (
            bool(self.waiting) and budget <= 0 and len(self.running) < self.max_num_seqs)
        decoding = [i for i, d in enumerate(plan.decoding) if d]
        if plan.reqs and len(decoding) == plan.batch_size:
            plan.mode = ForwardMode.DECODE
        spec = self.speculation
        if spec is not None and decoding and (plan.mode is ForwardMode.DECODE or spec.mixed):
            self._plan_speculation(plan, decoding, free)
            self._count_ks(plan, decoding)
        plan.draft_follows = self.policy is not None and self.policy.drafts
        if plan.mode is ForwardMode.VERIFY:
            plan.commit_first = plan.sync = True
        else:
            plan.sync = not self.overlap
            self._book(plan)
        return plan

    def _plan_speculation(self, plan: StepPlan, decoding: list[int], free: int) -> None:
        """Decide K for the decoding requests now, before allocation: the plan is final from
        here on. Prefill chunks in the same plan (`Speculation.mixed`) keep K = 0."""
        spec = self.speculation
        if plan.mode is not ForwardMode.DECODE and any(
                r.wants_logprobs and r.wants_prompt_logprobs(p, n)
                for r, p, n in zip(plan.reqs, plan.prefix_lens, plan.extend_lens)):
            return  # a chunk scoring its prompt tokens runs as a plain EXTEND step
        dec = [plan.reqs[i] for i in decoding]
        view = self._view(dec, priced=self.policy.prices_suffix)
        ks = [0] * plan.batch_size
        planned = self.policy.plan(view)
        topk = self.policy.step_topk(view)
        chosen = self.policy.step_proposers(view)  # None: the engine's one proposer
        names = [spec.proposer] * plan.batch_size
        deepest = view.suffix_draft_tokens  # this batch's (Speculation.suffix_depth)
        # K is not cut to a request's remaining max_tokens: commit stops at the limit, and a
        # uniform K keeps the step on its captured graphs; drafts stop at the context limit
        for j, (i, r, k) in enumerate(zip(decoding, dec, planned)):
            if chosen is not None:
                names[i] = chosen[j]
            cap = deepest if chosen is not None and names[i] == "suffix" else spec.num_draft_tokens
            ks[i] = max(min(k, cap, self.max_model_len - r.num_tokens - 1), 0)
        if view.suffix_values is not None and spec.suffix_chosen is not None:
            spec.suffix_chosen(dec, [names[i] if ks[i] else "" for i in decoding])
        if spec.max_verify_tokens and topk == 1:
            _fit_deep_drafts(ks, plan.extend_lens, spec)
        nodes = [spec.num_nodes(k, topk) if k else n for k, n in zip(ks, plan.extend_lens)]
        # a suffix draft needs no draft rows of its own
        scratch = [spec.num_scratch(k, topk) if k and p != "suffix" else 0
                   for k, p in zip(ks, names)]
        extra = sum(nodes) + sum(scratch) - sum(plan.extend_lens)
        if not any(ks) or extra > free:
            return
        plan.draft_lens, plan.num_nodes, plan.num_scratch = ks, nodes, scratch
        plan.draft_topk = topk
        plan.proposers = [p if k else "" for p, k in zip(names, ks)]
        plan.mode = ForwardMode.VERIFY
        if spec.draft_catches_up:  # the rows the draft is behind on, before it proposes
            plan.draft_catch_up = [max(p - r.draft_rows, 0) if k else 0
                                   for r, p, k in zip(plan.reqs, plan.prefix_lens, ks)]

    @staticmethod
    def _count_ks(plan: StepPlan, decoding: list[int]) -> None:
        """Each decoding request's K as planned (0: plain), for its output's histogram."""
        ks = plan.draft_lens
        for i in decoding:
            req, k = plan.reqs[i], ks[i] if ks else 0
            req.spec_k_hist[k] = req.spec_k_hist.get(k, 0) + 1
            req.spec_verify_steps += k > 0
            if k:
                name = plan.proposers[i]
                req.spec_proposer_hist[name] = req.spec_proposer_hist.get(name, 0) + 1

    # ------------------------------------------------------------------ prefix cache
    def _lookup(self, req: Request) -> CacheHit | None:
        """The cached prefix a request about to be admitted can start from: all its tokens
        but the last (which computes the next token's logits)."""
        cache = self.slots.cache
        if cache is None or req.num_computed_tokens or req.slots \
                or req.params.prompt_logprobs is not None:  # its prompt's logits are computed
            return None
        m = cache.match(req.token_slice(0, req.num_tokens - 1))
        if not m.length:
            return None
        return CacheHit(m, cache.evictable_on_path(m.node))

    def _use_cached(self, req: Request, hit: CacheHit) -> int:
        """The request starts after its cached prefix (whose nodes it now holds); its draft
        reuses the cached draft rows (for a draft fed the next token, all but the last).
        -> slots that stopped being available (no longer evictable)."""
        m = hit.match
        req.slots = list(m.slots)
        req.num_computed_tokens = m.length
        req.cache_node = m.node
        if not req.num_cached_tokens and not req.output_token_ids:
            req.num_cached_tokens = m.length
        shift = self.speculation.draft_row_shift if self.speculation is not None else 0
        req.draft_rows = max(0, min(m.draft_rows, m.length - shift))
        return self.slots.cache.hold(m.node)

    def _view(self, decoding: list[Request], priced: bool = False) -> PolicyView:
        """`priced`: with the suffix drafts' values (a hybrid engine's host work, done when
        the step is planned: the suffix matches of these very tokens)."""
        spec = self.speculation
        deepest = spec.suffix_depth(len(decoding))
        values = spec.suffix_values(decoding, deepest) \
            if priced and spec.suffix_values is not None else None
        return PolicyView(decoding, len(self.waiting), spec.num_draft_tokens, spec.population(),
                          spec.draft_topk, spec.tree_population(), spec.draft_catches_up,
                          values, deepest)

    def prepare_next(self, plan: StepPlan) -> None:
        """While the device runs `plan` (a VERIFY step) and before the host waits for it: the
        policy may prepare the next plan for this step's decoding requests (goodput scores
        its gears here, not on the next step's critical path), and suffix decoding's
        indexes take the tokens committed so far (a new request's prompt, mostly)."""
        if self.policy is None:
            return
        spec = self.speculation
        if spec is not None and spec.suffix_index_ahead is not None:
            spec.suffix_index_ahead(self.running)
        dec = [r for r, d in zip(plan.reqs, plan.decoding) if d]
        if dec:
            self.policy.prepare(self._view(dec))

    def _book(self, plan: StepPlan) -> None:
        """A plain plan's tokens count as computed from now on, and each token it samples
        stands in the output as the placeholder -(token_tag + batch index + 1), which the
        engine's TokenFeed resolves on the device. The next plan can then be made while
        this step runs; commit fills the placeholders. Two tags alternate: every
        placeholder of step n is filled before step n + 2 is planned."""
        plan.token_tag, self._next_tag = self._next_tag, self.tag_stride - self._next_tag
        for i, (req, n, smp) in enumerate(zip(plan.reqs, plan.extend_lens, plan.sample)):
            req.num_computed_tokens += n
            if req.num_pending and req.grammar is not None:  # its mask needs that token
                plan.commit_first = True
            if not smp:
                plan.placeholders.append(-1)
                continue
            req.output_token_ids.append(-(plan.token_tag + i + 1))
            req.num_pending += 1
            plan.placeholders.append(len(req.output_token_ids) - 1)
            if self._length_reached(req):  # its last token: no further step plans it
                req.closing = True

    def unbook(self, plan: StepPlan) -> None:
        """Undo _book for a plain plan that never ran (it failed before its launch): the
        next schedule() plans its requests again."""
        for req, n, idx in zip(plan.reqs, plan.extend_lens, plan.placeholders):
            if req.is_finished and not req.closing:
                continue
            req.num_computed_tokens -= n
            if idx >= 0:
                del req.output_token_ids[idx:]
                req.num_pending -= 1
                req.closing = False
        plan.placeholders = [-1] * plan.batch_size

    def _retire_closing(self) -> None:
        """Requests whose last token (by length) is in flight leave the batch, and their
        slots go back: every later step runs after that one on the device. Their commit
        reports the finish."""
        for req in [r for r in self.running if r.closing]:
            self.running.remove(req)
            self._finish(req, None)

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

    def _spec_counts(self, req: Request) -> tuple | None:
        """(proposed, accepted, verify steps, K histogram): RequestOutput.spec's fields."""
        if self.policy is None:
            return None
        return (req.spec_proposed, req.spec_accepted, req.spec_verify_steps,
                dict(req.spec_k_hist), dict(req.spec_proposer_hist))

    def _length_reached(self, req: Request) -> bool:
        """After appending its latest token: the request may produce no more."""
        return len(req.output_token_ids) >= req.params.max_tokens \
            or req.num_tokens >= self.max_model_len

    def _finish(self, req: Request, reason: str | None) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        self._release(req)

    def _release(self, req: Request) -> None:
        if self.held is not None:  # a step is being built over this request's row and slots
            self.held.append(req)
            return
        cache = self.slots.cache
        if cache is not None:  # its committed tokens stay cached, the rest goes back
            try:
                self._cache_committed(req)
            except Exception:  # noqa: BLE001 - a failed request's tokens are not cached
                shared = cache.depth(req.cache_node) if req.cache_node is not None else 0
                self.slots.free(req.slots[shared:])  # its cached prefix is the cache's
            if req.cache_node is not None:
                cache.release(req.cache_node)
                req.cache_node = None
        else:
            self.slots.free(req.slots)
        req.slots = []
        if req.req_pool_index >= 0:
            self.rows.free(req.req_pool_index)
            req.req_pool_index = -1

    def _cache_committed(self, req: Request) -> None:
        if req.finish_reason == "error":
            raise ValueError("not cached")
        # tokens with KV; a VERIFY step's accepted drafts past max_tokens were not emitted
        tokens = req.token_slice(0, min(req.num_computed_tokens, len(req.slots)))
        n = next((j for j, t in enumerate(tokens) if t < 0), len(tokens))  # no placeholder
        self.slots.free(self.slots.cache.insert(tokens[:n], req.slots[:n], req.draft_rows))
        self.slots.free(req.slots[n:])

    def hold_releases(self) -> None:
        """Until release_held(): requests that finish keep their row and slots (a step being
        built over them still reads them)."""
        self.held = []

    def release_held(self) -> None:
        held, self.held = self.held or [], None
        for req in held:
            self._release(req)


def _fit_deep_drafts(ks: list[int], extend_lens: list[int], spec: Speculation) -> None:
    """Cut chains deeper than the model's K (suffix drafts), deepest first, until the step
    verifies at most spec.max_verify_tokens: past that its activations were never profiled."""
    if max(ks, default=0) <= spec.num_draft_tokens:
        return  # nothing to cut (most steps): no pass over the batch
    total = sum(spec.num_nodes(k, 1) if k else n for k, n in zip(ks, extend_lens))
    for i in sorted(range(len(ks)), key=lambda j: -ks[j]):
        if total <= spec.max_verify_tokens or ks[i] <= spec.num_draft_tokens:
            return
        cut = min(total - spec.max_verify_tokens, ks[i] - spec.num_draft_tokens)
        ks[i] -= cut
        total -= cut
