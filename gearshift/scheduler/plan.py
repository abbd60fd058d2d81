"""StepPlan: everything one engine step will do, decided by the scheduler before anything
is allocated. BatchBuilder.prepare(plan) derives slots and tensors from it; nothing after
planning changes it.

Data flow: Scheduler.schedule() -> StepPlan -> BatchBuilder.prepare -> ModelRunner ->
Scheduler.commit(plan, tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gearshift.forward_batch import ForwardMode
from gearshift.request import Request


@dataclass(slots=True)
class StepPlan:
    mode: ForwardMode  # DECODE when every request computes exactly its one pending token
    reqs: list[Request] = field(default_factory=list)  # batch order
    extend_lens: list[int] = field(default_factory=list)  # tokens computed per request
    prefix_lens: list[int] = field(default_factory=list)  # tokens already in the KV cache
    sample: list[bool] = field(default_factory=list)  # the chunk reaches the end: sample a token
    preempted: list[Request] = field(default_factory=list)  # sent back to waiting while planning
    draft_lens: list[int] = field(default_factory=list)  # K per request (VERIFY); else empty
    draft_topk: int = 1  # tree width of a VERIFY step: 1 = chains, > 1 = one draft tree each

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.extend_lens)

    @property
    def speculating(self) -> bool:
        return any(self.draft_lens)

    @property
    def is_empty(self) -> bool:
        return not self.reqs

    def add(self, req: Request, extend_len: int) -> None:
        self.reqs.append(req)
        self.extend_lens.append(extend_len)
        self.prefix_lens.append(req.num_computed_tokens)
        self.sample.append(req.num_computed_tokens + extend_len == req.num_tokens)
