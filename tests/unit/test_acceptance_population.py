"""The population's acceptance evidence per sampling class (speculative/acceptance.py)."""

from __future__ import annotations

import pytest

from gearshift.request import Request, SamplingParams
from gearshift.speculative.acceptance import POPULATION_DECAY, Acceptance


def _req(rid: str, temperature: float) -> Request:
    return Request(rid, [1] * 8, SamplingParams(temperature=temperature), 0)


def test_greedy_and_sampled_outcomes_are_separate_populations():
    acc = Acceptance(tree=False)
    greedy, sampled = _req("g", 0.0), _req("s", 1.0)
    for _ in range(3):
        acc.record(greedy, 4, 1, 4, 4)  # every draft accepted
        acc.record(sampled, 4, 1, 4, 0)  # the first draft rejected
    (g_num, g_den), (s_num, s_den) = acc.population()
    assert g_num == g_den > 0  # greedy: no rejection
    assert s_num == 0 and s_den > 0  # sampled: only rejections
    # a plain step ages each class by its own request-steps
    acc.age_population(2, 0)
    assert acc.population()[0][1] == pytest.approx(g_den * POPULATION_DECAY ** 2)
    assert acc.population()[1][1] == pytest.approx(s_den)
    acc.age_population(0, 3)
    assert acc.population()[1][1] == pytest.approx(s_den * POPULATION_DECAY ** 3)


def test_tree_evidence_ages_with_every_plain_request_step():
    acc = Acceptance(tree=True)
    acc.record(_req("g", 0.0), 4, 4, 8, 3, chain=2)
    tree_num, tree_den, pair_num, pair_den = acc.tree_population()
    acc.age_population(1, 2)
    aged = acc.tree_population()
    assert aged == pytest.approx((tree_num * POPULATION_DECAY ** 3, tree_den * POPULATION_DECAY ** 3,
                                  pair_num * POPULATION_DECAY ** 3, pair_den * POPULATION_DECAY ** 3))
