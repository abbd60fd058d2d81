"""`random`: a seeded policy that changes every request's K every step (0 included), and
on an engine that verifies trees, chains or trees every step. For tests: it exercises
every transition between plain decode, chains and trees."""

from __future__ import annotations

import random

from gearshift.policy.base import Policy, PolicyView


class RandomPolicy(Policy):
    def __init__(self, num_draft_tokens: int, seed: int = 0) -> None:
        self.num_draft_tokens = num_draft_tokens
        self.rng = random.Random(seed)
        self._topk = 1

    def plan(self, view: PolicyView) -> list[int]:
        k = min(self.num_draft_tokens, view.num_draft_tokens)
        self._topk = self.rng.choice((1, view.topk)) if view.topk > 1 else 1
        if self.rng.random() < 0.3:  # whole steps at K=0 too, so the DECODE path is exercised
            return [0] * len(view.requests)
        return [self.rng.randint(0, k) if self.eligible(r) else 0 for r in view.requests]

    def step_topk(self, view: PolicyView) -> int:
        return self._topk
