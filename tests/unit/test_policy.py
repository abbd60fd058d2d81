"""Policies with synthetic cost tables and acceptance (pure CPU)."""

from __future__ import annotations

import random

import pytest
from policy_helpers import measured_online, memory_bound_costs, reqs

from gearshift.bench.sweep import VLLM_LIKE
from gearshift.config import ConfigError, EngineConfig
from gearshift.policy.base import PolicyView
from gearshift.policy.cost import CostModel
from gearshift.policy.goodput import GoodputPolicy
from gearshift.policy.randomized import RandomPolicy
from gearshift.policy.scoring import expected_tokens
from gearshift.policy.static import AlwaysPolicy, OffPolicy
from gearshift.policy.threshold import SGLANG_LIKE, ThresholdPolicy

NONE = (0.0, 0.0)  # no acceptance evidence of a sampling class


def best_k_bruteforce(cost, alpha, bs, num_draft_tokens):
    return max(range(num_draft_tokens + 1),
               key=lambda k: bs * expected_tokens(alpha, k) / cost.predict(k, bs, 0))


def drive(pol, rs, actual: dict, steps: int, num_draft_tokens: int = 4) -> list[int]:
    """`steps` plans of `pol` for requests `rs`, each step observed at its true cost
    actual[K] -> the K chosen per step."""
    chosen = []
    for _ in range(steps):
        k = pol.plan(PolicyView(rs, 0, num_draft_tokens))[0]
        chosen.append(k)
        pol.observe(k, len(rs), 0, actual[k])
    return chosen


def test_expected_tokens_formula():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(1.0, 4) == 5.0


@pytest.mark.parametrize("alpha,bs,want", [(0.8, 1, 5), (0.8, 8, 5), (0.3, 1, 5)])
def test_goodput_picks_the_known_optimum_when_memory_bound(alpha, bs, want):
    cost = memory_bound_costs()
    pol = GoodputPolicy(cost, 5, margin=0.0)
    ks = pol.plan(PolicyView(reqs(bs, alpha, ctx=1), 0, 5))
    assert ks == [want] * bs == [best_k_bruteforce(cost, alpha, bs, 5)] * bs


def test_goodput_goes_to_zero_when_verification_is_compute_bound():
    cost = measured_online(memory_bound_costs())
    pol = GoodputPolicy(cost, 5, margin=0.0)
    assert pol.plan(PolicyView(reqs(256, 0.7, ctx=1), 0, 5)) == [0] * 256
    # and it stays there, but for one exploration step in `explore_every` (bounded loss)
    plans = [pol.plan(PolicyView(reqs(256, 0.7, ctx=1), 0, 5))[0] for _ in range(640)]
    assert sum(k > 0 for k in plans) <= 640 // pol.explorer.explore_every
    pol.explorer.explore_ratio = 0.95  # gears this much worse than the best are never tried
    assert not any(pol.plan(PolicyView(reqs(256, 0.7, ctx=1), 0, 5))[0] for _ in range(640))
    # in between, a shorter chain wins (the knee at 256 tokens: bs 64 -> K = 3)
    ks = pol.plan(PolicyView(reqs(64, 0.7, ctx=1), 0, 5))
    assert ks[0] == best_k_bruteforce(cost, 0.7, 64, 5) and 0 < ks[0] < 5


def test_goodput_low_acceptance_means_no_speculation_when_drafting_costs():
    cost = memory_bound_costs()
    for k in range(1, 6):  # every draft step adds 10% to the step
        for p in cost.base[k]:
            p[1] *= 1 + 0.1 * k
    pol = GoodputPolicy(cost, 5, margin=0.0)
    assert pol.plan(PolicyView(reqs(4, 0.02, ctx=1), 0, 5)) == [0] * 4


def test_goodput_hysteresis_holds_steady_under_noise():
    rng = random.Random(0)
    cost = memory_bound_costs()
    pol = GoodputPolicy(cost, 5, margin=0.08, explore_every=10**9, fresh_obs=0)  # no exploration
    chosen = []
    for _ in range(300):
        # acceptance that hovers where K=4 and K=5 are within a few percent of each other
        alpha = 0.5 + rng.uniform(-0.03, 0.03)
        chosen.append(pol.plan(PolicyView(reqs(2, alpha, ctx=1), 0, 5))[0])
    flips = sum(a != b for a, b in zip(chosen, chosen[1:]))
    assert flips <= 2
    noiseless = GoodputPolicy(memory_bound_costs(), 5, margin=0.0)
    assert noiseless.plan(PolicyView(reqs(2, 0.5, ctx=1), 0, 5))[0] == chosen[-1]


