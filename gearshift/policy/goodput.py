"""`goodput` (the default policy): pick the gear that maximises expected committed tokens
per second for this step. Gears: 0 = plain decode, K = 1..max_k = chains of K drafts, and,
when the engine verifies trees (draft_topk > 1), max_k + 1 = one draft tree of depth max_k
per request.

    E_i(K) = (1 - a_i^(K+1)) / (1 - a_i)     expected tokens of request i with a chain of K
                                             (per-token acceptance a_i, EMA with a prior)
    E_i(tree) = 1 + (E_i(max_k) - 1) * g     g: the population's extra tokens per tree
                                             step over a max_k chain step (`tree_gain`)
    G(g)   = sum_i E_i(g) / (t(g, padded bs, context) + c(g))
                                             t from the CostModel; c (g > 0): the draft's
                                             catch-up over rows committed at K = 0, spread
                                             over the steps each request has left

Requests that opted out count 1 token at any gear. Hysteresis: the current K is kept unless
another K is predicted to be better by more than `margin` (2%: no flapping on noise, and
at most 2% lost to a gear that is better by less). Prices of gears not running stay fresh
by exploration: K = 0 probes (skipped where plain decode is confirmed far behind), the
neighbours K +- 1, and the gear just left (rechecks); the running gear's drift moves its
neighbours' prices too (CostModel.shared). A steady gear is rescored one plan in 4. As
batches grow, t(K) rises faster than E(K) (verification turns compute-bound): K = 0.

Data flow: Scheduler -> plan(view) -> K; Engine -> observe(...) -> CostModel; a VERIFY step,
before its sync -> prepare(view) -> the next plan's scores.
"""

from __future__ import annotations

import logging

import numpy as np

from gearshift.policy.base import Policy, PolicyView
from gearshift.policy.cost import CostModel

log = logging.getLogger("gearshift.policy")


