"""The goodput policy's step-time model (CostModel): interpolation, online learning, the
roofline prior, outliers, the running gear's drift shared with its neighbours (pure CPU)."""

from __future__ import annotations

import pytest
from test_policy import memory_bound_costs

from gearshift.policy.cost import CostModel


def test_cost_model_interpolates_extrapolates_and_learns():
    m = CostModel(base={0: [[1.0, 4.0], [64.0, 6.0], [256.0, 14.0]]}, attn_ms_per_token={0: 1e-4})
    assert m.predict(0, 1, 0) == 4.0 and m.predict(0, 0, 0) == 4.0  # never below the first point
    assert m.predict(0, 32, 0) == pytest.approx(4.0 + 2.0 * 31 / 63)
    assert m.predict(0, 512, 0) == pytest.approx(14.0 + 8.0 / 192 * 256)  # last slope
    assert m.predict(0, 64, 10_000) == pytest.approx(7.0)  # + attention over the context
    for _ in range(100):  # the machine is 2 ms slower at batch 64 than the prior said
        m.observe(0, 64, 0, 8.0)
    assert m.predict(0, 64, 0) == pytest.approx(8.0, abs=0.05)
    assert m.observed(0, 64) == 100


def test_cost_model_follows_a_replaced_curve():
    """The batch sizes of a curve are cached for the planner; a curve replaced by the
    warm-up (set_measured) or by assignment, at other batch sizes, is read afresh."""
    m = CostModel(base={0: [[1.0, 4.0], [64.0, 6.0]]})
    assert m.predict(0, 32, 0) == pytest.approx(4.0 + 2.0 * 31 / 63)
    m.set_measured(0, [[1, 4.0], [16, 5.0], [32, 5.5], [64, 6.0]])
    assert m.predict(0, 32, 0) == pytest.approx(5.5)
    m.base[0] = [[1.0, 3.0], [32.0, 9.0]]
    assert m.predict(0, 32, 0) == pytest.approx(9.0)
    m.observe(0, 32, 0, 9.0)
    assert m.observed(0, 32) == 1


def test_cost_model_shares_the_running_gears_drift_with_its_neighbours():
    """observe(share=True): the step's relative error also scales the other speculative
    gears' points at that batch size (by `shared` of the EMA step); plain decode (device
    time, another mode), other batch sizes and share=False observations stay."""
    m = CostModel(base={k: [[1.0, 4.0 + k], [8.0, 6.0 + k]] for k in range(4)}, ema=0.1)
    m.counts = {k: [50, 50] for k in range(4)}  # established points: the EMA rate
    pred = m.observe(2, 8, 0, 8.0 * 1.5, share=True)  # K = 2 at bs 8 is 50% slower
    assert pred == 8.0
    assert m.base[2][1][1] == pytest.approx(8.0 + 0.1 * 4.0)
    assert m.base[1][1][1] == pytest.approx(7.0 * (1 + 0.1 * 0.5))  # same relative move
    assert m.base[3][1][1] == pytest.approx(9.0 * (1 + 0.1 * 0.5))
    assert m.base[0][1][1] == 6.0 and m.base[1][0][1] == 5.0  # plain; batch size 1
    m.observe(3, 8, 0, 20.0)  # an exploration: its own gear only
    assert m.base[1][1][1] == pytest.approx(7.0 * 1.05)


def test_roofline_prior_turns_compute_bound_with_tokens():
    m = CostModel.roofline(weight_bytes=16e9, flops_per_token=16e9, kv_bytes_per_token=0,
                           num_draft_tokens=4, batch_sizes=[1, 64, 256], overhead_ms=0.0, draft_frac=0.0)
    assert m.predict(0, 1, 0) == pytest.approx(16e9 / 4.2e12 * 1e3)  # weight streaming
    assert m.predict(4, 256, 0) > 5 * m.predict(0, 1, 0)  # 1280 tokens: compute-bound


def test_one_outlier_moves_a_cost_point_at_most_twofold():
    cost = memory_bound_costs(num_draft_tokens=1)
    before = cost.predict(1, 8, 0)
    cost.observe(1, 8, 0, before * 100)  # e.g. a step that compiled or captured something
    assert cost.predict(1, 8, 0) <= 2 * before + 1e-9
    for _ in range(20):  # consistent measurements still get there
        cost.observe(1, 8, 0, before * 3)
    assert cost.predict(1, 8, 0) > 2.5 * before