def test_goodput_explores_k0_while_speculating_and_a_bad_prior_is_corrected():
    """The start-up profile can be wrong (e.g. plain decode timed with host overhead that
    CUDA graphs and overlap scheduling hide). One step in `explore_every` at K = 0 measures
    plain decode, and the cost table's first observations replace the prior quickly."""
    cost = memory_bound_costs(num_draft_tokens=4)
    for p in cost.base[0]:
        p[1] = 20.0  # prior: plain decode looks 5x more expensive than it is
    actual = {0: 4.0, 1: 7.0, 2: 8.0, 3: 9.0, 4: 12.0}  # speculation costs host work
    pol = GoodputPolicy(cost, 4, explore_every=16)
    rs = reqs(8, 0.5)
    chosen = drive(pol, rs, actual, 400)
    assert chosen[0] > 0  # the prior said: speculate
    assert 0 in chosen[:40]  # an exploration step measured K = 0 early on
    assert chosen[-100:].count(0) >= 90  # and the policy settled on plain decode


def test_goodput_respects_opt_out_and_online_costs_move_the_decision():
    cost = memory_bound_costs()
    pol = GoodputPolicy(cost, 3, margin=0.0)
    rs = reqs(4, 0.9) + reqs(2, 0.9, speculative=False)
    ks = pol.plan(PolicyView(rs, 0, 3))
    assert ks[:4] == [3] * 4 and ks[4:] == [0, 0]
    # the machine turns out to be much slower when speculating: observations pull K down
    for _ in range(200):
        for k in (1, 2, 3):
            pol.observe(k, 6, 0, 4.0 * (1 + 3 * k))
    assert pol.plan(PolicyView(rs, 0, 3))[0] == 0


def test_static_threshold_random_policies():
    view = PolicyView(reqs(10), 0, 4)
    assert OffPolicy().plan(view) == [0] * 10
    assert AlwaysPolicy(4).plan(view) == [4] * 10
    assert ThresholdPolicy(SGLANG_LIKE, 4).plan(view) == [4] * 10
    assert ThresholdPolicy(SGLANG_LIKE, 4).plan(PolicyView(reqs(64), 0, 4)) == [0] * 64
    assert ThresholdPolicy(VLLM_LIKE, 4).plan(PolicyView(reqs(100), 0, 4)) == [1] * 100
    assert ThresholdPolicy(VLLM_LIKE, 4).plan(view) == [3] * 10
    pol = RandomPolicy(4, seed=1)
    seen = {tuple(pol.plan(view)) for _ in range(50)}
    assert len(seen) > 10 and all(0 <= k <= 4 for ks in seen for k in ks)
    mixed = reqs(3) + reqs(3, speculative=False)
    assert all(ks[3:] == [0, 0, 0] for ks in (RandomPolicy(4, 2).plan(PolicyView(mixed, 0, 4))
                                              for _ in range(20)))


def test_vllms_table_is_a_bench_policy_not_an_engine_option():
    """`bench sweep` compares against vLLM's documented table (threshold-vllm); an engine is
    not built with it."""
    with pytest.raises(ConfigError, match="unknown spec_policy 'threshold-vllm'"):
        EngineConfig(model="m", speculative_algorithm="ngram", spec_policy="threshold-vllm")


