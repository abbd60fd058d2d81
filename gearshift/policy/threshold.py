"""`threshold`: a batch-size -> K table, like the switches other engines ship (SGLang:
speculation off at >= 64 running; `bench sweep` adds vLLM's documented example). Rows are
(max batch size, K), checked in order."""

from __future__ import annotations

from gearshift.policy.base import Policy, PolicyView

SGLANG_LIKE = ((63, None), (10**9, 0))  # None = the configured K


class ThresholdPolicy(Policy):
    def __init__(self, table: tuple[tuple[int, int | None], ...], num_draft_tokens: int,
                 topk: int | None = None) -> None:
        self.table, self.num_draft_tokens, self.topk = table, num_draft_tokens, topk

    def plan(self, view: PolicyView) -> list[int]:
        bs = len(view.requests)
        k = next((k for limit, k in self.table if bs <= limit), 0)
        k = min(self.num_draft_tokens if k is None else k, view.num_draft_tokens)
        return [k if self.eligible(r) else 0 for r in view.requests]
