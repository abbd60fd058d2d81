"""What keeps every rank on rank 0's plan. Every rank runs the same scheduler over the same
requests; rank 0 alone receives requests and asks the speculation policy (whose choices
follow measured times, which differ per rank), and before each step tells the others what
changed and what the policy said:

    rank 0 (LeaderEngine)                          ranks 1.. (FollowerEngine)
    add / abort / reset_prefix_cache -> events
    schedule() with RecordingPolicy
      Step(events, answers, drafts, fingerprint) --Channel-->  apply the events
                                                               schedule() with ReplayPolicy
                                                               its fingerprint == rank 0's,
                                                               else PlanMismatch (it exits, and
                                                               rank 0's step raises)
    prepare -> run -> commit                                   prepare -> run -> commit
              (the same plan: the same collectives, in the same order)

Data flow: distributed/engine.py sends and checks these around Engine._schedule().
"""

from __future__ import annotations

import zlib
from array import array
from collections import deque
from dataclasses import dataclass
from operator import attrgetter

from gearshift.policy.base import Policy
from gearshift.scheduler.plan import StepPlan


class PlanMismatch(RuntimeError):
    """A rank planned a different step than rank 0 (a bug: the ranks would corrupt each
    other's collectives). Raised at once, never left to hang."""


@dataclass(slots=True)
class Step:
    """Rank 0's message before a step."""

    events: list[tuple]  # ("add", pickled Request) | ("abort", id, reason) | ("reset_prefix_cache",)
    answers: list  # the policy's answers during rank 0's schedule(), in call order
    drafts: bool  # rank 0's policy.drafts: whether the draft follows plain steps
    fingerprint: tuple[str, int]  # (a summary for error messages, a digest of the plan)


@dataclass(slots=True)
class Call:
    """Device work besides steps that every rank runs alike (a name from FollowerEngine.CALLS)."""

    events: list[tuple]
    name: str
    args: tuple


@dataclass(slots=True)
class Shutdown:
    events: list[tuple]


def fingerprint(plan: StepPlan) -> tuple[str, int]:
    """(summary, digest) of everything a step's collectives depend on: mode, requests, their
    rows, tokens, draft lengths and slots."""
    ks = plan.draft_lens
    summary = (f"{plan.mode.name} of {plan.batch_size} request(s), {plan.num_tokens} token(s)"
               + (f", {sum(ks)} draft token(s), tree width {plan.draft_topk}" if ks else ""))
    digest = zlib.crc32("\0".join(r.request_id for r in plan.reqs).encode())
    ints = array("q", [plan.draft_topk, len(plan.preempted), len(plan.failed)])
    for values in (plan.extend_lens, plan.prefix_lens, plan.placeholders, ks, plan.num_nodes,
                   plan.num_scratch, [r.req_pool_index for r in plan.reqs]):
        ints.append(len(values))
        ints.extend(values)
    return summary, zlib.crc32(ints.tobytes() + plan.mode.name.encode(), digest)


class RecordingPolicy(Policy):
    """Rank 0's policy, its answers kept for the next Step message; what it plans from and
    learns (prepare, observe, its cost model and counters) is the wrapped policy's."""

    drafts = property(attrgetter("policy.drafts"))
    topk = property(attrgetter("policy.topk"))
    cost = property(attrgetter("policy.cost"))
    switches = property(attrgetter("policy.switches"))
    reused = property(attrgetter("policy.reused"))
    last_prediction = property(attrgetter("policy.last_prediction"))
    prediction_log = property(attrgetter("policy.prediction_log"))
    prices_suffix = property(attrgetter("policy.prices_suffix"))
    num_draft_tokens = property(attrgetter("policy.num_draft_tokens"))
    scorer = property(attrgetter("policy.scorer"))
    verify_tokens = property(attrgetter("policy.verify_tokens"))

    def pad(self, bs: int) -> int:
        return self.policy.pad(bs)

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.answers: list = []

    def plan(self, view) -> list[int]:
        ks = list(self.policy.plan(view))
        self.answers.append(ks)
        return ks

    def step_topk(self, view) -> int:
        topk = int(self.policy.step_topk(view))
        self.answers.append(topk)
        return topk

    def step_proposers(self, view) -> list[str] | None:
        props = self.policy.step_proposers(view)
        self.answers.append(None if props is None else list(props))
        return props

    def prepare(self, view) -> None:
        self.policy.prepare(view)

    def observe(self, k: int, bs: int, ctx_tokens: int, ms: float,
                ks: list[int] | None = None) -> None:
        self.policy.observe(k, bs, ctx_tokens, ms, ks)

    def observe_model_free(self, k: int, bs: int, ctx_tokens: int, ms: float,
                           ks: list[int] | None = None) -> None:
        self.policy.observe_model_free(k, bs, ctx_tokens, ms, ks)

    def observe_catch_up(self, rows: int, ms: float) -> None:
        self.policy.observe_catch_up(rows, ms)

    def take(self) -> list:
        answers, self.answers = self.answers, []
        return answers


class ReplayPolicy(Policy):
    """A follower's policy: rank 0's answers for this step, in the order rank 0's scheduler
    asked. A question rank 0 did not answer is a PlanMismatch. It prices nothing: step
    costs (observe) go to rank 0's policy alone."""

    topk = None

    def __init__(self) -> None:
        self.answers: deque = deque()
        self.drafts = True

    def load(self, answers: list, drafts: bool) -> None:
        self.answers, self.drafts = deque(answers), drafts

    def plan(self, view) -> list[int]:
        ks = self._next("draft lengths")
        if not isinstance(ks, list) or len(ks) != len(view.requests):
            raise PlanMismatch(f"asked for the draft lengths of {len(view.requests)} "
                               f"request(s); rank 0's policy answered {ks!r}")
        return ks

    def step_topk(self, view) -> int:
        topk = self._next("tree width")
        if not isinstance(topk, int):
            raise PlanMismatch(f"asked for the tree width; rank 0's policy answered {topk!r}")
        return topk

    def step_proposers(self, view) -> list[str] | None:
        props = self._next("proposers")
        if props is not None and (not isinstance(props, list) or len(props) != len(view.requests)):
            raise PlanMismatch(f"asked for the proposers of {len(view.requests)} request(s); "
                               f"rank 0's policy answered {props!r}")
        return props

    def prepare(self, view) -> None:
        return None

    def _next(self, what: str):
        if not self.answers:
            raise PlanMismatch(f"asked for the {what}, which rank 0's policy was never asked")
        return self.answers.popleft()