def test_goodput_keeps_its_gear_when_every_gears_cost_drifts():
    """Step times drift up together (contexts grow, the host's state changes): the running
    gear's price follows, and so must its neighbours', priced only when last explored.
    Without the shared drift a neighbour 5% worse looks better once the drift passes that,
    and goodput runs it until its own price catches up (the simulation behind this test:
    3x as many steps at the worse gear under a 25% drift)."""
    def run(shared: float) -> list[int]:
        cost = CostModel()
        actual = {0: 4.0, 1: 6.9, 2: 7.1, 3: 7.2, 4: 7.8}  # at a = 0.8, K = 4 leads by 5%
        for k, ms in actual.items():
            cost.set_measured(k, [[8.0, ms]])
            cost.attn_ms_per_token[k] = 0.0
        cost.shared = shared
        pol = GoodputPolicy(cost, 4, explore_every=64)
        rs, chosen = reqs(8, 0.8), []
        for step in range(400):
            drift = 1.0 + 0.3 * min(step / 200, 1.0)  # speculative steps 30% slower
            k = pol.plan(PolicyView(rs, 0, 4))[0]
            chosen.append(k)
            pol.observe(k, 8, 0, actual[k] * (drift if k else 1.0))
        return chosen

    shared, alone = run(1.0), run(0.0)
    assert shared.count(3) <= 12 < alone.count(3)  # a few explorations; not a second gear
    assert shared[-50:].count(4) >= 48


def test_goodput_explores_neighbour_gears_and_corrects_a_misjudged_one():
    """The start-up profile overstated K = 4 (as a warm-up on dummy requests can): goodput settles on
    K = 3; its exploration steps also try K + 1, whose measured cost then moves it to K = 4."""
    cost = memory_bound_costs(num_draft_tokens=4)
    actual = {0: 4.0, 1: 4.6, 2: 4.8, 3: 5.0, 4: 5.2}
    for k, ms in actual.items():
        cost.set_measured(k, [[8.0, ms * (1.25 if k == 4 else 1.0)]])
    pol = GoodputPolicy(cost, 4, explore_every=16)
    rs = reqs(8, 0.8)
    chosen = drive(pol, rs, actual, 600)
    assert chosen[:3] == [3] * 3  # the misjudged profile's choice
    assert 4 in chosen[:20] and 0 in chosen[:20]  # neighbour and plain decode explored
    assert chosen[-160:].count(4) >= 140  # settled on the better gear (the rest: exploring)


def test_goodput_measures_an_unobserved_neighbour_within_its_first_steps():
    """At a new load level the neighbour gear's cost is only the warm-up's (here it overstates
    K = 4 at batch 2: 8.25 ms where real steps take 7.0). Goodput tries it after
    `fresh_gap` steps, the real step replaces the warm-up figure, and it switches at once,
    instead of waiting for the periodic exploration (one step in explore_every / 2)."""
    cost = CostModel()
    actual = {0: 4.7, 1: 6.0, 2: 6.3, 3: 6.8, 4: 7.0}
    for k, ms in actual.items():
        cost.set_measured(k, [[1.0, ms], [2.0, 8.25 if k == 4 else ms]])
        cost.attn_ms_per_token[k] = 0.0
    pol = GoodputPolicy(cost, 4)
    rs = reqs(2, 0.7)
    chosen = drive(pol, rs, actual, 64)
    assert chosen[:3] == [3] * 3  # the warm-up's choice
    assert chosen[3] == 4  # the unmeasured neighbour, measured at its real cost
    assert chosen[4:60].count(4) >= 50  # and kept: K = 4 really is better
    assert cost.observed(4, 2) >= 2 and cost.observed(4, 1) == 0
    # once both neighbours have their online observations, no more fresh explorations
    view = PolicyView(rs, 0, 4)
    assert pol.explorer._unmeasured_neighbour(4, 4, pol.scores(view, 4), 2, view) == 0


def test_goodput_prior_is_the_population_acceptance_when_measured():
    """A request with no evidence of its own (new, or aged by plain steps) is judged by the
    acceptance measured over recent requests, not by the fixed prior, which can make
    speculation look worse than plain decode where it is better."""
    cost = CostModel()
    for k, ms in {0: 5.1, 1: 8.6, 2: 10.8, 3: 12.0, 4: 14.5}.items():
        cost.set_measured(k, [[64.0, ms]])
        cost.attn_ms_per_token[k] = 0.0
    rs = reqs(64)  # no evidence

    def settled(pol, view):  # new requests get one step of speculation first (tried once)
        pol.plan(view)
        return pol.plan(view)[0]

    assert settled(GoodputPolicy(cost, 4), PolicyView(rs, 0, 4)) == 0  # prior 0.6
    pol = GoodputPolicy(cost, 4)
    assert pol.plan(PolicyView(rs, 0, 4, population=(NONE, (800.0, 1000.0))))[0] == 3
    assert pol.last_prediction["prior_acceptance_sampled"] == pytest.approx(806.0 / 1010.0)  # spec_stats
    assert settled(GoodputPolicy(cost, 4), PolicyView(rs, 0, 4, population=(NONE, (200.0, 1000.0)))) == 0
    # little evidence: mostly the fixed prior (one rejected first draft is not the norm)
    assert GoodputPolicy(cost, 4).scorer.population_prior(
        PolicyView(rs, 0, 4, population=(NONE, (0.0, 1.0))), greedy=False) == pytest.approx(6.0 / 11.0)


