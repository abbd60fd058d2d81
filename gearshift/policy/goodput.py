"""`goodput` (the default policy): pick the gear that maximises expected committed tokens
per second for this step. Gears: 0 = plain decode, K = 1..num_draft_tokens = chains of K
drafts, and, when the engine verifies trees (tree_width > 1), num_draft_tokens + 1 = one
draft tree of that depth per request. Scores per gear: policy/scoring.py; the steps that run
another gear to keep its price measured: policy/exploration.py.

Per request (`per_request`, the engine's `goodput-request`): a scored chain gear is refined
into a K_i per request by greedy marginal allocation (policy/allocation.py: request i's k-th
draft is worth a_i^k, and costs the time it adds at the step's verified tokens and
context), with hysteresis per request; the batch-wide gear still chooses chains, the tree
or an exploration step (`goodput`, the default: every request takes the gear; measured
faster so far, docs/benchmarks.md).

Hysteresis: the current K is kept unless another K is predicted to be better by more than
`margin` (2%: no flapping on noise, and at most 2% lost to a gear that is better by less).
The running gear's drift moves its neighbours' prices too (CostModel.shared). A steady gear
is rescored one plan in 4. As batches grow, t(K) rises faster than E(K) (verification turns
compute-bound): K = 0.

Data flow: Scheduler -> plan(view) -> K; Engine -> observe(...) -> CostModel; a VERIFY step,
before its sync -> prepare(view) -> the next plan's scores.
"""

from __future__ import annotations

import logging

from gearshift.policy.allocation import allocate, chain_gear
from gearshift.policy.base import Policy, PolicyView
from gearshift.policy.cost import CostModel
from gearshift.policy.exploration import Explorer
from gearshift.policy.scoring import GearScorer, Scores, runner_up

log = logging.getLogger("gearshift.policy")


