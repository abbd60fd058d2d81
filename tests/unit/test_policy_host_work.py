"""Goodput's host work per step (pure CPU): what it scores where, and when it scores at all
(prepared scores while a VERIFY step runs, small batches in plain Python, no scoring while
plain decode leads by far or while a speculative gear is steady)."""

from __future__ import annotations

import random

import pytest
from policy_helpers import measured_online, memory_bound_costs, reqs

from gearshift.policy.base import PolicyView
from gearshift.policy.cost import CostModel
from gearshift.policy.goodput import GoodputPolicy
from gearshift.request import Request, SamplingParams


def test_goodput_skips_scoring_while_plain_decode_leads_by_far():
    """Under heavy load plain decode leads every speculative gear by more than 1 /
    quiet_ratio: goodput scores one plan in quiet_steps + 1 at that batch size (scores()
    loops over every request), probes still come every explore_every steps, and a new batch
    size is scored at once."""
    pol = GoodputPolicy(measured_online(memory_bound_costs()), 5, margin=0.0)
    calls = []
    scores = pol.scores
    pol.scores = lambda v, top: calls.append(len(v.requests)) or scores(v, top)
    big = PolicyView(reqs(256, 0.7, ctx=1), 0, 5)
    plans = [pol.plan(big)[0] for _ in range(128)]
    assert len(calls) <= 128 // (pol.quiet_steps + 1) + 2 * 2  # + the probes' own scoring
    assert 1 <= sum(k > 0 for k in plans) <= 2  # probes on time (explore_every = 64)
    calls.clear()
    pol.plan(PolicyView(reqs(64, 0.7, ctx=1), 0, 5))  # another batch size: scored now
    assert calls == [64]
    # where speculation is close to plain decode, every plan is scored
    pol = GoodputPolicy(memory_bound_costs(), 5, margin=0.0, quiet_ratio=0.0)
    n = []
    pol.scores = lambda v, top: n.append(1) or GoodputPolicy.scores(pol, v, top)
    for _ in range(16):
        pol.plan(big)
    assert len(n) == 16


def test_goodput_scores_the_next_plan_while_the_device_runs_a_verify_step():
    """prepare(view) (a VERIFY step, before the host waits for the device) scores the gears;
    the next plan() for as many requests uses those scores and scores nothing itself, and
    picks what it would have picked. Scores are for that one plan: a plan for another
    batch size, or a second plan, scores again."""
    pol = GoodputPolicy(memory_bound_costs(), 5, margin=0.0)
    pol.rescore_every = 1  # every plan scores (see the test of rescore_every below)
    ref = GoodputPolicy(memory_bound_costs(), 5, margin=0.0)
    calls = []
    scores = pol.scores
    pol.scores = lambda v, top: calls.append(len(v.requests)) or scores(v, top)
    view = PolicyView(reqs(8, 0.8), 0, 5)
    pol.prepare(view)
    assert calls == [8]
    assert pol.plan(view) == ref.plan(view)
    assert calls == [8]  # the plan scored nothing: prepare did
    pol.plan(view)
    assert calls == [8, 8]  # used once
    pol.prepare(view)
    pol.plan(PolicyView(reqs(7, 0.8), 0, 5))  # a request finished: scored afresh
    assert calls == [8, 8, 8, 7]


@pytest.mark.parametrize("n", [1, 5, 32])
def test_goodput_scores_small_batches_in_python_as_the_arrays_do(n):
    """Up to `python_max` requests (none behind) the chains' expected tokens are summed in
    plain Python; the numpy path (python_max = 0) gives the same scores for every gear."""
    rng = random.Random(n)
    rs = []
    for i in range(n):
        r = Request(str(i), [1] * 50, SamplingParams(speculative=i % 4 != 3), 0)
        r.spec_alpha_num = rng.uniform(0, 30)
        r.spec_alpha_den = r.spec_alpha_num + rng.uniform(0, 30)
        rs.append(r)
    cost = CostModel.roofline(16e9, 16e9, 131072, 4, [1, 8, 64], tree_nodes=16)
    view = PolicyView(rs, 0, 4, population=((0.0, 0.0), (30.0, 50.0)), topk=4,
                      tree_population=(12.0, 30.0, 10.0, 30.0), draft_catches_up=True)
    fast, arrays = GoodputPolicy(cost, 4), GoodputPolicy(cost, 4)
    arrays.scorer.python_max = 0
    a, b = fast.scores(view, 5), arrays.scores(view, 5)
    assert a.keys() == b.keys() == set(range(6))
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-12)