def test_each_sampling_class_is_priced_by_its_own_population():
    """Greedy text is accepted far more often than sampled text: a sampled request with no
    evidence of its own is priced by recent sampled requests, not by greedy ones, and the
    other way round, in the same step."""
    cost = CostModel()
    for k, ms in {0: 5.1, 1: 8.6, 2: 10.8, 3: 12.0, 4: 14.5}.items():
        cost.set_measured(k, [[64.0, ms]])
        cost.attn_ms_per_token[k] = 0.0
    greedy_high = ((800.0, 1000.0), (100.0, 1000.0))  # greedy 0.8, sampled 0.1
    pol = GoodputPolicy(cost, 4)
    scorer = pol.scorer
    view = PolicyView(reqs(64), 0, 4, population=greedy_high)
    assert scorer.population_prior(view) == pytest.approx(806.0 / 1010.0)
    assert scorer.population_prior(view, greedy=False) == pytest.approx(106.0 / 1010.0)
    sampled = reqs(64)  # temperature 1.0: the sampled class, priced at ~0.1
    pol.plan(PolicyView(sampled, 0, 4, population=greedy_high))  # newcomers: tried once
    assert pol.plan(PolicyView(sampled, 0, 4, population=greedy_high))[0] == 0
    greedy = reqs(64)
    for r in greedy:
        r.params.temperature = 0.0
    assert GoodputPolicy(cost, 4).plan(PolicyView(greedy, 0, 4, population=greedy_high))[0] == 3
    # one batch of both: each request's expected tokens at its own class's prior
    mixed = greedy[:32] + sampled[:32]
    tokens = scorer.scores(PolicyView(mixed, 0, 4, population=greedy_high), 4)[2][0]
    a, b = 806.0 / 1010.0, 106.0 / 1010.0
    assert tokens == pytest.approx(64 + 32 * (a + a * a) + 32 * (b + b * b))


def test_goodput_probes_back_off_while_they_confirm_the_estimate():
    """A probe whose measured step time matches the prediction (within 10%) doubles the wait
    for the next, up to max_backoff x explore_every; a probe that finds the machine changed
    brings the period back to explore_every, and the policy follows the change. (Plain
    decode within explore_ratio of the best: a load where it may soon win.)"""
    cost = memory_bound_costs(num_draft_tokens=4)
    actual = {0: 2.0, 1: 4.4, 2: 4.8, 3: 5.2, 4: 5.6}
    for k, ms in actual.items():
        cost.set_measured(k, [[8.0, ms]])
    pol = GoodputPolicy(cost, 4, explore_every=16, max_backoff=8)
    rs = reqs(8, 0.8)
    chosen = drive(pol, rs, actual, 2000)
    assert chosen[:3] == [4] * 3
    assert 1 <= chosen[1000:2000].count(0) <= 1000 // 128 + 1  # one probe per 128 steps
    assert pol.explorer._periods[8] == 128
    actual[0] = 0.5  # plain decode got 4x cheaper: the next probe is a surprise
    chosen = drive(pol, rs, actual, 800)
    assert chosen[200:400].count(0) >= 200 // 16  # probing at explore_every again
    assert chosen[-50:].count(0) == 50 and pol.current_k == 0


