"""The goodput policy's scores: expected committed tokens per millisecond at every gear, for
the running requests of one step. Gears: 0 = plain decode, K = 1..num_draft_tokens = chains
of K drafts, num_draft_tokens + 1 = one draft tree of that depth per request.

    E_i(K) = (1 - a_i^(K+1)) / (1 - a_i)     expected tokens of request i with a chain of K
                                             (per-token acceptance a_i, EMA with a prior:
                                             its sampling class's population)
    E_i(tree) = 1 + (E_i(depth) - 1) * g     g: the population's extra tokens per tree step
                                             over a chain of the same depth (`tree_gain`)
    G(g)   = sum_i E_i(g) / (t(g, padded bs, context) + c(g))
                                             t from the CostModel; c (g > 0): the draft's
                                             catch-up over rows committed at K = 0, spread
                                             over the steps each request has left

Requests that opted out count 1 token at any gear.

Data flow: GoodputPolicy.prepare / plan -> GearScorer.scores(view, top) -> the gear choice;
Engine (a VERIFY step's catch-up) -> GoodputPolicy.observe_catch_up -> GearScorer.
"""

from __future__ import annotations

import numpy as np

from gearshift.policy.base import PolicyView
from gearshift.policy.cost import CostModel

Scores = dict[int, tuple[float, float, float]]  # gear -> (tokens, predicted ms, tokens per ms)


def expected_tokens(alpha: float, k: int) -> float:
    """Expected committed tokens of a chain of k drafts at per-token acceptance alpha."""
    if k == 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def runner_up(scores: Scores, top: int) -> int:
    """The best speculative gear in 1..top (0: none)."""
    return max(range(1, top + 1), key=lambda k: scores[k][2], default=0)


