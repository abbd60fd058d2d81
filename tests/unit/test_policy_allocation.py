"""goodput's per-request draft lengths (policy/allocation.py) with scripted acceptance and
step-time tables (pure CPU)."""

from __future__ import annotations

import pytest
from policy_helpers import memory_bound_costs, reqs

from gearshift.policy.allocation import allocate, chain_gear
from gearshift.policy.base import PolicyView
from gearshift.policy.cost import CostModel
from gearshift.policy.goodput import GoodputPolicy
from gearshift.runner.graphs import mixed_verify_tokens


def linear_ms(base: float, per_token: float, n: int):
    """A step of n requests: `base` ms, plus `per_token` ms per verified token beyond n."""
    return lambda tokens, depth: base + per_token * (tokens - n)


def test_more_drafts_to_the_requests_that_accept():
    alphas = [0.9, 0.5, 0.9, 0.2]
    ks = allocate(alphas, [5] * 4, linear_ms(10.0, 0.2, 4))
    assert ks[0] == ks[2] > ks[1] > ks[3]
    assert ks == [5, 2, 5, 1]  # each draft taken is worth more than any left out


def test_no_drafts_below_their_cost():
    # a draft costs 1 ms on a 10 ms step of 4 requests (0.4 tokens / ms): drafts worth
    # less than ~0.4 tokens are not taken, whatever the request
    ks = allocate([0.95, 0.3, 0.1, 0.8], [5] * 4, linear_ms(10.0, 1.0, 4))
    assert ks[1] == ks[2] == 0 and ks[0] > 0 and ks[3] > 0
    assert 0.95 ** ks[0] > 0.3 and 0.8 ** ks[3] > 0.3  # each taken draft beats the cutoff
    # verification much dearer than a plain step: nobody drafts
    assert allocate([0.9] * 4, [5] * 4, linear_ms(1.0, 100.0, 4)) == [0] * 4


def test_free_verification_fills_every_limit():
    assert allocate([0.6, 0.1, 0.9], [3, 2, 0], lambda t, d: 5.0) == [3, 2, 0]


def test_a_mixed_plan_allocates_exactly_its_slots():
    # cost flat up to 8 verified tokens (the knee), steep after: the budget of 4 drafts
    # over 4 requests goes to the best marginal values, however they fall per request
    ms = lambda tokens, depth: 4.0 if tokens <= 8 else 4.0 * tokens  # noqa: E731
    alphas = [0.95, 0.9, 0.5, 0.3]
    ks = allocate(alphas, [4] * 4, ms)
    assert sum(ks) == 4 and ks == [3, 1, 0, 0]  # 0.95, 0.95^2, 0.9, 0.95^3 > 0.9^2


def test_hysteresis_holds_a_request_s_drafts_on_near_ties():
    ms = lambda tokens, depth: 4.0 if tokens <= 3 else 100.0  # noqa: E731 - one draft's budget
    assert allocate([0.80, 0.81], [1, 1], ms) == [0, 1]
    assert allocate([0.80, 0.81], [1, 1], ms, current=[1, 0], margin=0.02) == [1, 0]
    assert allocate([0.70, 0.81], [1, 1], ms, current=[1, 0], margin=0.02) == [0, 1]


def test_predict_verified_interpolates_between_the_gears():
    m = CostModel()
    for k, ms in enumerate([4.0, 6.0, 7.0, 8.0]):
        m.base[k] = [[8.0, ms]]
    assert m.predict_verified(8, 8, 0, 0, 3) == 4.0  # no drafts: a plain step
    assert m.predict_verified(16, 8, 0, 1, 3) == 6.0  # uniform K = 1
    assert m.predict_verified(20, 8, 0, 2, 3) == pytest.approx(6.5)  # mean K 1.5
    assert m.predict_verified(12, 8, 0, 1, 3) == pytest.approx(5.5)  # mean 0.5: 1 -> 2 slope
    m.draft_ms_per_depth = 0.25
    assert m.predict_verified(12, 8, 0, 3, 3) == pytest.approx(5.5 + 0.25 * 2.5)