def test_goodput_probes_back_off_per_batch_size_under_churn():
    """A closed loop alternates batch 2 and 1 as requests finish. Each padded batch size
    backs off on its own once its probes confirm the estimate (one shared period, reset at
    every change, would never back off), and probes still come: the count towards the next
    one is not reset by the churn."""
    cost = memory_bound_costs(num_draft_tokens=4)
    actual = {0: 2.0, 1: 4.4, 2: 4.8, 3: 5.2, 4: 5.6}  # plain decode within explore_ratio
    pol = GoodputPolicy(cost, 4, explore_every=16, max_backoff=8, explore_ratio=0.6)
    chosen = []
    for step in range(2000):
        rs = reqs(2 if (step // 10) % 2 == 0 else 1, 0.8)
        k = pol.plan(PolicyView(rs, 0, 4))[0]
        chosen.append(k)
        pol.observe(k, len(rs), 0, actual[k])
    assert 1 <= chosen[1000:].count(0) <= 1000 // 128 + 1  # backed off to one in 128
    assert pol.explorer._periods == {1: 128, 2: 128}
    assert chosen[:200].count(0) >= 3  # it probed while the estimates were new


def test_goodput_rechecks_the_gear_it_left_and_returns_when_its_price_was_stale():
    """A pass starts with K = 4 priced 12% over its real steps (a stale point): K = 3 looks
    better and goodput switches. The gear it left is re-measured within fresh_gap steps,
    each such step moving its price by at least explore_rate: goodput is back at K = 4
    within a few steps, not after the pass."""
    actual = {0: 4.0, 1: 6.9, 2: 7.1, 3: 7.2, 4: 7.8}  # at a = 0.8, K = 4 leads by 5%
    cost = CostModel()
    for k, ms in actual.items():
        cost.set_measured(k, [[8.0, ms * (1.12 if k == 4 else 1.0)]])
        cost.attn_ms_per_token[k] = 0.0
    cost.counts = {k: [50] for k in actual}  # long established: EMA-rate updates
    pol = GoodputPolicy(cost, 4, explore_every=64)
    chosen = drive(pol, reqs(8, 0.8), actual, 2 * pol.explorer.fresh_gap + 2)
    assert chosen[0] == 3  # the stale price made K = 3 look better
    assert chosen[:2 * pol.explorer.fresh_gap + 1].count(4) == pol.explorer.fresh_obs  # two rechecks
    assert pol.current_k == 4  # and back
    chosen = drive(pol, reqs(8, 0.8), actual, 300)
    assert chosen.count(4) >= 285  # and it stays (explorations aside)


def test_goodput_stops_probing_plain_decode_where_it_is_confirmed_far_behind():
    """At low load a K = 0 probe gives c tokens where a VERIFY step gives ~3c, and the next
    VERIFY step waits for it: once a probe at a batch size confirmed plain decode's price
    and it scores under explore_ratio of the best, no more probes there. A batch size where
    no probe confirmed it yet is probed, and a plain decode that becomes competitive (load)
    is probed again."""
    cost = memory_bound_costs(num_draft_tokens=4)
    actual = {0: 4.0, 1: 4.4, 2: 4.8, 3: 5.2, 4: 5.6}  # K = 4 gives 2.4x plain decode
    for k, ms in actual.items():
        cost.set_measured(k, [[1.0, ms], [8.0, ms]])
    pol = GoodputPolicy(cost, 4, explore_every=16, max_backoff=8)
    chosen = drive(pol, reqs(8, 0.8), actual, 1000)
    assert chosen[:40].count(0) == 1  # probed once: confirmed
    assert chosen[40:].count(0) == 0
    assert chosen[40:].count(4) >= 900
    chosen = drive(pol, reqs(1, 0.8), actual, 100)  # a batch size not confirmed yet
    assert chosen.count(0) == 1
    actual[0] = cost.base[0][1][1] = 2.0  # plain decode within explore_ratio of K = 4
    chosen = drive(pol, reqs(8, 0.8), actual, 300)
    assert chosen.count(0) >= 2


def test_goodput_logs_measured_against_predicted_step_times():
    """Every observed step adds its measured and predicted ms by mode (benches report the
    ratio: a cost model biased for VERIFY or plain steps shows as != 1), predicted before
    the observation moves the model."""
    cost = memory_bound_costs()
    pol = GoodputPolicy(cost, 5)
    pol.observe(3, 1, 0, 6.0)  # predicted 4.0 (memory-bound floor)
    pol.observe(0, 1, 0, 4.0)
    assert pol.prediction_log["verify"] == [6.0, 4.0, 1]
    assert pol.prediction_log["plain"] == [4.0, 4.0, 1]
    pol.observe(3, 1, 0, 6.0)  # the first observation replaced the prior: now predicted 6
    assert pol.prediction_log["verify"] == [12.0, 10.0, 2]


def _behind(rs, rows: int, left: int):
    """Requests whose draft is `rows` behind (plain steps since their last VERIFY step),
    with `left` tokens to go."""
    for r in rs:
        r.num_computed_tokens = r.num_tokens
        r.draft_rows = r.num_tokens - rows
        r.params.max_tokens = len(r.output_token_ids) + left
    return rs


def test_goodput_prices_the_drafts_catch_up_over_the_steps_left():
    """Leaving K = 0 first runs the draft over every row committed plainly. Spread over
    many steps left it does not matter; requests about to finish would pay it for a step
    or two: they stay plain. Without a draft that catches up (n-gram), no price."""
    def plan(rows, left, catches_up=True):
        pol = GoodputPolicy(memory_bound_costs(), 5, catch_up_ms_per_row=0.01)
        view = PolicyView(_behind(reqs(8, 0.8), rows, left), 0, 5, draft_catches_up=catches_up)
        return pol.plan(view)[0]

    assert plan(0, 3) == 5  # nothing behind
    assert plan(400, 1000) == 5  # 4 ms per request, over ~270 steps
    assert plan(400, 3) == 0  # 4 ms per request for its last step
    assert plan(400, 3, catches_up=False) == 5


def test_goodput_skips_probes_whose_catch_up_costs_more_than_a_plain_step():
    """At K = 0 a probe VERIFY step would catch the draft up over every plain row, then go
    back to K = 0 and pay again at the next probe: skipped while that costs more than a
    plain step, taken when it does not."""
    cost = memory_bound_costs()
    for k in range(1, 6):  # drafting costs: a VERIFY step 6 ms, a plain one 4 ms
        cost.base[k] = [[bs, 6.0] for bs, _ in cost.base[k]]

    def probes(rows):
        pol = GoodputPolicy(cost, 5, explore_every=4, explore_ratio=0.0,
                            quiet_ratio=0.0, catch_up_ms_per_row=0.01)
        view = PolicyView(_behind(reqs(8, 0.05), rows, 10_000), 0, 5, draft_catches_up=True)
        return sum(pol.plan(view)[0] > 0 for _ in range(32))

    assert probes(0) >= 6  # one in explore_every
    assert probes(10) >= 6  # 0.8 ms of catch-up < a 4 ms plain step
    assert probes(100) == 0  # 8 ms > 4 ms


def test_goodput_learns_the_catch_up_cost_per_row_from_large_catch_ups():
    """A catch-up over one row per request is mostly its fixed cost (ms / rows would price
    rows ~100x too high): only catch-ups of catch_up_min_rows rows or more count."""
    pol = GoodputPolicy(memory_bound_costs(), 5, catch_up_ms_per_row=1.0, catch_up_min_rows=100)
    pol.observe_catch_up(8, 1.0)  # small: ignored
    assert pol.scorer.catch_up_ms_per_row == 1.0
    pol.observe_catch_up(500, 2.0)  # the first measurement replaces the prior
    assert pol.scorer.catch_up_ms_per_row == pytest.approx(0.004)
    pol.observe_catch_up(100, 1.4)  # then an EMA
    assert pol.scorer.catch_up_ms_per_row == pytest.approx(0.004 + 0.2 * (0.014 - 0.004))
    pol.observe_catch_up(0, 1.0)  # nothing caught up: ignored
    assert pol.scorer.catch_up_ms_per_row == pytest.approx(0.006)


def test_goodputs_catch_up_prior_comes_from_the_cost_model():
    """The price per caught-up row starts from the cost model (the draft's share of the
    target's per-token compute), not from a constant; a measured one replaces it."""
    cost = CostModel.roofline(16e9, 16e9, 1.3e5, 4, [1, 8, 64], flops=8e14, draft_frac=0.05)
    assert cost.catch_up_ms_per_row == pytest.approx(0.05 * 16e9 / 8e14 * 1e3)  # 1 us
    assert GoodputPolicy(cost, 4).scorer.catch_up_ms_per_row == cost.catch_up_ms_per_row
    assert GoodputPolicy(memory_bound_costs(), 5).scorer.catch_up_ms_per_row == 1e-3  # none known
    assert GoodputPolicy(cost, 4, catch_up_ms_per_row=0.5).scorer.catch_up_ms_per_row == 0.5
