"""Built-in static policies: `off` (never speculate) and `always` (fixed K)."""

from __future__ import annotations

from gearshift.policy.base import Policy, PolicyView


class OffPolicy(Policy):
    drafts = False  # K is always 0: an engine with a draft costs what one without costs

    def plan(self, view: PolicyView) -> list[int]:
        return [0] * len(view.requests)


class AlwaysPolicy(Policy):
    def __init__(self, k: int, topk: int | None = None) -> None:
        self.k, self.topk = k, topk  # topk None: the engine's tree width (1: chains)

    def plan(self, view: PolicyView) -> list[int]:
        k = min(self.k, view.num_draft_tokens)
        return [k if self.eligible(r) else 0 for r in view.requests]
