"""Rank 0's plan, replayed: a follower's scheduler fed the same requests, rank 0's policy
answers (RecordingPolicy -> ReplayPolicy) and the same step results plans the same step,
fingerprint for fingerprint, over hundreds of steps of the random policy with preemption;
a changed answer or a question rank 0 never answered is a PlanMismatch. Pure CPU.

Data flow (tests only): two Schedulers (leader, follower) -> sync.fingerprint per step.
"""

from __future__ import annotations

import pickle
import random

import pytest

from gearshift.distributed.sync import PlanMismatch, RecordingPolicy, ReplayPolicy, fingerprint
from gearshift.forward_batch import ForwardMode
from gearshift.policy.base import Policy
from gearshift.policy.randomized import RandomPolicy
from gearshift.policy.static import AlwaysPolicy
from gearshift.request import Request, SamplingParams
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
from gearshift.scheduler.plan import Speculation, StepResult
from gearshift.scheduler.scheduler import Scheduler


def scheduler(policy, total=96) -> Scheduler:
    spec = Speculation(num_draft_tokens=3, draft_topk=1, num_nodes=lambda k, w: 1 + k,
                       num_scratch=lambda k, w: k - 1 if k else 0)
    return Scheduler(SlotPool(total), ReqRowPool(4), max_num_seqs=4, max_num_batched_tokens=24,
                     max_model_len=256, speculation=spec, policy=policy)


def run_step(sched: Scheduler, plan, rng: random.Random) -> None:
    """BatchBuilder.prepare's host side, then a commit of fake results drawn from `rng`."""
    new = []
    for r, n, nodes in zip(plan.reqs, plan.num_slots, plan.num_nodes or plan.extend_lens):
        if r.req_pool_index < 0:
            r.req_pool_index = sched.rows.alloc()
        new.append(sched.slots.alloc(n))
        r.slots.extend(new[-1][:nodes])
    if plan.mode is ForwardMode.VERIFY:
        kept = [list(range(rng.randint(0, k) + 1)) if k else [0] for k in plan.draft_lens]
        tokens = [[7] * len(k) if smp else [] for k, smp in zip(kept, plan.sample)]
        sched.commit(plan, StepResult(new, tokens, kept=kept))
    else:
        sched.commit(plan, StepResult(new, [[7] if s else [] for s in plan.sample]))


def add_requests(scheds, n: int, rng: random.Random, prompt_len: int | None = None) -> None:
    for i in range(n):
        length = prompt_len or rng.randint(2, 30)
        max_tokens = 20 if prompt_len else rng.randint(1, 24)
        req = Request(f"r{i}", [rng.randint(3, 99) for _ in range(length)],
                      SamplingParams(max_tokens=max_tokens), i)
        data = pickle.dumps(req)  # as LeaderEngine sends it
        for sched in scheds:
            sched.add(pickle.loads(data))


def test_a_replaying_follower_plans_every_step_as_rank_0():
    leader = scheduler(RecordingPolicy(RandomPolicy(3, seed=1)))
    replay = ReplayPolicy()
    follower = scheduler(replay)
    rng = random.Random(0)
    add_requests([leader, follower], 40, rng)
    modes, steps = set(), 0
    while leader.has_unfinished():
        plan = leader.schedule()
        replay.load(leader.policy.take(), True)
        mine = follower.schedule()
        assert fingerprint(mine) == fingerprint(plan) and not replay.answers
        seed = rng.random()
        run_step(leader, plan, random.Random(seed))
        run_step(follower, mine, random.Random(seed))
        modes.add(plan.mode)
        steps += 1
    assert not follower.has_unfinished() and steps > 100
    assert modes == {ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.VERIFY}
    assert leader.num_preemptions > 0


def test_a_changed_answer_changes_the_fingerprint_or_is_refused():
    leader = scheduler(RecordingPolicy(AlwaysPolicy(3)))
    replay = ReplayPolicy()
    follower = scheduler(replay)
    add_requests([leader, follower], 2, random.Random(1), prompt_len=5)
    for sched in (leader, follower):  # the prefill, planned alike without the policy
        run_step(sched, sched.schedule(), random.Random(0))
    plan = leader.schedule()
    answers = leader.policy.take()
    assert answers == [[3, 3], 1, None] and plan.mode is ForwardMode.VERIFY
    replay.load([[1, 3], 1, None], True)  # K = 1 for the first request
    assert fingerprint(follower.schedule()) != fingerprint(plan)
    follower = scheduler(ReplayPolicy())
    add_requests([follower], 2, random.Random(1), prompt_len=5)
    run_step(follower, follower.schedule(), random.Random(0))
    with pytest.raises(PlanMismatch, match="never asked"):  # no answers at all
        follower.schedule()
    follower.policy.load([[3]], True)
    with pytest.raises(PlanMismatch, match="draft lengths of 2"):
        follower.schedule()


class Learning(AlwaysPolicy):
    """A policy with a price list and counters of its own, for the wrapper to pass on."""

    cost = object()
    switches, reused = 3, 7
    last_prediction = {"k": 2}
    prediction_log = {"verify": [6.0, 4.0, 1]}

    def __init__(self) -> None:
        super().__init__(2, topk=1)
        self.seen: list[tuple] = []

    def prepare(self, view) -> None:
        self.seen.append(("prepare", view))

    def observe(self, k, bs, ctx_tokens, ms, ks=None) -> None:
        self.seen.append(("observe", k, bs, ctx_tokens, ms, ks))

    def observe_catch_up(self, rows, ms) -> None:
        self.seen.append(("catch_up", rows, ms))


def test_recording_policy_is_the_policy_to_everyone_else():
    inner = Learning()
    rec = RecordingPolicy(inner)
    assert (rec.drafts, rec.topk, rec.cost) == (inner.drafts, 1, inner.cost)
    assert (rec.switches, rec.reused, rec.last_prediction, rec.prediction_log) == \
        (3, 7, {"k": 2}, {"verify": [6.0, 4.0, 1]})
    rec.prepare("view")
    rec.observe(2, 4, 100, 5.0)
    rec.observe(2, 4, 100, 6.0, ks=[1, 2, 2, 2])
    rec.observe_catch_up(12, 0.5)
    assert inner.seen == [("prepare", "view"), ("observe", 2, 4, 100, 5.0, None),
                          ("observe", 2, 4, 100, 6.0, [1, 2, 2, 2]), ("catch_up", 12, 0.5)]
    assert rec.take() == []


def test_recording_policy_passes_on_every_part_of_the_contract():
    """Whatever Policy declares, RecordingPolicy answers with the wrapped policy's own (a
    method added to the contract must be passed on here too)."""
    contract = {name for name in vars(Policy) if not name.startswith("_")} - {"eligible"}
    assert contract <= set(vars(RecordingPolicy)), contract - set(vars(RecordingPolicy))
