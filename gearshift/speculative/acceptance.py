"""Acceptance bookkeeping of VERIFY steps: the engine's speculation counters (spec_stats)
and the acceptance evidence the policy prices drafts with, per request (Request.spec_alpha_*)
and over all recent requests (the population: chains per sampling class, trees, and the
trees' top-1 chains).

Data flow: SpecRunner.after_commit -> Acceptance.record (per request of a VERIFY step);
SpecRunner.after_plain -> age(req), age_population(); Scheduler (PolicyView) <- population / tree_population.
"""

from __future__ import annotations

from collections import Counter

from gearshift.request import Request

# Per-token acceptance evidence of a request (accepted drafts, accepted + rejections) decays
# by this per step: per VERIFY step (recent text weighs most), and per plain step too, so a
# request the policy stopped speculating for (it read a hard stretch of text) drifts back
# to the population's acceptance and is tried again instead of staying at K = 0 on stale
# evidence.
ALPHA_DECAY = 0.9
# The same evidence over all requests decays by this per request-step, speculative or
# plain: after a stretch of hard text at K = 0 it fades towards the policy's prior as fast
# as VERIFY steps would have renewed it (~230 request-steps to a tenth: 29 plain steps of
# 8 requests), so later requests are priced to try speculation again rather than inherit
# that stretch
POPULATION_DECAY = 0.99


class Acceptance:
    def __init__(self, tree: bool) -> None:
        self.tree = tree  # the engine verifies draft trees too
        # steps_by_k.*, chain_steps, tree_steps, proposed, accepted, tree_accepted,
        # tree_top1_accepted, accept_len.*, catch_up_rows, catch_up_ms, mixed_k_steps
        self.stats: Counter = Counter()
        # evidence over all requests (EMA): [chains of greedy requests, trees, the top-1
        # chains of those trees (same steps), chains of sampled requests], each [accepted,
        # accepted + rejections]. Greedy and sampled text are accepted at very different
        # rates (a sampled token is a draw, not the draft's argmax): one population would
        # price sampled newcomers by greedy evidence and keep them speculating at a loss
        self._pop = [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]

    def counters(self) -> tuple:
        """Everything a run counts here, for restore_counters: the start-up warm-up is not
        part of any run."""
        return self.stats.copy(), [list(p) for p in self._pop]

    def restore_counters(self, saved: tuple) -> None:
        self.stats.clear()
        self.stats.update(saved[0])
        self._pop = [list(p) for p in saved[1]]

    def population(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """Chain acceptance evidence over the last ~100 request-steps of each sampling class:
        ((accepted drafts, accepted + rejections) of greedy requests, the same of sampled
        ones). The policy's prior for a request with little evidence of its own (new, or
        long at K = 0)."""
        return (self._pop[0][0], self._pop[0][1]), (self._pop[3][0], self._pop[3][1])

    def tree_population(self) -> tuple[float, float, float, float] | None:
        """The same evidence from tree steps, then what their top-1 chains accepted on the
        same steps (None: the engine verifies chains only)."""
        return (*self._pop[1], *self._pop[2]) if self.tree else None

    def age_population(self, greedy: int, sampled: int) -> None:
        """A plain step of `greedy` + `sampled` decoding requests: each class's chain
        evidence fades as much as that many VERIFY request-steps of the class would age it
        (POPULATION_DECAY); the tree evidence (both classes) by all of them."""
        for pop, steps in ((self._pop[0], greedy), (self._pop[1], greedy + sampled),
                           (self._pop[2], greedy + sampled), (self._pop[3], sampled)):
            decay = POPULATION_DECAY ** steps
            pop[0] *= decay
            pop[1] *= decay

    def record_step(self, ks: list[int]) -> None:
        """One VERIFY step's plan: does it mix different non-zero K?"""
        if len({k for k in ks if k}) > 1:
            self.stats["mixed_k_steps"] += 1

    def record(self, req: Request, k: int, topk: int, proposed: int, accepted: int,
               chain: int = -1, evidence: bool = True) -> None:
        """One request's VERIFY outcome (its own proposed / accepted counters are the
        caller's). `chain`: on a tree step, what the tree's top-1 chain alone accepted
        (-1: unknown). `evidence`: False where another proposer than the one priced by
        this evidence drafted (suffix decoding beside EAGLE-3): counted, and the
        request's evidence ages as on a plain step."""
        self.stats[f"steps_by_k.{k}"] += 1
        if not evidence:
            age(req)
        elif proposed:  # per-token acceptance estimate for the goodput policy (EMA), per shape
            # a tree reaches depth k with fewer rejections than a chain: tree steps are the
            # population's tree evidence, and what their top-1 chains accepted is the
            # paired chain evidence of the same steps (goodput's tree gain: same text, both
            # shapes). That top-1 chain is also the request's chain evidence, so it stays
            # current on trees; without it (sampled rows) the chain evidence ages
            rejected = 1.0 if accepted < min(k, proposed) else 0.0
            chains = self._pop[0 if req.params.greedy else 3]
            _decay_add(self._pop[1] if topk > 1 else chains, accepted, rejected)
            chain_ev = (accepted, rejected) if topk == 1 else \
                (chain, 1.0 if chain < k else 0.0) if chain >= 0 else None
            if chain_ev is None:
                age(req)
            else:
                req.spec_alpha_num = ALPHA_DECAY * req.spec_alpha_num + chain_ev[0]
                req.spec_alpha_den = ALPHA_DECAY * req.spec_alpha_den + sum(chain_ev)
                if topk > 1:  # the chain population, and the paired evidence of trees
                    _decay_add(chains, *chain_ev)
                    _decay_add(self._pop[2], *chain_ev)
        if k:
            self.stats["tree_steps" if topk > 1 else "chain_steps"] += 1
            self.stats["proposed"] += proposed
            self.stats["accepted"] += accepted
            if topk > 1:  # per shape, and what the trees' top-1 chains alone accepted
                self.stats["tree_accepted"] += accepted
                self.stats["tree_top1_accepted"] += max(chain, 0)
            self.stats[f"accept_len.{accepted}"] += 1


def _decay_add(pop: list[float], accepted: float, rejected: float) -> None:
    """Population evidence [accepted, accepted + rejections], EMA per request-step."""
    pop[0] = POPULATION_DECAY * pop[0] + accepted
    pop[1] = POPULATION_DECAY * pop[1] + accepted + rejected


def age(req: Request) -> None:
    """A step that brought no chain evidence for `req` (plain, or a tree): its chain
    acceptance evidence decays towards the population's."""
    req.spec_alpha_num *= ALPHA_DECAY
    req.spec_alpha_den *= ALPHA_DECAY