class GoodputPolicy(Policy):
    def __init__(self, cost: CostModel, num_draft_tokens: int, *, prior: float = 0.6,
                 prior_weight: float = 4.0, population_weight: float = 10.0,
                 margin: float = 0.02, pad=lambda bs: bs,
                 explore_every: int = 64, explore_ratio: float = 0.8, max_backoff: int = 8,
                 fresh_obs: int = 2, fresh_gap: int = 4, quiet_ratio: float = 0.9,
                 quiet_steps: int = 7, tree_evidence: float = 100.0,
                 fresh_ratio: float = 0.5, catch_up_ms_per_row: float | None = None,
                 catch_up_min_rows: int = 1024, share_after: int = 16,
                 explore_rate: float = 0.5, per_request: bool = False,
                 verify_tokens=None) -> None:
        self.cost = cost
        # per_request: a scored chain gear is refined into K_i per request (allocation.py);
        # else every eligible request takes the batch's gear
        self.per_request = per_request
        # (requests, tokens) -> the tokens a VERIFY pass mixing K runs over (its graph's
        # token bucket; SpecRunner.verified_tokens): what a mixed step costs
        self.verify_tokens = verify_tokens
        self._held: dict[str, int] = {}  # request id -> its K in the last plan (hysteresis)
        # padded bs -> the gear of its last allocation: its steps are the running gear's,
        # whichever uniform gear won the batch-wide scoring
        self._allocated: dict[int, int] = {}
        self.num_draft_tokens = num_draft_tokens
        self.margin = margin
        self.pad = pad  # batch size -> padded (graph) batch size
        self.scorer = GearScorer(cost, num_draft_tokens, pad, prior=prior,
                                 prior_weight=prior_weight, population_weight=population_weight,
                                 catch_up_ms_per_row=catch_up_ms_per_row,
                                 catch_up_min_rows=catch_up_min_rows)
        self.explorer = Explorer(cost, num_draft_tokens, explore_every=explore_every,
                                 explore_ratio=explore_ratio, max_backoff=max_backoff,
                                 fresh_obs=fresh_obs, fresh_gap=fresh_gap,
                                 fresh_ratio=fresh_ratio, tree_evidence=tree_evidence,
                                 explore_rate=explore_rate)
        self.current_k = num_draft_tokens  # the running gear
        self.last_prediction: dict = {}
        self._topk = 1  # tree width of the step planned last
        self.switches = 0  # gear changes (probes and explorations aside)
        # "verify" / "plain" -> [measured ms, predicted ms, steps] of observed steps, summed
        # (benches report measured / predicted: is the cost model biased for either mode?)
        self.prediction_log: dict[str, list] = {}
        # When plain decode leads every speculative gear by more than 1 / quiet_ratio, the
        # next `quiet_steps` plans at the same padded batch size stay at K = 0 without
        # scoring (probes still come on time): scores() loops over every request
        self.quiet_ratio, self.quiet_steps = quiet_ratio, quiet_steps
        self._quiet: tuple[int, int] | None = None  # (padded bs, plans left)
        self._prepared: tuple | None = None  # ((padded bs, top gear), scores) from prepare()
        self._prepared_ks: tuple | None = None  # (request ids, K_i) from prepare()
        # the running gear's drift moves its neighbours' prices (CostModel.shared) once it has
        # run `share_after` steps: its first steps correct its own price (chosen when noise
        # made it look best), which is not drift
        self.share_after = share_after
        self._steady = 0  # observations of the current gear since it became current
        # A scored speculative gear is kept unscored for up to `rescore_every` - 1 plans at
        # the same padded batch size (churn changes the count, rarely the graph) and top
        # gear, unless exploration is due or a step lands over `rescore_error` off its price:
        # scoring is most of goodput's host work, and a VERIFY step waits for the plan.
        self.rescore_every, self.rescore_error = 4, 0.1
        self._reuse: tuple[int, int, int] | None = None  # (padded bs, top gear, plans left)
        self.reused = 0  # plans that kept the gear without scoring (benches report it)
        self.last_reason = ""  # why the last plan took its gear (diagnostics)

    def scores(self, view: PolicyView, top: int) -> Scores:
        """(expected tokens, predicted ms, tokens per ms) for every uniform gear in 0..top."""
        return self.scorer.scores(view, top)

    def observe_catch_up(self, rows: int, ms: float) -> None:
        """A VERIFY step's draft catch-up over `rows` rows took `ms` (Engine)."""
        self.scorer.observe_catch_up(rows, ms)

    def top_gear(self, view: PolicyView) -> int:
        """The highest gear this step may take: num_draft_tokens, or one more (the draft tree)
        when the engine verifies trees and the cost model knows their price."""
        n = self.num_draft_tokens
        if view.topk > 1 and view.num_draft_tokens >= n and n + 1 in self.cost.base:
            return n + 1  # the tree
        return min(n, view.num_draft_tokens)

    def step_topk(self, view: PolicyView) -> int:
        return self._topk

    def gear_name(self, gear: int) -> str:
        return "tree" if gear > self.num_draft_tokens else f"K{gear}"

    def prepare(self, view: PolicyView) -> None:
        """Score the gears for these requests while the device runs their VERIFY step (unless
        the next plan keeps its gear unscored), and with per_request allocate their K_i:
        the next plan() uses the scores at the same padded batch size and top gear, and the
        allocation for the same requests. They lag one step of evidence (EMA steps ~10%)."""
        top, bs = self.top_gear(view), self.pad(len(view.requests))
        self._prepared = None if self._reuse_due(bs, top) else ((bs, top), self.scores(view, top))
        # per request: the allocation too (a step of 64 requests prices 256 draft prefixes),
        # used by the next plan if it allocates for the same requests
        self._prepared_ks = None if not self.per_request else (
            tuple(r.request_id for r in view.requests), self._marginal(view))

    def _reuse_due(self, bs: int, top: int) -> bool:
        """Does the next plan, at padded batch size `bs` with top gear `top`, keep the running
        gear without scoring (see rescore_every)? Counters only: the same answer in prepare()
        and in the plan() after it."""
        r = self._reuse
        if r is None or r[2] <= 0 or (r[0], r[1]) != (bs, top) or not self.current_k:
            return False
        return not self.explorer.due_next(bs)

    def plan(self, view: PolicyView) -> list[int]:
        self._topk = 1
        prepared, self._prepared = self._prepared, None  # for this plan only
        prepared_ks, self._prepared_ks = self._prepared_ks, None
        if not any(self.eligible(r) for r in view.requests):
            return [0] * len(view.requests)
        top = self.top_gear(view)
        scores = prepared[1] if prepared and prepared[0] == (self.pad(len(view.requests)), top) \
            else None
        gear = self._choose(view, top, scores)
        if gear > self.num_draft_tokens:
            self._topk = view.topk
        elif self.per_request and self.last_reason in ("scored", "kept"):
            return self._allocate(view, prepared_ks)  # exploration keeps its uniform gear
        k = min(gear, self.num_draft_tokens)
        return [k if self.eligible(r) else 0 for r in view.requests]

    def _allocate(self, view: PolicyView, prepared: tuple | None = None) -> list[int]:
        """K_i by marginal value against the step-time model (policy/allocation.py): the
        allocation prepare() made for these requests, else one made now."""
        reqs = view.requests
        ids = tuple(r.request_id for r in reqs)
        ks = prepared[1] if prepared is not None and prepared[0] == ids else self._marginal(view)
        self._held = dict(zip(ids, ks))
        self._allocated[self.pad(len(reqs))] = chain_gear(ks)
        return ks

    def _marginal(self, view: PolicyView) -> list[int]:
        reqs, kmax = view.requests, min(self.num_draft_tokens, view.num_draft_tokens)
        n, bs = len(reqs), self.pad(len(view.requests))
        ctx = sum(r.num_tokens for r in reqs)
        priors, w = self.scorer.priors(view), self.scorer.prior_weight
        alphas = [min((r.spec_alpha_num + priors[r.params.greedy] * w) / (r.spec_alpha_den + w),
                      0.999) for r in reqs]
        limits = [kmax if self.eligible(r) else 0 for r in reqs]
        held = [self._held.get(r.request_id, 0) for r in reqs]
        step_ms = self.cost.verified_pricer(n, ctx, kmax, padded_bs=bs, bucket=self._bucket(n))
        return allocate(alphas, limits, step_ms, held, self.margin, self._catch_up(view))

    def _catch_up(self, view: PolicyView) -> list[tuple[float, float]] | None:
        """Per request: (ms of its draft's catch-up, output tokens it has left), for the
        allocation to price leaving K = 0; None where no draft is behind."""
        if not view.draft_catches_up:
            return None
        per_row = self.scorer.catch_up_ms_per_row
        out = [(max(r.num_computed_tokens - r.draft_rows, 0) * per_row,
                float(r.params.max_tokens - len(r.output_token_ids))) for r in view.requests]
        return out if any(ms for ms, _ in out) else None

    def _bucket(self, n: int):
        """tokens -> the tokens a VERIFY pass of n requests mixing K runs over (None: as
        many as it verifies)."""
        return None if self.verify_tokens is None else lambda t: self.verify_tokens(n, t)

    def _choose(self, view: PolicyView, top: int, scores: Scores | None = None) -> int:
        """This step's gear: the best predicted (with hysteresis), or an exploration step.
        `scores`: prepared ones (see prepare), else computed now."""
        bs = self.pad(len(view.requests))
        if self._quiet is not None and self._quiet[0] == bs \
                and not self.explorer.probe_due_next(bs):
            # plain decode by a wide margin at this batch size: the next steps need no
            # scores (their host time is a plain step's, every step, under the heaviest load)
            self._quiet = (bs, self._quiet[1] - 1) if self._quiet[1] > 1 else None
            self.explorer.count(speculating=False)
            self.last_reason = "quiet"
            return 0
        self._quiet = None
        if scores is None and self._reuse_due(bs, top):
            self._reuse = (bs, top, self._reuse[2] - 1)
            self.explorer.count(speculating=True)
            self.reused += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug("goodput bs=%d -> %s (kept, unscored)", len(view.requests),
                          self.gear_name(self.current_k))
            self.last_reason = "kept"
            return self.current_k
        self._reuse = None
        scores = scores or self.scores(view, top)
        best = max(scores, key=lambda k: scores[k][2])
        cur = min(self.current_k, top)
        if scores[best][2] <= scores[cur][2] * (1 + self.margin):
            best = cur  # hysteresis: not clearly better, keep the gear we are in
        if best != self.current_k:
            self._steady = 0
            self.explorer.switched(self.current_k, best)
            self.switches += 1
        self.current_k = best
        gear, reason = self.explorer.step(scores, best, top, bs, view, self.scorer.catch_up_full)
        if best == 0:
            up = runner_up(scores, top)
            if not up or scores[up][2] < self.quiet_ratio * scores[0][2]:
                self._quiet = (bs, self.quiet_steps)
        elif reason == "scored":  # no exploration due: the next plans may keep this gear
            self._reuse = (bs, top, self.rescore_every - 1)
        self.last_reason = reason
        if reason != "scored":
            return gear
        self.last_prediction = {"k": min(best, self.num_draft_tokens),
                                "gear": self.gear_name(best),
                                "tokens": scores[best][0], "ms": scores[best][1],
                                "bs": len(view.requests),
                                "prior_acceptance": self.scorer.population_prior(view),
                                "prior_acceptance_sampled":
                                    self.scorer.population_prior(view, greedy=False)}
        if log.isEnabledFor(logging.DEBUG):
            log.debug("goodput bs=%d -> %s | %s", len(view.requests), self.gear_name(best),
                      " ".join(f"{self.gear_name(k)}:{t:.1f}tok/{ms:.2f}ms"
                               for k, (t, ms, _) in scores.items()))
        return best

    def observe(self, k: int, bs: int, ctx_tokens: int, ms: float,
                ks: list[int] | None = None) -> None:
        """A step at gear k took `ms`; `ks`: a chain step's K per request."""
        n, bs = bs, self.pad(bs)
        self.explorer.observe(k, bs, ms)
        if k and ks and len(set(ks)) > 1:  # mixed K: its error, carried to its gear's price
            mixed = self.cost.predict_verified(n + sum(ks), n, ctx_tokens, max(ks),
                                               self.num_draft_tokens, bs, self._bucket(n))
            ms *= self.cost.predict(k, bs, ctx_tokens) / mixed
        # the running gear's steps (an allocation's too) share their drift (see
        # share_after); a probe's or an exploration's step prices only its own gear, by at
        # least explore_rate
        steady = k == self.current_k or (k != 0 and self._allocated.get(bs) == k)
        self._steady = self._steady + 1 if steady else self._steady
        pred = self.cost.observe(k, bs, ctx_tokens, ms,
                                 share=steady and self._steady > self.share_after,
                                 min_rate=0.0 if steady else self.explorer.explore_rate)
        if pred is not None and abs(ms - pred) > self.rescore_error * pred:
            self._reuse = None  # a step far off its price: score the next plan
        if pred is not None:  # how well the model predicted this step
            log_ = self.prediction_log.setdefault("verify" if k else "plain", [0.0, 0.0, 0])
            log_[0] += ms
            log_[1] += pred
            log_[2] += 1
