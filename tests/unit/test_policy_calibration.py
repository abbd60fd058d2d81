"""Goodput finds the best gear from measured costs wherever it runs: started from a prior
that prices every step several times too cheap (a CPU's roofline), it learns the real
costs from the steps it runs, speculates where `always` beats `off` by a wide margin,
stays plain where speculation loses, and returns to speculation after a stretch of text
its drafts miss (tests/policy_sim.py: scripted costs and acceptance, no model)."""

from __future__ import annotations

from policy_sim import Phase, cpu_like_ms, simulate

from gearshift.policy.cost import CostModel
from gearshift.policy.goodput import GoodputPolicy
from gearshift.policy.static import AlwaysPolicy, OffPolicy


def cheap_prior(k_max: int = 4) -> CostModel:
    """A CPU roofline-like prior: every step ~3.5 ms + 0.8 ms a draft, at any batch (the
    scripted costs are 2-4x that)."""
    return CostModel.roofline(1e7, 1e7, 0.0, k_max, [1, 2, 4, 8, 16], bandwidth=2e10,
                              flops=1e11, overhead_ms=3.0, draft_frac=0.2)


def tok_per_ms(policy, phases, c):
    return [p["tok_per_ms"] for p in simulate(policy, phases, c)]


def test_goodput_speculates_where_always_beats_off_by_a_wide_margin():
    for c in (1, 4):
        phases = [Phase(requests=4 * c, alpha=0.85)]
        off = tok_per_ms(OffPolicy(), phases, c)[0]
        always = {k: tok_per_ms(AlwaysPolicy(k, topk=1), phases, c)[0] for k in (2, 4)}
        assert max(always.values()) > 1.5 * off  # speculation wins by a wide margin here
        goodput = GoodputPolicy(cheap_prior(), 4)
        run = simulate(goodput, phases, c)[0]
        assert run["verify_steps"] > 0.8 * run["steps"]
        assert run["tok_per_ms"] >= 0.9 * max(off, *always.values())


def test_goodput_stays_plain_where_speculation_loses():
    """Its re-checks (acceptance evidence fades towards the prior) cost little."""
    phases = [Phase(requests=16, alpha=0.1)]
    off = tok_per_ms(OffPolicy(), phases, 4)[0]
    always = max(tok_per_ms(AlwaysPolicy(k, topk=1), phases, 4)[0] for k in (2, 4))
    goodput = simulate(GoodputPolicy(cheap_prior(), 4), phases, 4)[0]
    assert goodput["tok_per_ms"] >= 0.9 * off and goodput["tok_per_ms"] > 1.1 * always
    assert goodput["verify_steps"] < 0.5 * goodput["steps"]


def test_goodput_returns_to_speculation_after_text_its_drafts_miss():
    """Code, then random words (drafts rejected), then code again: in every phase goodput
    is within 10% of the best fixed policy of that phase."""
    phases = [Phase(16, 0.8), Phase(16, 0.05), Phase(16, 0.8)]
    for c in (1, 4):
        fixed = [tok_per_ms(p, phases, c) for p in
                 (OffPolicy(), AlwaysPolicy(2, topk=1), AlwaysPolicy(4, topk=1))]
        best = [max(col) for col in zip(*fixed)]
        got = simulate(GoodputPolicy(cheap_prior(), 4), phases, c)
        for phase, (run, top) in enumerate(zip(got, best)):
            assert run["tok_per_ms"] >= 0.9 * top, (c, phase, run, top)


def test_the_scripted_costs_are_a_cpu_like_shape():
    assert cpu_like_ms(0, 1) < cpu_like_ms(4, 1) < 3 * cpu_like_ms(0, 1)


def test_new_requests_are_tried_once_at_k0_when_speculation_is_plausible():
    """At K = 0 a batch with a request that has no acceptance evidence of its own gets one
    speculative step (the step that can show the traffic changed back), once per request;
    where speculation is far behind (plain decode wins by more than explore_ratio), never."""
    from policy_helpers import measured_online, reqs

    from gearshift.policy.base import PolicyView

    cost = CostModel()
    for k, ms in {0: 5.0, 1: 6.0, 2: 7.0}.items():
        cost.set_measured(k, [[4.0, ms]])
    pol = GoodputPolicy(measured_online(cost), 2)
    known = reqs(4, alpha=0.05)  # evidence of near-zero acceptance: K = 0
    view = PolicyView(known, 0, 2, population=((0.0, 0.0), (5.0, 100.0)))
    assert [pol.plan(view)[0] for _ in range(5)] == [0] * 5
    newcomer = reqs(1, ctx=50)[0]
    newcomer.request_id = "new"
    view = PolicyView([*known[:3], newcomer], 0, 2, population=((0.0, 0.0), (60.0, 100.0)))
    ks = [pol.plan(view)[0] for _ in range(12)]  # (after the quiet plans plain decode won)
    assert sum(k > 0 for k in ks) == 1 and ks[-1] == 0
    costly = CostModel()
    for k, ms in {0: 5.0, 1: 20.0, 2: 30.0}.items():
        costly.set_measured(k, [[4.0, ms]])
    far = GoodputPolicy(costly, 2)
    assert [far.plan(PolicyView(reqs(4), 0, 2))[0] for _ in range(3)] == [0] * 3


def test_a_slow_first_step_does_not_keep_goodput_plain():
    """Each speculative gear's first online step was a one-off (twice its cost, the most
    one step moves a price): goodput drops to K = 0 on those prices, tries a gear again
    within fresh_gap plain steps, and is back at speculation once its second observation
    shows the real cost."""
    from policy_helpers import reqs

    from gearshift.policy.base import PolicyView

    cost = CostModel()
    actual = {0: 5.0, 1: 5.6, 2: 6.2}
    for k, ms in actual.items():
        cost.set_measured(k, [[1.0, ms]])
    pol = GoodputPolicy(cost, 2)
    rs = reqs(1, alpha=0.8)
    chosen, seen = [], set()
    for _ in range(40):
        k = pol.plan(PolicyView(rs, 0, 2))[0]
        chosen.append(k)
        pol.observe(k, 1, 0, actual[k] * (2 if k and k not in seen else 1))
        seen.add(k)
    first_plain = chosen.index(0)
    assert chosen[0] == 2 and first_plain <= 3  # the outliers priced the gears out
    assert any(chosen[first_plain:first_plain + pol.explorer.fresh_gap + 2])  # tried again
    assert chosen[-20:].count(0) <= 1  # and speculating again