def test_goodput_per_request_splits_a_batch_by_acceptance():
    # 64 requests: uniform chains pass the knee (256 tokens) beyond K = 3
    rs = reqs(32, 0.9, ctx=1) + reqs(32, 0.3, ctx=1)
    for i, r in enumerate(rs):
        r.request_id = str(i)
    rs[3] = reqs(1, 0.9, speculative=False, ctx=1)[0]  # opted out: never drafts
    rs[3].request_id = "3"
    uniform = GoodputPolicy(memory_bound_costs(), 5, margin=0.0).plan(PolicyView(rs, 0, 5))
    assert len(set(k for k, r in zip(uniform, rs) if r.params.speculative)) == 1
    pol = GoodputPolicy(memory_bound_costs(), 5, margin=0.0, per_request=True)
    ks = pol.plan(PolicyView(rs, 0, 5))
    assert ks[3] == 0
    assert min(ks[:3] + ks[4:32]) > max(ks[32:])
    # more committed tokens per ms than the uniform plan, by the same cost model
    def rate(plan):
        tokens = sum(sum(0.9 ** j if i < 32 else 0.3 ** j for j in range(k + 1))
                     for i, k in enumerate(plan))
        return tokens / pol.cost.predict_verified(64 + sum(plan), 64, 64, max(plan), 5)
    assert rate(ks) > rate(uniform)


def test_a_mixed_step_at_its_predicted_time_leaves_the_prices_alone():
    # mean K 1.5 is priced between the gears (6.5 ms) and observed as gear 2 (7 ms): the
    # step's error (none) is what moves gear 2, not its gap to the uniform gear
    pol = GoodputPolicy(CostModel(), 3, per_request=True)
    for k, ms in enumerate([4.0, 6.0, 7.0, 8.0]):
        pol.cost.base[k] = [[8.0, ms]]
    ks = [1, 2] * 4
    ms = pol.cost.predict_verified(8 + sum(ks), 8, 0, max(ks), 3)
    assert ms == pytest.approx(6.5 + pol.cost.draft_ms_per_depth * 0.5)
    pol.observe(chain_gear(ks), 8, 0, ms, ks=ks)
    assert [pol.cost.base[k][0][1] for k in range(4)] == pytest.approx([4.0, 6.0, 7.0, 8.0])
    pol.observe(chain_gear(ks), 8, 0, ms * 1.2, ks=ks)  # 20% over: gear 2's price follows
    assert pol.cost.base[2][0][1] == pytest.approx(7.0 * (1 + 0.2 / 2))  # its 2nd observation


def test_an_allocations_steps_are_the_running_gear_not_probes():
    # the allocation's gear differs from the batch-wide winner; its steps move its price
    # by the running gear's EMA rate, not by an exploration's (half the error at once)
    rs = reqs(32, 0.9, ctx=1) + reqs(32, 0.3, ctx=1)
    for i, r in enumerate(rs):
        r.request_id = str(i)
    pol = GoodputPolicy(memory_bound_costs(knee_tokens=300), 5, margin=0.0, per_request=True)
    gear = chain_gear(pol.plan(PolicyView(rs, 0, 5)))
    assert gear and gear != pol.current_k  # 3 against the uniform K = 4
    price = pol.cost.predict(gear, 64, 64)
    for _ in range(30):  # the point's prior replaced, then settled at the true price
        pol.observe(gear, 64, 64, price, ks=[gear] * 64)
    pol.observe(gear, 64, 64, 1.2 * price, ks=[gear] * 64)
    assert pol.cost.predict(gear, 64, 64) == pytest.approx(price * (1 + 0.2 * pol.cost.ema))


def test_a_mixed_step_is_priced_at_its_token_bucket():
    # on graphs a step mixing K verifies its token bucket: a whole K per padded row
    m = CostModel()
    for k, ms in enumerate([4.0, 6.0, 7.0, 8.0]):
        m.base[k] = [[8.0, ms]]
    bucket = lambda t: mixed_verify_tokens(8, t)  # noqa: E731
    price = m.verified_pricer(8, 0, 3, 8, bucket)
    assert price(9, 1) == 6.0  # one draft: the 16-token bucket, K = 1's price
    assert m.verified_pricer(8, 0, 3, 8)(9, 1) < 6.0  # what the mean K alone would say
    assert price(17, 2) == price(24, 2) == 7.0  # mixed into 24 tokens; uniform K = 2
    # a bucket paid for is filled: drafts that fit in it go to the next-best requests
    ks = allocate([0.9] * 4 + [0.1] * 4, [3] * 8, price)
    assert ks[:4] == [3] * 4 and bucket(8 + sum(ks)) == 8 + sum(ks) + 1


