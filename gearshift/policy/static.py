"""Built-in static policies: `off` (never speculate) and `always` (fixed K); `PlannedPolicy`
(K per request as given: the start-up's warm-up and memory profile)."""

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


class PlannedPolicy(Policy):
    """Chains of these K, in batch order (the start-up's mixed and deep steps); `suffix`:
    drafted by a hybrid's suffix proposer (chains deeper than the model's K)."""

    def __init__(self, ks: list[int], suffix: bool = False) -> None:
        self.ks, self.suffix = ks, suffix

    def plan(self, view: PolicyView) -> list[int]:
        return self.ks[: len(view.requests)]

    def step_topk(self, view: PolicyView) -> int:
        return 1

    def step_proposers(self, view: PolicyView) -> list[str] | None:
        return ["suffix"] * len(view.requests) if self.suffix else None
