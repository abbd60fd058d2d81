"""`goodput` (the default policy): pick the draft length K that maximises expected
committed tokens per second for this step.

    E_i(K) = (1 - a_i^(K+1)) / (1 - a_i)     expected tokens of request i with a chain of K
                                             (per-token acceptance a_i, EMA with a prior)
    G(K)   = sum_i E_i(K) / t(K, padded bs, context)      t from the CostModel

Requests that opted out count 1 token at any K. Hysteresis: the current K is kept unless
another K is predicted to be better by more than `margin` (2%: no flapping on noise, and
at most 2% lost to a gear that is better by less).
As batches grow, t(K) rises faster than E(K) (verification turns compute-bound), and the
argmax falls to K = 0: plain decode.

Data flow: Scheduler -> plan(view) -> K; Engine -> observe(...) -> CostModel.
"""

from __future__ import annotations

import logging

from gearshift.policy.base import Policy, PolicyView
from gearshift.policy.cost import CostModel
from gearshift.request import Request

log = logging.getLogger("gearshift.policy")


def expected_tokens(alpha: float, k: int) -> float:
    if k == 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def acceptance(req: Request, prior: float, prior_weight: float) -> float:
    """Per-token acceptance estimate: accepted / (accepted + rejections), with a prior (the
    population's acceptance when measured, else the policy's fixed prior)."""
    num = req.spec_alpha_num + prior * prior_weight
    den = req.spec_alpha_den + prior_weight
    return min(max(num / den, 0.0), 0.999)