class GearScorer:
    def __init__(self, cost: CostModel, num_draft_tokens: int, pad, *, prior: float,
                 prior_weight: float, population_weight: float,
                 catch_up_ms_per_row: float | None, catch_up_min_rows: int) -> None:
        self.cost = cost
        self.num_draft_tokens = num_draft_tokens
        self.pad = pad  # batch size -> padded (graph) batch size
        # a request's prior: the population's acceptance (evidence over recent requests),
        # itself with `prior` at `population_weight` (one unlucky first step is not the norm)
        self.prior, self.prior_weight = prior, prior_weight
        self.population_weight = population_weight
        # Leaving K = 0 has a price the step-time model does not see: the draft first catches
        # up over every row the requests committed plainly (measured apart from those plain
        # steps). Speculative gears are scored with that catch-up spread over the steps each
        # request has left to speculate (its remaining max_tokens over its expected tokens per
        # step). ms per row: the cost model's prior, then measured on catch-ups of at least
        # `catch_up_min_rows` rows: a small one is mostly fixed cost and would price rows far
        # too high, which keeps large batches at K = 0.
        if catch_up_ms_per_row is None:
            catch_up_ms_per_row = cost.catch_up_ms_per_row
        self.catch_up_ms_per_row = 1e-3 if catch_up_ms_per_row is None else catch_up_ms_per_row
        self.catch_up_min_rows = catch_up_min_rows
        self._catch_up_obs = 0
        self.catch_up_full = 0.0  # the whole catch-up of the requests scored last, ms
        # Up to this many eligible requests (none behind: no catch-up to amortise) the
        # chains' expected tokens are summed in plain Python: numpy's per-call cost dominates
        # scoring at small batches
        self.python_max = 32

    def scores(self, view: PolicyView, top: int) -> Scores:
        """(expected tokens, predicted ms, tokens per ms) for every uniform gear in 0..top.
        Chains: sum_i E_i(K) = n + sum_i sum_{j <= K} a_i^j, over arrays (this runs every
        step, for every running request, and a VERIFY step waits for it: a Python loop is
        too slow at large batches). The draft tree (gear num_draft_tokens + 1): the chains'
        extra tokens at full depth times `tree_gain`."""
        reqs = view.requests
        n = len(reqs)
        bs = self.pad(n)
        ctx = sum(r.num_tokens for r in reqs)
        depth = min(top, self.num_draft_tokens)  # of the chains scored
        tokens = [float(n)] * (top + 1)  # every request commits one token
        catch = [0.0] * (top + 1)  # amortised catch-up ms per step, per gear
        self.catch_up_full = 0.0
        priors = self.priors(view)
        elig = [r for r in reqs if r.params.speculative]
        prior = priors[True]
        if elig and depth:
            behind = view.draft_catches_up and any(
                r.num_computed_tokens > r.draft_rows for r in elig)
            if len(elig) <= self.python_max and not behind:
                extra = self._chain_sums(elig, priors, depth)
            else:
                w = self.prior_weight
                num = np.fromiter((r.spec_alpha_num for r in elig), np.float64, len(elig))
                den = np.fromiter((r.spec_alpha_den for r in elig), np.float64, len(elig))
                pr = np.fromiter((priors[r.params.greedy] for r in elig), np.float64, len(elig))
                # per-token acceptance: accepted / (accepted + rejections), around the prior
                a = np.minimum((num + pr * w) / (den + w), 0.999)  # num, den >= 0
                powers = a[:, None] ** np.arange(1, depth + 1)  # [requests, K]: a_i^j
                extra = np.cumsum(powers.sum(axis=0)).tolist()
                if behind:
                    self._amortised_catch_up(elig, powers, catch)
            prior = sum(priors[r.params.greedy] for r in elig) / len(elig)
            for k in range(1, depth + 1):
                tokens[k] += extra[k - 1]
        if top > self.num_draft_tokens:  # the tree: its gain over the full-depth chain
            tokens[top] = n + (tokens[depth] - n) * self.tree_gain(view, prior)
            catch[top] = catch[depth]
        out = {}
        for k, t in enumerate(tokens):
            ms = self.cost.predict(k, bs, ctx)
            out[k] = (t, ms, t / (ms + catch[k]))
        return out

    def _chain_sums(self, elig: list, priors: dict[bool, float], depth: int) -> list[float]:
        """sum_i sum_{j <= K} a_i^j for K = 1..depth, in plain Python: what the arrays compute,
        for the small batches where numpy's per-call cost dominates (`python_max`)."""
        w = self.prior_weight
        pw = {greedy: p * w for greedy, p in priors.items()}
        sums = [0.0] * depth
        for r in elig:
            a = min((r.spec_alpha_num + pw[r.params.greedy]) / (r.spec_alpha_den + w), 0.999)
            p = 1.0
            for j in range(depth):
                p *= a
                sums[j] += p
        acc, out = 0.0, []
        for x in sums:
            acc += x
            out.append(acc)
        return out

    def _amortised_catch_up(self, elig: list, powers: np.ndarray, catch: list) -> None:
        """catch[k] += the draft's catch-up over each request's rows behind, spread over the
        steps it has left at gear k (remaining tokens / E_i(k), at least one step)."""
        behind = np.fromiter((r.num_computed_tokens - r.draft_rows for r in elig), np.float64,
                             len(elig))
        rows_ms = np.maximum(behind, 0.0) * self.catch_up_ms_per_row
        self.catch_up_full = float(rows_ms.sum())
        if self.catch_up_full <= 0.0:
            return
        left = np.fromiter((r.params.max_tokens - len(r.output_token_ids) for r in elig),
                           np.float64, len(elig))
        per_step = 1.0 + np.cumsum(powers, axis=1)  # [requests, K]: E_i(k)
        share = np.minimum(per_step / np.maximum(left, 1.0)[:, None], 1.0)
        spread = (rows_ms[:, None] * share).sum(axis=0)
        for k in range(1, powers.shape[1] + 1):
            catch[k] += float(spread[k - 1])

    def observe_catch_up(self, rows: int, ms: float) -> None:
        """A VERIFY step's catch-up: `rows` draft rows in `ms`. Only large ones measure the
        cost per row (see catch_up_min_rows): the first replaces the prior, then an EMA."""
        if rows < max(self.catch_up_min_rows, 1) or ms <= 0:
            return
        per_row = ms / rows
        rate = 1.0 if self._catch_up_obs == 0 else 0.2
        self.catch_up_ms_per_row += rate * (per_row - self.catch_up_ms_per_row)
        self._catch_up_obs += 1

    def population_prior(self, view: PolicyView, greedy: bool = True) -> float:
        """The acceptance prior of a request of this sampling class: its class's population
        evidence with `prior` at `population_weight`."""
        num, den = view.population[not greedy] if view.population else (0.0, 0.0)
        return (num + self.prior * self.population_weight) / (den + self.population_weight)

    def priors(self, view: PolicyView) -> dict[bool, float]:
        """request.params.greedy -> population_prior"""
        return {True: self.population_prior(view, True), False: self.population_prior(view, False)}

    def tree_gain(self, view: PolicyView, chain_prior: float) -> float:
        """Extra tokens of a tree step over a full-depth chain step, from the population's tree
        steps: the drafts they accepted over what their own top-1 chains accepted (the same
        steps, the same text), both with `population_weight` x `chain_prior` accepted drafts
        of prior (no evidence: gain 1, a tree accepts what its top-1 chain would). A ratio
        over the same steps: evidence from different stretches of text makes the choice flap,
        and per-depth rates through E(a, depth) understate the gain. Without the paired chain
        evidence (a 2-tuple), per-depth acceptance against `chain_prior`."""
        num, den, *pair = view.tree_population or (0.0, 0.0)
        w, c = self.population_weight, min(chain_prior, 0.999)
        if pair:
            return (num + c * w) / max(pair[0] + c * w, 1e-9)
        tree = min((num + c * w) / (den + w), 0.999)
        n = self.num_draft_tokens
        return (expected_tokens(tree, n) - 1.0) / max(expected_tokens(c, n) - 1.0, 1e-9)
