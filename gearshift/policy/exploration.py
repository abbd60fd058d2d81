"""The goodput policy's exploration: which step runs a gear other than the best-scored one, so
that the prices of gears not running stay measured. K = 0 probes (skipped where plain decode
is confirmed far behind), the neighbours K +- 1, neighbours not yet measured at this batch
size, the gear just left (rechecks), and at K = 0 one step for each new request with no
acceptance evidence of its own (newcomers) and for the best speculative gear while it
has fewer than fresh_obs online observations there; probes back off per padded batch
size while they confirm their predicted cost.

Data flow: GoodputPolicy._choose -> Explorer.step(scores, best, ...) -> the gear run this
step; GoodputPolicy.observe -> Explorer.observe (did the probe confirm its price?).
"""

from __future__ import annotations

from gearshift.policy.base import PolicyView
from gearshift.policy.cost import CostModel
from gearshift.policy.scoring import Scores, runner_up

CONFIRMED = 0.1  # a probe whose measured step is within this of its price confirms it


class Explorer:
    def __init__(self, cost: CostModel, num_draft_tokens: int, *, explore_every: int,
                 explore_ratio: float, max_backoff: int, fresh_obs: int, fresh_gap: int,
                 fresh_ratio: float, tree_evidence: float, explore_rate: float) -> None:
        self.cost = cost
        self.num_draft_tokens = num_draft_tokens
        # At K = 0, a K predicted within `explore_ratio` of the best is tried once in
        # `explore_every` steps (under heavy load a VERIFY step costs several plain ones:
        # clearly worse gears are not tried); while speculating, one step in `explore_every`
        # runs at K = 0, and one, half way, a neighbour K +- 1 predicted within explore_ratio
        # (else the start-up profile's error would stand). A neighbour with fewer than
        # `fresh_obs` online observations at this batch size is tried one step in
        # `fresh_gap`: a new load level is measured within its first steps. Probes back off
        # per padded batch size: one that confirms its predicted cost doubles the wait there
        # (up to `max_backoff` x explore_every), one that does not resets it; a new gear
        # resets every size. Per size, because under a closed loop's churn the batch size
        # changes most steps: one shared period would never back off.
        self.explore_every, self.explore_ratio = explore_every, explore_ratio
        self.max_backoff = max_backoff
        self.fresh_obs, self.fresh_gap = fresh_obs, fresh_gap
        # A neighbour with no online observation at this batch size is priced by the warm-up
        # alone (a few steps on dummy requests), which can overprice it past explore_ratio so
        # that it is never tried: it is tried if predicted within `fresh_ratio` of the best
        # (a one-off step per gear and batch size); measured ones need explore_ratio.
        self.fresh_ratio = fresh_ratio
        # The tree's gain starts at 1 (its prior: what the chain accepts) and moves with tree
        # steps only: until its evidence weighs `tree_evidence` (accepted + rejections, ~30
        # tree steps at batch 1), the tree is a fresh neighbour of the longest chain, tried
        # one step in fresh_gap. With fewer, a few unlucky first trees would keep the gain at
        # 1 and the tree untried where it pays.
        self.tree_evidence = tree_evidence
        # After a switch between speculative gears, the gear left is re-measured `fresh_obs`
        # times, one step in `fresh_gap`; every step at a gear other than the running one
        # (a probe, an exploration, such a recheck) moves its price by at least
        # `explore_rate`. A gear is often left because its own price was stale, and the EMA's
        # small steps at one exploration in explore_every would not correct it for long.
        self.explore_rate = explore_rate
        self._since_probe = 0
        self._periods: dict[int, int] = {}  # padded batch size -> steps between probes
        self._last_probe: tuple | None = None  # (K, padded bs, predicted ms) of the last probe
        self._probe_error: float | None = None  # its measured time's relative error
        self._plain_ok: dict[int, bool] = {}  # padded bs -> the last K = 0 probe confirmed
        self._steps_speculating = 0
        self._last_fresh = 0  # the first fresh exploration comes after fresh_gap steps
        self._explorations = 0
        self._recheck: list | None = None  # [gear left, rechecks left]
        self._recheck_next = 0  # _steps_speculating at which the next recheck may run
        # set by step() while speculating at the best gear: a due K = 0 probe was skipped
        # (plain decode settled), an unmeasured neighbour waits for its fresh_gap
        self._probe_skipped = False
        self._fresh_pending = False
        # At K = 0, a request with less acceptance evidence than this (accepted drafts +
        # rejections, decayed) is priced by the population's alone: if speculation is
        # predicted within explore_ratio of plain decode, one step tries it for the batch,
        # once per such request (`_newcomers_tried`), so a change of traffic back to text
        # the draft knows is seen within a step of its first request
        self.newcomer_evidence = 1.0
        self._newcomers_tried: set[str] = set()
        # At K = 0, the best speculative gear measured online fewer than fresh_obs times at
        # this batch size (one slow first step, a one-off, sets a point's price) is tried
        # again one plain step in fresh_gap while predicted within fresh_ratio of plain
        # decode, as a neighbour is while speculating
        self._plain_steps = 0
        self._last_fresh_plain = 0

    def period(self, bs: int) -> int:
        """Steps between K = 0 probes (or, at K = 0, speculative ones) at padded size bs."""
        return self._periods.get(bs, self.explore_every)

    def probe_due_next(self, bs: int) -> bool:
        return self._since_probe + 1 >= self.period(bs)

    def due_next(self, bs: int) -> bool:
        """Does the next plan at padded batch size `bs` owe a step to exploration (a probe,
        a neighbour, a fresh neighbour or a recheck)? Counters only: a plan that owes none
        may keep its gear without scoring."""
        nxt, period = self._since_probe + 1, self.period(bs)
        if (nxt >= period and not self._probe_skipped) or nxt % period == period // 2:
            return True
        if self._fresh_pending:
            return True
        return self._recheck is not None and self._steps_speculating + 1 >= self._recheck_next

    def count(self, speculating: bool) -> None:
        """A plan that took its gear without scoring: the counts towards probes run on."""
        self._since_probe += 1
        if speculating:
            self._steps_speculating += 1

    def switched(self, old: int, new: int) -> None:
        """The running gear changed: its estimates are new everywhere, and the speculative
        gear left is rechecked."""
        self._recheck = [old, self.fresh_obs] if new and old else None
        self._recheck_next = self._steps_speculating + 1 + self.fresh_gap
        self._periods.clear()
        self._last_probe = None

    def step(self, scores: Scores, best: int, top: int, bs: int, view: PolicyView,
             catch_up_ms: float) -> tuple[int, str]:
        """The gear this step runs, with the best-scored gear `best` running: -> (gear,
        "probe" | "newcomer" | "recheck" | "neighbour" | "fresh"), or (best, "scored").
        `catch_up_ms`: the draft's whole catch-up for these requests; a probe from K = 0 is
        skipped while it costs more than a plain step (the probe goes back to K = 0 and
        pays again at the next one)."""
        self._since_probe += 1
        self._probe_skipped = self._fresh_pending = False
        period = self.period(bs)
        probe = self._since_probe >= period
        if probe and best and self._plain_settled(scores, best, bs):
            probe = False  # nothing to learn at K = 0 here; the count runs on for other sizes
            self._probe_skipped = True
        if probe:
            self._since_probe = 0
            self._back_off()
        if best == 0:
            up = runner_up(scores, top)
            plausible = (up and catch_up_ms <= scores[0][1]
                         and scores[up][2] >= self.explore_ratio * scores[0][2])
            if plausible and probe:
                self._last_probe, self._probe_error = (up, bs, scores[up][1]), None
                return up, "probe"
            if plausible and self._new_requests(view):
                return up, "newcomer"
            self._plain_steps += 1
            if (up and catch_up_ms <= scores[0][1] and self.cost.observed(up, bs) < self.fresh_obs
                    and scores[up][2] >= self.fresh_ratio * scores[0][2]
                    and self._plain_steps - self._last_fresh_plain >= self.fresh_gap):
                self._last_fresh_plain = self._plain_steps
                return up, "fresh"
            return best, "scored"
        self._steps_speculating += 1
        if probe:
            self._last_probe, self._probe_error = (0, bs, scores[0][1]), None
            return 0, "probe"
        k = self._recheck_step(best, top)
        if k:
            return k, "recheck"
        if self._since_probe % period == period // 2:
            return self._neighbour(best, top, scores), "neighbour"
        fresh = self._unmeasured_neighbour(best, top, scores, bs, view)
        if fresh and self._steps_speculating - self._last_fresh >= self.fresh_gap:
            self._last_fresh = self._steps_speculating
            return fresh, "fresh"
        self._fresh_pending = bool(fresh)
        return best, "scored"

    def _new_requests(self, view: PolicyView) -> bool:
        """Does the batch hold a speculating request with little evidence of its own that
        no step has tried yet? Marks them tried."""
        new = {r.request_id for r in view.requests if r.params.speculative
               and r.spec_alpha_den < self.newcomer_evidence
               and r.request_id not in self._newcomers_tried}
        if new:  # only the batch's own: finished requests leave the set
            self._newcomers_tried = {r.request_id for r in view.requests} & (
                self._newcomers_tried | new)
        return bool(new)

    def observe(self, k: int, bs: int, ms: float) -> None:
        """A step at gear k, padded batch size bs, took ms: if it was the last probe, how far
        its price was off (see _back_off)."""
        probe = self._last_probe
        if probe is not None and self._probe_error is None and (k, bs) == probe[:2]:
            self._probe_error = abs(ms - probe[2]) / probe[2]
            if k == 0:
                self._plain_ok[bs] = self._probe_error <= CONFIRMED

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

    def _plain_settled(self, scores: Scores, best: int, bs: int) -> bool:
        """While speculating, a probe at K = 0 is skipped when the last one at this batch size
        confirmed plain decode's price (its device time varies little) and plain decode is
        predicted under explore_ratio of the best gear: such a probe gives one token per
        request where a VERIFY step gives several, and the next VERIFY step waits for it, to
        confirm what is known. Unconfirmed (a prior that may be wrong) or close to the best
        (load rising), the probe runs."""
        return self._plain_ok.get(bs, False) and scores[0][2] < self.explore_ratio * scores[best][2]

    def _back_off(self) -> None:
        """At a probe: if the previous probe's measured step time was within CONFIRMED of what
        was predicted, it confirmed the choice at its batch size: wait twice as long for
        the next probe there; if not (or it was not measured), probe there every
        explore_every steps again."""
        if self._last_probe is None:
            return
        bs = self._last_probe[1]
        settled = self._probe_error is not None and self._probe_error <= CONFIRMED
        period = self.period(bs)
        self._periods[bs] = min(2 * period, self.explore_every * self.max_backoff) \
            if settled else self.explore_every

    def _neighbour(self, best: int, top: int, scores: Scores) -> int:
        """The neighbour gear an exploration step tries while speculating at `best`: K + 1
        and K - 1 in turn, if predicted within explore_ratio of the best (else the other;
        else `best` itself: no exploration)."""
        self._explorations += 1
        order = (best + 1, best - 1) if self._explorations % 2 else (best - 1, best + 1)
        for k in order:
            if 0 < k <= top and scores[k][2] >= self.explore_ratio * scores[best][2]:
                return k
        return best

    def _unmeasured_neighbour(self, best: int, top: int, scores: Scores, bs: int,
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
            if (k > self.num_draft_tokens and scores[k][2] >= self.explore_ratio * scores[best][2]
                    and (view.tree_population or (0.0, 0.0))[1] < self.tree_evidence):
                return k
        return 0