def expected_tokens(alpha: float, k: int) -> float:
    if k == 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class GoodputPolicy(Policy):
    def __init__(self, cost: CostModel, max_k: int, *, prior: float = 0.6,
                 prior_weight: float = 4.0, population_weight: float = 10.0,
                 margin: float = 0.02, pad=lambda bs: bs,
                 explore_every: int = 64, explore_ratio: float = 0.8, max_backoff: int = 8,
                 fresh_obs: int = 2, fresh_gap: int = 4, quiet_ratio: float = 0.9,
                 quiet_steps: int = 7, tree_evidence: float = 100.0,
                 fresh_ratio: float = 0.5, catch_up_ms_per_row: float | None = None,
                 catch_up_min_rows: int = 1024, share_after: int = 16,
                 explore_rate: float = 0.5) -> None:
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
        self.last_scores: dict = {}  # gear -> (tokens, ms, tokens / ms) of the last scoring
        # Exploration keeps the prices of gears not in use fresh: at K = 0, a K predicted
        # within `explore_ratio` of the best is tried once in `explore_every` steps (under
        # heavy load a VERIFY step costs several plain ones: clearly worse gears are not
        # tried); while speculating, one step in `explore_every` runs at K = 0, and one, half
        # way, a neighbour K +- 1 predicted within explore_ratio (else the start-up profile's
        # error would stand). A neighbour with fewer than `fresh_obs` online observations at
        # this batch size is tried one step in `fresh_gap`: a new load level is measured
        # within its first steps. Probes back off per padded batch size: one that confirms
        # its predicted cost doubles the wait there (up to `max_backoff` x explore_every),
        # one that does not resets it; a new gear resets every size. (One shared period,
        # reset at every padded batch change, never backed off under a closed loop's churn:
        # 24 VERIFY steps at c = 128 on the H200, ~2 plain steps each; session 5.)
        self.explore_every, self.explore_ratio = explore_every, explore_ratio
        self.max_backoff = max_backoff
        self.fresh_obs, self.fresh_gap = fresh_obs, fresh_gap
        # A neighbour with no online observation at this batch size is priced by the warm-up
        # alone, three steps on dummy requests: on the H200 (session 7) it put K = 3 at batch
        # 32 at 10.3 ms where real steps took ~7.9, so K = 3 scored under explore_ratio and
        # was never tried. Such a neighbour is tried if predicted within `fresh_ratio` of the
        # best (a one-off step per gear and batch size); measured ones need explore_ratio.
        self.fresh_ratio = fresh_ratio
        # The tree's gain starts at 1 (its prior: what the chain accepts) and moves with tree
        # steps only: until its evidence weighs `tree_evidence` (accepted + rejections, ~30
        # tree steps at batch 1), the tree is a fresh neighbour of the longest chain, tried
        # one step in fresh_gap. Without this, on the H200 (session 6, call D) goodput ran
        # 59 tree request-steps of 707 at c = 1, where the tree alone was 3.4% faster than
        # the chain it kept to: its few tree steps barely moved the prior. At 20 (~7 tree
        # steps) the gain stayed 1.00 for 500 steps at c = 1 (session 11, call C: its first
        # trees accepted what their top-1 chains did), where trees gave 1.2x the extra tokens.
        self.tree_evidence = tree_evidence
        self._since_probe = 0
        self._periods: dict[int, int] = {}  # padded batch size -> steps between probes
        self._last_probe: tuple | None = None  # (K, padded bs, predicted ms) of the last probe
        self._probe_error: float | None = None  # its measured time's relative error
        self._steps_speculating = 0
        self._last_fresh = 0  # the first fresh exploration comes after fresh_gap steps
        self._explorations = 0
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
        self._prepared: tuple | None = None  # ((requests, top gear), scores) from prepare()
        # Leaving K = 0 has a price the step-time model does not see: the draft first catches
        # up over every row the requests committed plainly (measured apart, the price of
        # those plain steps). Speculative gears are scored with that catch-up spread over
        # the steps each request has left to speculate (its remaining max_tokens over its
        # expected tokens per step), and a probe from K = 0 is skipped while the whole
        # catch-up costs more than a plain step: a probe goes back to K = 0 and pays again at
        # the next one (H200, session 8: at c = 256 probes after long plain stretches took
        # 47-53 ms, the draft re-reading ~64 rows of every request). ms per row: the cost
        # model's prior (~1 us on the H200 for the 8B bench pair), then measured on
        # catch-ups of >= `catch_up_min_rows` rows: a small one is mostly fixed cost, and fed
        # from c = 2 on it priced rows at ~100x and kept K = 0 at c = 128 (session 8, F).
        if catch_up_ms_per_row is None:
            catch_up_ms_per_row = cost.catch_up_ms_per_row
        self.catch_up_ms_per_row = 1e-3 if catch_up_ms_per_row is None else catch_up_ms_per_row
        self.catch_up_min_rows = catch_up_min_rows
        self._catch_up_obs = 0
        self._catch_up_full = 0.0  # the whole catch-up of the requests scored last, ms
        self.share_after = share_after
        self._steady = 0  # observations of the current gear since it became current
        self._plain_ok: dict[int, bool] = {}  # padded bs -> the last K = 0 probe confirmed
        # After a switch between speculative gears, the gear left is re-measured `fresh_obs`
        # times, one step in `fresh_gap`; every step at a gear other than the running one
        # (a probe, an exploration, such a recheck) moves its price by at least
        # `explore_rate`. A gear is left because another looked better, often because its
        # own price was stale: on the H200 (session 9, call E, c = 4) K = 4 carried a price
        # 11% over its real steps into a pass, goodput ran the tree and K = 3 instead, and
        # the neighbour explorations (K = 4 once in 128 steps, each moving its price by the
        # EMA's 10%) never corrected it within the pass.
        self.explore_rate = explore_rate
        self._recheck: list | None = None  # [gear left, rechecks left]
        self._recheck_next = 0  # _steps_speculating at which the next recheck may run
        # Up to this many eligible requests (none behind: no catch-up to amortise) the
        # chains' expected tokens are summed in plain Python: numpy's per-call costs made
        # scoring at batch 8 ~4x slower (18 vs 5 us on a CPU)
        self.python_max = 32
        # A scored speculative gear is kept unscored for up to `rescore_every` - 1 plans at
        # the same padded batch size (churn changes the count, rarely the graph) and top
        # gear, unless a probe, exploration or recheck is due, or a step lands over
        # `rescore_error` off its price. Scoring was ~3/4 of goodput's host work at batch 8
        # (CPU: prepare 26, plan 10, observe 6 us): ~0.1 ms per ~7.3 ms VERIFY step
        # against always-4 at c = 8 on the H200 (session 10).
        self.rescore_every, self.rescore_error = 4, 0.1
        # (padded bs, top gear, plans left, a due K = 0 probe was skipped: plain is settled)
        self._reuse: tuple[int, int, int, bool] | None = None
        self.reused = 0  # plans that kept the gear without scoring (benches report it)
        self.last_reason = ""  # why the last plan took its gear (diagnostics)

    def scores(self, view: PolicyView, top: int) -> dict[int, tuple[float, float, float]]:
        """(expected tokens, predicted ms, tokens per ms) for every uniform gear in 0..top.
        Chains: sum_i E_i(K) = n + sum_i sum_{j <= K} a_i^j, over arrays (the planner runs
        every step, for every running request: a Python loop over 128 requests took 0.2-0.4
        ms, and a VERIFY step waits for it). The draft tree (gear max_k + 1): the chains'
        extra tokens at max_k times `tree_gain`."""
        reqs = view.requests
        n = len(reqs)
        bs = self.pad(n)
        ctx = sum(r.num_tokens for r in reqs)
        depth = min(top, self.max_k)
        tokens = [float(n)] * (top + 1)  # every request commits one token
        catch = [0.0] * (top + 1)  # amortised catch-up ms per step, per gear
        self._catch_up_full = 0.0
        prior = self.population_prior(view)
        elig = [r for r in reqs if r.params.speculative]
        if elig and depth:
            behind = view.draft_catches_up and any(
                r.num_computed_tokens > r.draft_rows for r in elig)
            if len(elig) <= self.python_max and not behind:
                extra = self._chain_sums(elig, prior, depth)
            else:
                w = self.prior_weight
                num = np.fromiter((r.spec_alpha_num for r in elig), np.float64, len(elig))
                den = np.fromiter((r.spec_alpha_den for r in elig), np.float64, len(elig))
                # per-token acceptance: accepted / (accepted + rejections), around the prior
                a = np.minimum((num + prior * w) / (den + w), 0.999)  # num, den >= 0
                powers = a[:, None] ** np.arange(1, depth + 1)  # [requests, K]: a_i^j
                extra = np.cumsum(powers.sum(axis=0)).tolist()
                if behind:
                    self._amortised_catch_up(elig, powers, catch)
            for k in range(1, depth + 1):
                tokens[k] += extra[k - 1]
        if top > self.max_k:
            tokens[top] = n + (tokens[self.max_k] - n) * self.tree_gain(view, prior)
            catch[top] = catch[self.max_k]
        out = {}
        for k, t in enumerate(tokens):
            ms = self.cost.predict(k, bs, ctx)
            out[k] = (t, ms, t / (ms + catch[k]))
        return out

    def _chain_sums(self, elig: list, prior: float, depth: int) -> list[float]:
        """sum_i sum_{j <= K} a_i^j for K = 1..depth, in plain Python: what the arrays compute,
        for the small batches where numpy's per-call cost dominated (`python_max`)."""
        w = self.prior_weight
        pw = prior * w
        sums = [0.0] * depth
        for r in elig:
            a = min((r.spec_alpha_num + pw) / (r.spec_alpha_den + w), 0.999)
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
        self._catch_up_full = float(rows_ms.sum())
        if self._catch_up_full <= 0.0:
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

    def population_prior(self, view: PolicyView) -> float:
        num, den = view.population or (0.0, 0.0)
        return (num + self.prior * self.population_weight) / (den + self.population_weight)

    def tree_gain(self, view: PolicyView, chain_prior: float) -> float:
        """Extra tokens of a tree step over a max_k chain step, from the population's tree
        steps: the drafts they accepted over what their own top-1 chains accepted (the same
        steps, the same text), both with `population_weight` x `chain_prior` accepted drafts
        of prior (no evidence: gain 1, a tree accepts what its top-1 chain would). A
        population ratio, paired: evidence from different stretches of text made goodput
        flap (H200, sessions 6-7). Per-depth rates through E(a, max_k) understated the
        ratio (session 11 call C, c = 4: 1.11 where trees accepted 1.15x their top-1 chains
        and the tree policy 1.18x always-4's chains). Without the paired chain evidence (a
        2-tuple), per-depth acceptance against `chain_prior`."""
        num, den, *pair = view.tree_population or (0.0, 0.0)
        w, c = self.population_weight, min(chain_prior, 0.999)
        if pair:
            return (num + c * w) / max(pair[0] + c * w, 1e-9)
        tree = min((num + c * w) / (den + w), 0.999)
        return (expected_tokens(tree, self.max_k) - 1.0) / max(expected_tokens(c, self.max_k) - 1.0, 1e-9)

    def top_gear(self, view: PolicyView) -> int:
        """The highest gear this step may take: max K, or max K + 1 (the draft tree) when the
        engine verifies trees and the cost model knows their price."""
        max_k = min(self.max_k, view.num_draft_tokens)
        if view.topk > 1 and max_k == self.max_k and self.max_k + 1 in self.cost.base:
            return self.max_k + 1
        return max_k

    def step_topk(self, view: PolicyView) -> int:
        return self._topk

    def prepare(self, view: PolicyView) -> None:
        """Score the gears for these requests while the device runs their VERIFY step (unless
        the next plan keeps its gear unscored): the next plan() uses the scores at the same
        padded batch size and top gear. They lag one step of evidence (EMA steps ~10%)."""
        top, bs = self.top_gear(view), self.pad(len(view.requests))
        self._prepared = None if self._reuse_due(bs, top) else ((bs, top), self.scores(view, top))

    def _reuse_due(self, bs: int, top: int) -> bool:
        """Does the next plan, at padded batch size `bs` with top gear `top`, keep the running
        gear without scoring (see rescore_every)? Counters only: the same answer in prepare()
        and in the plan() after it."""
        r, nxt = self._reuse, self._since_probe + 1
        if r is None or r[2] <= 0 or (r[0], r[1]) != (bs, top) or not self.current_k:
            return False
        period = self._periods.get(bs, self.explore_every)
        if (nxt >= period and not r[3]) or nxt % period == period // 2:
            return False  # a probe or an exploration
        return self._recheck is None or self._steps_speculating + 1 < self._recheck_next

    def plan(self, view: PolicyView) -> list[int]:
        self._topk = 1
        prepared, self._prepared = self._prepared, None  # for this plan only
        if not any(self.eligible(r) for r in view.requests):
            return [0] * len(view.requests)
        top = self.top_gear(view)
        scores = prepared[1] if prepared and prepared[0] == (self.pad(len(view.requests)), top) \
            else None
        gear = self._choose(view, top, scores)
        if gear > self.max_k:
            self._topk = view.topk
        k = min(gear, self.max_k)
        return [k if self.eligible(r) else 0 for r in view.requests]

    def gear_name(self, gear: int) -> str:
        return "tree" if gear > self.max_k else f"K{gear}"

    def _choose(self, view: PolicyView, top: int, scores: dict | None = None) -> int:
        """This step's gear: the best predicted (with hysteresis), or a probe. `scores`:
        prepared ones (see prepare), else computed now."""
        bs = self.pad(len(view.requests))
        if (self._quiet is not None and self._quiet[0] == bs
                and self._since_probe + 1 < self._periods.get(bs, self.explore_every)):
            # plain decode by a wide margin at this batch size: the next steps need no
            # scores (their host time is a plain step's, every step, under the heaviest load)
            self._quiet = (bs, self._quiet[1] - 1) if self._quiet[1] > 1 else None
            self._since_probe += 1
            self.last_reason = "quiet"
            return 0
        self._quiet = None
        if scores is None and self._reuse_due(bs, top):
            self._reuse = (bs, top, self._reuse[2] - 1, self._reuse[3])
            self._since_probe += 1
            self._steps_speculating += 1
            self.reused += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug("goodput bs=%d -> %s (kept, unscored)", len(view.requests),
                          self.gear_name(self.current_k))
            self.last_reason = "kept"
            return self.current_k
        self._reuse = None
        scores = scores or self.scores(view, top)
        self.last_scores = scores  # for diagnostics (scripts/diag_goodput_steps.py)
        best = max(scores, key=lambda k: scores[k][2])
        cur = min(self.current_k, top)
        if scores[best][2] <= scores[cur][2] * (1 + self.margin):
            best = cur  # hysteresis: not clearly better, keep the gear we are in
        if best != self.current_k:  # a new gear: its estimates are new everywhere
            self._steady = 0
            self._recheck = [self.current_k, self.fresh_obs] if best and self.current_k else None
            self._recheck_next = self._steps_speculating + 1 + self.fresh_gap
            self._periods.clear()
            self._last_probe = None
            self.switches += 1
        self.current_k = best
        self._since_probe += 1
        period = self._periods.get(bs, self.explore_every)
        probe = self._since_probe >= period
        settled = False
        if probe and best and self._plain_settled(scores, best, bs):
            probe = False  # nothing to learn at K = 0 here; the count runs on for other sizes
            settled = True
        if probe:
            self._since_probe = 0
            self._back_off()
        if best == 0:
            runner_up = max(range(1, top + 1), key=lambda k: scores[k][2], default=0)
            if not runner_up or scores[runner_up][2] < self.quiet_ratio * scores[0][2]:
                self._quiet = (bs, self.quiet_steps)
            if (runner_up and probe and self._catch_up_full <= scores[0][1]
                    and scores[runner_up][2] >= self.explore_ratio * scores[0][2]):
                self._last_probe, self._probe_error = (runner_up, bs, scores[runner_up][1]), None
                self.last_reason = "probe"
                return runner_up
        else:
            self._steps_speculating += 1
            if probe:
                self._last_probe, self._probe_error = (0, bs, scores[0][1]), None
                self.last_reason = "probe"
                return 0
            k = self._recheck_step(best, top)
            if k:
                self.last_reason = "recheck"
                return k
            if self._since_probe % period == period // 2:
                self.last_reason = "neighbour"
                return self._neighbour(best, top, scores)
            fresh = self._unmeasured_neighbour(best, top, scores, bs, view)
            if fresh and self._steps_speculating - self._last_fresh >= self.fresh_gap:
                self._last_fresh = self._steps_speculating
                self.last_reason = "fresh"
                return fresh
            if not fresh:  # no fresh exploration pending: the next plans may keep this gear
                self._reuse = (bs, top, self.rescore_every - 1, settled)
        self.last_prediction = {"k": min(best, self.max_k), "gear": self.gear_name(best),
                                "tokens": scores[best][0], "ms": scores[best][1],
                                "bs": len(view.requests),
                                "prior_acceptance": self.population_prior(view)}
        if log.isEnabledFor(logging.DEBUG):
            log.debug("goodput bs=%d -> %s | %s", len(view.requests), self.gear_name(best),
                      " ".join(f"{self.gear_name(k)}:{t:.1f}tok/{ms:.2f}ms"
                               for k, (t, ms, _) in scores.items()))
        self.last_reason = "scored"
        return best

    def _recheck_step(self, best: int, top: int) -> int:
        """The speculative gear just left, if a recheck of it is due (see explore_rate);
        else 0."""
        if self._recheck is None:
            return 0
        gear, left = self._recheck
        if gear == best or not 0 < gear <= top:
            self._recheck = None
            return 0
        if self._steps_speculating < self._recheck_next:
            return 0
        self._recheck = [gear, left - 1] if left > 1 else None
        self._recheck_next = self._steps_speculating + self.fresh_gap
        return gear

    def _plain_settled(self, scores: dict, best: int, bs: int) -> bool:
        """While speculating, a probe at K = 0 is skipped when the last one at this batch size
        confirmed plain decode's price (within 10%: its device time, which varies little) and
        plain decode is predicted under explore_ratio of the best gear. Such a probe cost ~1%
        of the throughput at c = 2..16 on the H200 (session 9, call E: its plain step gave c
        tokens where a VERIFY step gave ~3.4c, and the next VERIFY step waited for it) to
        confirm what was known. Unconfirmed (a prior that may be wrong) or close to the best
        (load rising), the probe runs."""
        return self._plain_ok.get(bs, False) and scores[0][2] < self.explore_ratio * scores[best][2]

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

    def _neighbour(self, best: int, top: int, scores: dict) -> int:
        """The neighbour gear an exploration step tries while speculating at `best`: K + 1
        and K - 1 in turn, if predicted within explore_ratio of the best (else the other;
        else `best` itself: no exploration)."""
        self._explorations += 1
        order = (best + 1, best - 1) if self._explorations % 2 else (best - 1, best + 1)
        for k in order:
            if 0 < k <= top and scores[k][2] >= self.explore_ratio * scores[best][2]:
                return k
        return best

    def _unmeasured_neighbour(self, best: int, top: int, scores: dict, bs: int,
                              view: PolicyView) -> int:
        """K + 1 or K - 1 (in that order), if measured online fewer than `fresh_obs` times at
        this (padded) batch size and predicted within explore_ratio of the best (within
        fresh_ratio while only the warm-up priced it), or, for the tree, while its
        acceptance evidence weighs less than `tree_evidence`; else 0."""
        for k in (best + 1, best - 1):
            if not 0 < k <= top:
                continue
            seen = self.cost.observed(k, bs)
            ratio = self.explore_ratio if seen else min(self.fresh_ratio, self.explore_ratio)
            if scores[k][2] < ratio * scores[best][2]:
                continue
            if seen < self.fresh_obs:
                return k
            if (k > self.max_k and scores[k][2] >= self.explore_ratio * scores[best][2]
                    and (view.tree_population or (0.0, 0.0))[1] < self.tree_evidence):
                return k
        return 0

    def observe(self, k: int, bs: int, ctx_tokens: int, ms: float) -> None:
        bs = self.pad(bs)
        probe = self._last_probe
        if probe is not None and self._probe_error is None and (k, bs) == probe[:2]:
            self._probe_error = abs(ms - probe[2]) / probe[2]
            if k == 0:
                self._plain_ok[bs] = self._probe_error <= 0.1
        # the running gear's drift moves its neighbours too (CostModel.shared), once it has
        # run `share_after` steps: its first steps correct its own price (chosen when noise
        # made it look best), which is not drift. A probe's or an exploration's step prices
        # only its own gear.
        steady = k == self.current_k
        self._steady = self._steady + 1 if steady else self._steady
        pred = self.cost.observe(k, bs, ctx_tokens, ms,
                                 share=steady and self._steady > self.share_after,
                                 min_rate=0.0 if steady else self.explore_rate)
        if pred is not None and abs(ms - pred) > self.rescore_error * pred:
            self._reuse = None  # a step far off its price: score the next plan
        if pred is not None:  # how well the model predicted this step
            log_ = self.prediction_log.setdefault("verify" if k else "plain", [0.0, 0.0, 0])
            log_[0] += ms
            log_[1] += pred
            log_[2] += 1