class GoodputPolicy(Policy):
    def __init__(self, cost: CostModel, max_k: int, *, prior: float = 0.6,
                 prior_weight: float = 4.0, population_weight: float = 10.0,
                 margin: float = 0.02, pad=lambda bs: bs,
                 explore_every: int = 64, explore_ratio: float = 0.8, max_backoff: int = 8,
                 fresh_obs: int = 2, fresh_gap: int = 4) -> None:
        self.cost = cost
        self.max_k = max_k
        # a request's prior: the population's acceptance (evidence over recent requests),
        # itself with `prior` at `population_weight` (one unlucky first step is not the norm)
        self.prior, self.prior_weight = prior, prior_weight
        self.population_weight = population_weight
        self.margin = margin
        self.pad = pad  # batch size -> padded (graph) batch size
        self.current_k = max_k
        self.last_prediction: dict = {}
        # Exploration keeps the estimates of the gears not in use fresh: while in K = 0, a K
        # whose predicted goodput is at least `explore_ratio` of the best is tried once every
        # `explore_every` steps (acceptance and its cost; a bounded loss: under heavy load a
        # VERIFY step costs several plain steps, so clearly worse gears are not tried);
        # while speculating, one step in `explore_every` runs at K = 0 (cheap: what plain
        # decode costs now), and another, half way, a neighbour K + 1 or K - 1 predicted
        # within `explore_ratio` (a misjudged neighbour would otherwise never be measured
        # again: the start-up profile's error would stand). A neighbour gear whose cost at
        # this batch size has had fewer than `fresh_obs` online observations (only the
        # start-up warm-up's, or none) is tried sooner: one step in `fresh_gap`, so a new
        # load level is measured within its first steps, not after a hundred.
        # Probes back off, per padded batch size: a probe at batch b that confirms its
        # gear's predicted cost doubles the wait for the next probe at b (up to `max_backoff`
        # x explore_every); one that did not brings b back to explore_every; a new gear
        # resets every batch size. (One shared period, reset whenever the padded batch
        # changed, never backed off under a closed loop's churn: goodput still ran 24
        # VERIFY steps at c = 128 on the H200, ~2 plain steps each; session 5.)
        self.explore_every, self.explore_ratio = explore_every, explore_ratio
        self.max_backoff = max_backoff
        self.fresh_obs, self.fresh_gap = fresh_obs, fresh_gap
        self._since_probe = 0
        self._periods: dict[int, int] = {}  # padded batch size -> steps between probes
        self._last_probe: tuple | None = None  # (K, padded bs, predicted ms) of the last probe
        self._probe_error: float | None = None  # its measured time's relative error
        self._steps_speculating = 0
        self._last_fresh = 0  # the first fresh exploration comes after fresh_gap steps
        self._explorations = 0

    def scores(self, view: PolicyView, max_k: int) -> dict[int, tuple[float, float, float]]:
        """(expected tokens, predicted ms, tokens per ms) for every uniform K in 0..max_k, in
        one pass over the requests: E_i(K) = E_i(K - 1) + a_i^K (the planner runs every
        step, for every running request)."""
        bs = self.pad(len(view.requests))
        ctx = sum(r.num_tokens for r in view.requests)
        tokens = [float(len(view.requests))] * (max_k + 1)  # every request commits one token
        prior = self.population_prior(view)
        for r in view.requests:
            if not self.eligible(r):
                continue
            a = acceptance(r, prior, self.prior_weight)
            term, extra = 1.0, 0.0
            for k in range(1, max_k + 1):
                term *= a
                extra += term
                tokens[k] += extra
        out = {}
        for k, t in enumerate(tokens):
            ms = self.cost.predict(k, bs, ctx)
            out[k] = (t, ms, t / ms)
        return out

    def population_prior(self, view: PolicyView) -> float:
        num, den = view.population or (0.0, 0.0)
        return (num + self.prior * self.population_weight) / (den + self.population_weight)

    def plan(self, view: PolicyView) -> list[int]:
        max_k = min(self.max_k, view.max_k)
        if not any(self.eligible(r) for r in view.requests):
            return [0] * len(view.requests)
        scores = self.scores(view, max_k)
        best = max(scores, key=lambda k: scores[k][2])
        cur = min(self.current_k, max_k)
        if scores[best][2] <= scores[cur][2] * (1 + self.margin):
            best = cur  # hysteresis: not clearly better, keep the gear we are in
        bs = self.pad(len(view.requests))
        if best != self.current_k:  # a new gear: its estimates are new everywhere
            self._periods.clear()
            self._last_probe = None
        self.current_k = best
        self._since_probe += 1
        period = self._periods.get(bs, self.explore_every)
        probe = self._since_probe >= period
        if probe:
            self._since_probe = 0
            self._back_off()
        if best == 0:
            runner_up = max(range(1, max_k + 1), key=lambda k: scores[k][2], default=0)
            if (runner_up and probe
                    and scores[runner_up][2] >= self.explore_ratio * scores[0][2]):
                self._last_probe, self._probe_error = (runner_up, bs, scores[runner_up][1]), None
                return [runner_up if self.eligible(r) else 0 for r in view.requests]
        else:
            self._steps_speculating += 1
            if probe:
                self._last_probe, self._probe_error = (0, bs, scores[0][1]), None
                return [0] * len(view.requests)
            if self._since_probe == period // 2:
                k = self._neighbour(best, max_k, scores)
                return [k if self.eligible(r) else 0 for r in view.requests]
            if self._steps_speculating - self._last_fresh >= self.fresh_gap:
                k = self._unmeasured_neighbour(best, max_k, scores, bs)
                if k:
                    self._last_fresh = self._steps_speculating
                    return [k if self.eligible(r) else 0 for r in view.requests]
        self.last_prediction = {"k": best, "tokens": scores[best][0], "ms": scores[best][1],
                                "bs": len(view.requests),
                                "prior_acceptance": self.population_prior(view)}
        if log.isEnabledFor(logging.DEBUG):
            log.debug("goodput bs=%d -> K=%d | %s", len(view.requests), best, " ".join(
                f"K{k}:{t:.1f}tok/{ms:.2f}ms" for k, (t, ms, _) in scores.items()))
        return [best if self.eligible(r) else 0 for r in view.requests]

    def _back_off(self) -> None:
        """At a probe: if the previous probe's measured step time was within 10% of what
        was predicted, it confirmed the choice at its batch size: wait twice as long for
        the next probe there; if not (or it was not measured), probe there every
        explore_every steps again."""
        if self._last_probe is None:
            return
        bs = self._last_probe[1]
        settled = self._probe_error is not None and self._probe_error <= 0.1
        period = self._periods.get(bs, self.explore_every)
        self._periods[bs] = min(2 * period, self.explore_every * self.max_backoff) \
            if settled else self.explore_every

    def _neighbour(self, best: int, max_k: int, scores: dict) -> int:
        """The neighbour gear an exploration step tries while speculating at `best`: K + 1
        and K - 1 in turn, if predicted within explore_ratio of the best (else the other;
        else `best` itself: no exploration)."""
        self._explorations += 1
        order = (best + 1, best - 1) if self._explorations % 2 else (best - 1, best + 1)
        for k in order:
            if 0 < k <= max_k and scores[k][2] >= self.explore_ratio * scores[best][2]:
                return k
        return best

    def _unmeasured_neighbour(self, best: int, max_k: int, scores: dict, bs: int) -> int:
        """K + 1 or K - 1 (in that order), if predicted within explore_ratio of the best and
        measured online fewer than `fresh_obs` times at this (padded) batch size; else 0."""
        for k in (best + 1, best - 1):
            if (0 < k <= max_k and self.cost.observed(k, bs) < self.fresh_obs
                    and scores[k][2] >= self.explore_ratio * scores[best][2]):
                return k
        return 0

    def observe(self, k: int, bs: int, ctx_tokens: int, ms: float) -> None:
        bs = self.pad(bs)
        probe = self._last_probe
        if probe is not None and self._probe_error is None and (k, bs) == probe[:2]:
            self._probe_error = abs(ms - probe[2]) / probe[2]
        self.cost.observe(k, bs, ctx_tokens, ms)