def test_goodput_keeps_a_steady_gear_unscored_between_full_scorings():
    """Between full scorings the running gear is kept without scoring (`rescore_every`), and
    the kept plans are the ones scoring would have made: with the same prices and acceptance,
    the plans (probes, explorations and rechecks included) equal a policy that scores every
    plan, while ~3 in 4 steady plans score nothing. A change of batch size scores at once,
    and so does the plan after a step far off its price."""
    actual = {0: 4.7, 1: 6.0, 2: 6.3, 3: 6.8, 4: 7.0}

    def policy(rescore_every):
        cost = CostModel()
        for k, ms in actual.items():  # warm-up prices: K = 4 overstated at batch 8
            cost.set_measured(k, [[1.0, ms], [8.0, 8.25 if k == 4 else ms]])
            cost.attn_ms_per_token[k] = 0.0
        pol = GoodputPolicy(cost, 4, explore_every=16)
        pol.rescore_every = rescore_every
        calls = []
        scores = pol.scores
        pol.scores = lambda v, top: calls.append(len(v.requests)) or scores(v, top)
        return pol, calls

    (pol, calls), (ref, _) = policy(4), policy(1)
    rs = reqs(8, 0.7)
    sizes = [8] * 300 + [7] * 50 + [8] * 200
    chosen, want = [], []
    for n in sizes:
        view = PolicyView(rs[:n], 0, 4)
        for p, out in ((pol, chosen), (ref, want)):
            p.prepare(view)  # as a VERIFY step does for the next plan
            k = p.plan(view)[0]
            out.append(k)
            p.observe(k, n, 0, actual[k])
    assert chosen == want
    assert 4 in chosen[:10] and chosen[-100:].count(4) >= 80  # K = 4, once measured
    assert 0 in chosen and 3 in chosen[20:]  # probes and explorations still run
    assert len(calls) < 0.4 * len(sizes)  # most plans scored nothing
    assert pol.reused > 0.6 * len(sizes)
    n_calls = len(calls)
    pol.plan(PolicyView(rs[:7], 0, 4))  # another batch size: scored at once
    assert len(calls) == n_calls + 1
    pol.plan(PolicyView(rs, 0, 4))  # and back
    assert len(calls) == n_calls + 2
    pol.plan(PolicyView(rs, 0, 4))
    assert len(calls) == n_calls + 2  # kept
    pol.observe(pol.current_k, 8, 0, 2 * actual[pol.current_k])  # far off its price
    pol.plan(PolicyView(rs, 0, 4))
    assert len(calls) == n_calls + 3


def test_goodput_leaves_a_kept_gear_within_rescore_every_plans():
    """Acceptance collapses while the gear is kept unscored: the policy leaves K = 4 within
    rescore_every plans of one that scores every plan."""
    cost = CostModel()
    for k, ms in {0: 4.7, 1: 6.0, 2: 6.3, 3: 6.8, 4: 7.0}.items():
        cost.set_measured(k, [[1.0, ms], [8.0, ms]])
        cost.attn_ms_per_token[k] = 0.0
    pol, ref = (GoodputPolicy(cost, 4, explore_every=10**6, fresh_obs=0) for _ in range(2))
    ref.rescore_every = 1
    rs = reqs(8, 0.9)
    first = {}
    for step in range(40):
        if step == 20:
            for r in rs:
                r.spec_alpha_num, r.spec_alpha_den = 10.0, 1000.0  # acceptance 0.01
        for name, p in (("pol", pol), ("ref", ref)):
            k = p.plan(PolicyView(rs, 0, 4))[0]
            if k != 4:
                first.setdefault(name, step)
    assert first["ref"] == 20
    assert 20 <= first["pol"] < 20 + pol.rescore_every


def test_goodput_keeps_its_gear_unscored_across_counts_of_one_padded_batch():
    """A closed loop's churn changes the count of decoding requests most steps, rarely the
    decode graph they pad to: kept plans and prepared scores carry across counts that pad
    to the same graph, and a count that pads to another graph scores."""
    pol = GoodputPolicy(memory_bound_costs(num_draft_tokens=4), 4, pad=lambda n: 8 if n > 4 else n,
                        fresh_obs=0)
    calls = []
    scores = pol.scores
    pol.scores = lambda v, top: calls.append(len(v.requests)) or scores(v, top)
    rs = reqs(8, 0.8)
    k = pol.plan(PolicyView(rs, 0, 4))[0]
    assert k and calls == [8]
    for n in (7, 8, 6, 7):  # kept: each pads to 8
        view = PolicyView(rs[:n], 0, 4)
        pol.prepare(view)
        assert pol.plan(view) == [k] * n
    assert calls == [8, 7]  # the fourth plan after a scoring scores (in prepare)
    pol.plan(PolicyView(rs[:4], 0, 4))  # pads to 4: scored
    assert calls == [8, 7, 4]
