"""Overlap scheduling: the host plans and prepares step n+1 while the device runs step n.

    step() call n+1:  schedule(n+1) -> prepare -> launch(n+1) -> commit(n)
    device:           ......... step n .........|........ step n+1 ........

A step's sampled tokens stay on the device: `TokenFeed.publish` writes them into a small
table at the plan's tag (one of two parities) by batch index and starts an asynchronous
copy to pinned host memory. The scheduler booked the step when it planned it: each token
being sampled stands in the request's output as the placeholder -(tag + index + 1), so
the next step can be planned and its input ids staged before the token is known;
`resolve_ids` swaps placeholders for the tokens on the device. Two parities suffice:
every placeholder of step n is filled on the host (Scheduler.commit, after step n+1 is
launched) before step n+2 is planned.

Data flow: Engine.step -> ModelRunner.forward -> TokenFeed.publish -> PendingStep ->
(next call, or at once for a synchronous plan) PendingStep.result() -> Scheduler.commit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gearshift.runner.logprobs import LogprobPlan
from gearshift.runner.model_runner import device_ms
from gearshift.scheduler.plan import StepPlan, StepResult


@dataclass(slots=True)
class PendingStep:
    """A launched step, committed by Engine._commit: at once for a plan that runs
    synchronously (`plan.sync`), else on the next step() call, while the step after it runs."""

    plan: StepPlan
    slots: list[list[int]]  # the slots BatchBuilder allocated for it, for Scheduler.commit
    host: torch.Tensor | None  # [padded_bs] int64 (pinned on CUDA), filled by an async copy
    copied: torch.cuda.Event | None  # recorded after the copy; None on CPU (synchronous)
    timing: tuple[torch.cuda.Event, torch.cuda.Event] | None  # ModelRunner.last_events
    logprobs: LogprobPlan | None = None  # host copies queued before `copied` was recorded
    done: StepResult | None = None  # read already (a VERIFY step syncs inside its run)

    def result(self) -> StepResult:
        """Wait for this step's tokens only (not for steps queued after it)."""
        if self.done is not None:
            return self.done
        if self.copied is not None:
            self.copied.synchronize()
        sampled = self.host.tolist()  # a plain step's token per request, where it samples
        return StepResult(self.slots, [[t] if smp else [] for smp, t in
                                       zip(self.plan.sample, sampled)])

    def device_ms(self) -> float | None:
        return device_ms(self.timing)


class TokenFeed:
    def __init__(self, stride: int, device: torch.device) -> None:
        self.stride = stride  # placeholders per parity (Scheduler.tag_stride: max_num_seqs + 1)
        self.last = torch.zeros(2 * stride, dtype=torch.int64, device=device)
        self.cuda = device.type == "cuda"

    def resolve_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """[T] input ids with placeholders -> the same with the sampled tokens (device op)."""
        return torch.where(ids < 0, self.last[(-ids - 1).clamp_(min=0)], ids)

    def publish(self, tag: int, tokens: torch.Tensor) -> tuple[torch.Tensor, object]:
        """Record the step's tokens [n] (batch order) at `tag`; -> (host tensor, copy event)."""
        self.last[tag: tag + tokens.shape[0]] = tokens
        if not self.cuda:
            return tokens, None
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event