def test_goodput_request_prices_its_allocation_with_the_engine_s_buckets():
    calls = []

    def verify_tokens(n, tokens):
        calls.append((n, tokens))
        return mixed_verify_tokens(n, tokens)

    rs = reqs(4, 0.9, ctx=1) + reqs(4, 0.1, ctx=1)
    for i, r in enumerate(rs):
        r.request_id = str(i)
    pol = GoodputPolicy(memory_bound_costs(3, knee_tokens=16), 3, margin=0.0,
                        per_request=True, verify_tokens=verify_tokens)
    ks = pol.plan(PolicyView(rs, 0, 3))
    assert calls and all(n == 8 for n, _ in calls)
    # steps are flat up to 16 tokens: 15 real ones fill that bucket (16 would need the
    # next, 24: one padding token is always verified)
    assert len(set(ks)) > 1 and 8 + sum(ks) == 15


def test_the_allocation_is_made_in_prepare_and_used_by_the_next_plan(monkeypatch):
    """Allocating K_i prices every draft prefix (hundreds at 64 requests): prepare(), while
    the device runs a VERIFY step, makes it for that step's requests and the next plan uses
    it; a plan for other requests allocates anew, and a prepared allocation serves one plan."""
    from gearshift.policy import goodput

    rs = reqs(16, 0.9, ctx=1) + reqs(16, 0.3, ctx=1)
    for i, r in enumerate(rs):
        r.request_id = str(i)
    pol = GoodputPolicy(memory_bound_costs(), 5, margin=0.0, per_request=True)
    calls = []
    real = goodput.allocate
    monkeypatch.setattr(goodput, "allocate", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    first = pol.plan(PolicyView(rs, 0, 5))
    assert len(calls) == 1 and len(set(first)) > 1
    pol.prepare(PolicyView(rs, 0, 5))
    assert len(calls) == 2
    assert pol.plan(PolicyView(rs, 0, 5)) == first and len(calls) == 2  # the prepared one
    pol.prepare(PolicyView(rs, 0, 5))
    other = reqs(1, 0.9, ctx=1) + rs[1:]  # one request left, another came
    other[0].request_id = "new"
    pol.plan(PolicyView(other, 0, 5))
    assert pol.last_reason == "scored" and len(calls) == 4  # allocated anew
    pol.prepare(PolicyView(other, 0, 5))
    pol.plan(PolicyView(other, 0, 5))  # an exploration step: its uniform gear
    assert pol.last_reason == "fresh"
    pol.plan(PolicyView(other, 0, 5))  # the allocation prepared before it is not used
    assert pol.last_reason == "scored" and len(calls) == 6


def test_a_request_behind_pays_its_catch_up_to_leave_k0():
    # 4 ms a step, free drafts: everyone drafts fully when no draft is behind
    alphas, limits, ms = [0.8] * 4, [3] * 4, (lambda tokens, depth: 4.0)
    assert allocate(alphas, limits, ms) == [3] * 4
    # request 0's draft is 40 ms behind and it has 4 tokens left: its first draft would
    # bring that whole catch-up into the step, more than its drafts are worth
    behind = [(40.0, 4.0), (0.0, 10.0), (0.0, 10.0), (0.0, 10.0)]
    assert allocate(alphas, limits, ms, catch_up=behind) == [0, 3, 3, 3]
    # the same catch-up spread over 4000 tokens left: a small share per step, it drafts
    far = [(40.0, 4000.0)] + behind[1:]
    assert allocate(alphas, limits, ms, catch_up=far) == [3] * 4


def test_goodput_request_prices_the_catch_up_of_requests_behind():
    rs = reqs(4, 0.8, ctx=1)
    for i, r in enumerate(rs):
        r.request_id = str(i)
        r.params.max_tokens = 16
        r.num_computed_tokens = r.draft_rows = 1
    rs[0].num_computed_tokens = 2001  # 2000 rows committed at K = 0
    view = PolicyView(rs, 0, 5, draft_catches_up=True)
    pol = GoodputPolicy(memory_bound_costs(), 5, margin=0.0, per_request=True,
                        catch_up_ms_per_row=0.05)
    ks = pol._marginal(view)
    assert ks[0] == 0 and min(ks[1:]) > 0
    # a draft that keeps no state (n-gram) has nothing to catch up: it drafts like the rest
    view.draft_catches_up = False
    assert pol._marginal(view)[0] == ks[1]
