"""Goodput with a draft tree among its gears (an engine with tree_width > 1): gear
num_draft_tokens + 1 verifies one tree of that depth per request; it is chosen when its
acceptance pays for its bigger verification, and never on an engine that verifies chains
only."""

from __future__ import annotations

import pytest

from gearshift.policy.base import PolicyView
from gearshift.policy.cost import CostModel
from gearshift.policy.goodput import GoodputPolicy
from gearshift.policy.scoring import expected_tokens
from gearshift.request import Request, SamplingParams

NUM_DRAFT_TOKENS, WIDTH, NODES = 4, 4, 16


def costs(sizes=(1, 8, 64, 256), knee_tokens=256, floor_ms=4.0) -> CostModel:
    """Memory-bound until the step's tokens pass the knee: chains verify bs * (K + 1)
    tokens, the tree bs * NODES."""
    m = CostModel()
    for g in range(NUM_DRAFT_TOKENS + 2):
        tokens = NODES if g > NUM_DRAFT_TOKENS else g + 1
        m.base[g] = [[float(bs), floor_ms * max(1.0, bs * tokens / knee_tokens)] for bs in sizes]
        m.attn_ms_per_token[g] = 0.0
    return m


def reqs(n, chain=None):
    out = []
    for i in range(n):
        r = Request(str(i), [1] * 8, SamplingParams(), 0)
        if chain is not None:  # as if many chain steps had been observed at this acceptance
            r.spec_alpha_num, r.spec_alpha_den = 1000 * chain, 1000.0
        out.append(r)
    return out


def view(rs, topk=WIDTH, chain_pop=None, tree_pop=None):
    """Population evidence (accepted, accepted + rejections) at the given acceptance."""
    pop = ((0.0, 0.0), (1000 * chain_pop, 1000.0)) if chain_pop is not None else None  # sampled
    tree = (1000 * tree_pop, 1000.0) if tree_pop is not None else None
    return PolicyView(rs, 0, NUM_DRAFT_TOKENS, pop, topk, tree)


def test_picks_the_tree_when_its_acceptance_pays_for_it():
    cost = costs()
    cost.base[NUM_DRAFT_TOKENS + 1][0][1] = 4.2  # at batch 1 the tree costs 5% more than a chain
    pol = GoodputPolicy(cost, NUM_DRAFT_TOKENS, margin=0.0)
    v = view(reqs(1, chain=0.7), chain_pop=0.7, tree_pop=0.85)
    assert pol.plan(v) == [NUM_DRAFT_TOKENS] and pol.step_topk(v) == WIDTH
    assert pol.last_prediction["gear"] == "tree"
    # the tree's extra tokens are the chain's times the population's gain on trees
    s = pol.scores(v, NUM_DRAFT_TOKENS + 1)
    gain = (expected_tokens(0.85, NUM_DRAFT_TOKENS) - 1) / (expected_tokens(0.7, NUM_DRAFT_TOKENS) - 1)
    assert s[NUM_DRAFT_TOKENS + 1][0] == pytest.approx(1 + (s[NUM_DRAFT_TOKENS][0] - 1) * gain, rel=1e-3)
    # the same acceptance on both shapes: the dearer tree loses to the chain
    pol = GoodputPolicy(cost, NUM_DRAFT_TOKENS, margin=0.0)
    v = view(reqs(1, chain=0.7), chain_pop=0.7, tree_pop=0.7)
    assert pol.plan(v) == [NUM_DRAFT_TOKENS] and pol.step_topk(v) == 1


def test_under_load_the_tree_gives_way_to_short_chains_then_plain_decode():
    pol = GoodputPolicy(costs(), NUM_DRAFT_TOKENS, margin=0.0)
    v = view(reqs(64, chain=0.7), chain_pop=0.7, tree_pop=0.85)  # 64 x 16 tree tokens
    ks = pol.plan(v)
    assert pol.step_topk(v) == 1 and 0 < ks[0] < NUM_DRAFT_TOKENS
    brute = max(range(NUM_DRAFT_TOKENS + 1),
                key=lambda k: expected_tokens(0.7, k) / costs().predict(k, 64, 0))
    assert ks[0] == brute
    v = view(reqs(256, chain=0.7), chain_pop=0.7, tree_pop=0.85)
    assert pol.plan(v) == [0] * 256 and pol.step_topk(v) == 1


def test_a_chain_engine_never_plans_the_tree():
    cost = costs()
    pol = GoodputPolicy(cost, NUM_DRAFT_TOKENS, margin=0.0)
    v = view(reqs(1, chain=0.5), topk=1, chain_pop=0.5, tree_pop=0.99)
    for _ in range(300):  # probes and neighbour explorations included
        pol.plan(v)
        assert pol.step_topk(v) == 1
    assert pol.top_gear(v) == NUM_DRAFT_TOKENS
    del cost.base[NUM_DRAFT_TOKENS + 1]  # no tree price known: no tree gear either
    assert pol.top_gear(view(reqs(1))) == NUM_DRAFT_TOKENS


def test_tree_gain_starts_at_one_and_follows_the_populations_tree_evidence():
    pol = GoodputPolicy(costs(), NUM_DRAFT_TOKENS)
    # no tree evidence yet: a tree is expected to accept what its top-1 chain does
    assert pol.scorer.tree_gain(view(reqs(1), chain_pop=0.8), 0.8) == pytest.approx(1.0)
    r = reqs(1, chain=0.8)
    s = pol.scores(view(r, chain_pop=0.8), NUM_DRAFT_TOKENS + 1)
    assert s[NUM_DRAFT_TOKENS + 1][0] == pytest.approx(s[NUM_DRAFT_TOKENS][0])
    # the population's tree steps accepted more: every request's tree gains
    s = pol.scores(view(r, chain_pop=0.8, tree_pop=0.9), NUM_DRAFT_TOKENS + 1)
    assert s[NUM_DRAFT_TOKENS + 1][0] > s[NUM_DRAFT_TOKENS][0] + 0.3
    # and less: the tree is predicted below the chain
    s = pol.scores(view(r, chain_pop=0.8, tree_pop=0.6), NUM_DRAFT_TOKENS + 1)
    assert s[NUM_DRAFT_TOKENS + 1][0] < s[NUM_DRAFT_TOKENS][0]


def simulate(cost: CostModel, actual: dict, true, steps: int, paired: bool = False,
             **kw) -> list[int]:
    """Goodput at batch 1 for `steps` steps: each step observed at actual[gear], its
    acceptance evidence (expected values at true[topk], or true(step)[topk]) recorded as
    Acceptance.record would -> the gear of every step. `paired`: tree steps also bring
    what their top-1 chain accepted (true[1]), as the request's chain evidence and as the
    population's paired chain evidence; else they age the request's chain evidence."""
    pol = GoodputPolicy(cost, NUM_DRAFT_TOKENS, **kw)
    rs = reqs(1)
    pop = {1: [0.0, 0.0], WIDTH: [0.0, 0.0], "pair": [0.0, 0.0]}
    gears = []

    def evidence(a, k):  # expected accepted drafts, accepted + a rejection, of one step
        acc = sum(a ** d for d in range(1, k + 1))
        return acc, acc + 1 - a ** k

    def add(p, acc, n, decay=0.99):
        p[0], p[1] = decay * p[0] + acc, decay * p[1] + n

    for i in range(steps):
        tree_pop = (*pop[WIDTH], *pop["pair"]) if paired else tuple(pop[WIDTH])
        v = PolicyView(rs, 0, NUM_DRAFT_TOKENS, ((0.0, 0.0), tuple(pop[1])), WIDTH, tree_pop)
        k = pol.plan(v)[0]
        topk = pol.step_topk(v)
        gear = NUM_DRAFT_TOKENS + 1 if k and topk > 1 else k
        gears.append(gear)
        pol.observe(gear, 1, 0, actual[gear])
        if k:
            a = true(i) if callable(true) else true
            r = rs[0]
            own = [r.spec_alpha_num, r.spec_alpha_den]
            add(pop[topk], *evidence(a[topk], k))
            if topk == 1 or paired:  # the chain's evidence (a tree's top-1 chain)
                add(own, *evidence(a[1], k), decay=0.9)
                if topk > 1:
                    add(pop["pair"], *evidence(a[1], k))
                    add(pop[1], *evidence(a[1], k))
            else:  # tree steps age the request's chain evidence
                own = [0.9 * own[0], 0.9 * own[1]]
            r.spec_alpha_num, r.spec_alpha_den = own
    return gears


def test_goodput_finds_the_tree_by_exploring_it():
    """From a cold start (no tree evidence: the tree is priced like the chain and costs
    more) goodput tries the tree as the chain's unmeasured neighbour, learns that it accepts
    more, and moves to it."""
    for paired in (False, True):  # tree steps bring their top-1 chain's evidence, or not
        cost = costs()
        cost.base[NUM_DRAFT_TOKENS + 1][0][1] = 4.2
        actual = {g: cost.predict(g, 1, 0) for g in range(NUM_DRAFT_TOKENS + 2)}
        gears = simulate(cost, actual, {1: 0.7, WIDTH: 0.88}, 300, paired=paired)
        assert gears[0] == NUM_DRAFT_TOKENS  # cold: the chain
        assert NUM_DRAFT_TOKENS + 1 in gears[:20]  # the tree is tried early
        assert gears[-100:].count(NUM_DRAFT_TOKENS + 1) >= 95  # and kept (probes aside): no flapping
    # paired, with a tree that accepts no more than its own top-1 chain: the chain wins
    cost = costs()
    cost.base[NUM_DRAFT_TOKENS + 1][0][1] = 4.2
    actual = {g: cost.predict(g, 1, 0) for g in range(NUM_DRAFT_TOKENS + 2)}
    gears = simulate(cost, actual, {1: 0.7, WIDTH: 0.7}, 300, paired=True)
    assert gears[-100:].count(NUM_DRAFT_TOKENS) >= 90


def test_a_tree_the_warm_up_overpriced_is_still_found_when_it_is_better():
    """The warm-up priced the tree 18% above the chain at batch 1; it really costs 6% more
    and accepts enough to be ~3% faster. The tree stays
    a fresh neighbour until its acceptance evidence is worth its prior, so goodput measures
    both, and keeps to the tree."""
    cost = costs()
    cost.base[NUM_DRAFT_TOKENS + 1][0][1] = 4.0 * 1.18  # the warm-up's price
    actual = {g: cost.predict(g, 1, 0) for g in range(NUM_DRAFT_TOKENS + 2)}
    actual[NUM_DRAFT_TOKENS + 1] = 4.0 * 1.06  # the real one
    true = {1: 0.75, WIDTH: 0.81}  # E = 3.05 vs 3.37 tokens per step: +10%
    gears = simulate(cost, actual, true, 400)
    assert gears[:40].count(NUM_DRAFT_TOKENS + 1) >= 5  # tried until measured
    assert gears[-100:].count(NUM_DRAFT_TOKENS + 1) >= 90
    # without the acceptance-evidence rule it is tried twice (cost) and never again
    gears = simulate(cost, actual, true, 400, tree_evidence=0.0)
    assert gears[-100:].count(NUM_DRAFT_TOKENS + 1) <= 5


def _chains_priced(prices: dict) -> CostModel:
    cost = costs()
    for gear, ms in prices.items():
        cost.base[gear][0][1] = ms
    return cost


def test_a_chain_the_warm_up_overpriced_is_still_measured():
    """The warm-up (three steps on dummy requests) priced K = 3 at 10.5 ms where real steps
    take 7.9: scored under explore_ratio of K = 4, it would never be tried. A neighbour only
    the warm-up priced is tried once predicted within fresh_ratio; measured, K = 3 turns out
    ~4% better than K = 4 and goodput keeps it."""
    actual = {0: 4.6, 1: 7.0, 2: 7.8, 3: 7.9, 4: 8.7, NUM_DRAFT_TOKENS + 1: 40.0}
    true = {1: 0.6, WIDTH: 0.6}
    assert expected_tokens(0.6, 3) / 7.9 > 1.03 * expected_tokens(0.6, 4) / 8.7
    warm = {**actual, 3: 10.5}  # the warm-up's price: 0.78 x K = 4's goodput
    gears = simulate(_chains_priced(warm), actual, true, 300)
    assert 3 in gears[:10] and gears[-100:].count(3) >= 90
    # with the measured neighbours' gate for it too, K = 3 is never tried
    gears = simulate(_chains_priced(warm), actual, true, 300, fresh_ratio=0.8)
    assert gears.count(3) <= 3 and gears[-100:].count(4) >= 90


def test_paired_tree_gain_follows_the_same_steps_top_1_chains():
    """With what the tree steps' own top-1 chains accepted, the gain compares both shapes on
    the same text: the drafts the trees accepted over those their top-1 chains accepted.
    The request's (stale) chain evidence does not enter it, nor per-depth rates: trees that
    accepted 261 drafts where their top-1 chains accepted 227 gain 1.15, where rates
    through E(a, 4) would make it ~1.11."""
    pol = GoodputPolicy(costs(), NUM_DRAFT_TOKENS)
    paired = PolicyView(reqs(1), 0, NUM_DRAFT_TOKENS, None, WIDTH, (8.5e4, 1e5, 7e4, 1.2e5))
    for chain_prior in (0.4, 0.7, 0.9):
        assert pol.scorer.tree_gain(paired, chain_prior) == pytest.approx(8.5 / 7, rel=1e-3)
    no_evidence = PolicyView(reqs(1), 0, NUM_DRAFT_TOKENS, None, WIDTH, (0.0, 0.0, 0.0, 0.0))
    assert pol.scorer.tree_gain(no_evidence, 0.6) == pytest.approx(1.0)
    # a few steps: the prior (population_weight x chain_prior drafts) holds the gain near 1
    few = PolicyView(reqs(1), 0, NUM_DRAFT_TOKENS, None, WIDTH, (3.0, 4.0, 2.0, 4.0))
    assert 1.0 < pol.scorer.tree_gain(few, 0.6) < 1.15
    measured = PolicyView(reqs(1), 0, NUM_DRAFT_TOKENS, None, WIDTH, (261.0, 331.0, 227.0, 318.0))
    assert pol.scorer.tree_gain(measured, 0.6) == pytest.approx(261 / 227, rel=0.02)



def test_the_tree_is_judged_on_enough_tree_steps():
    """The first trees accept what their top-1 chains do, later ones 1.2x the chain's extra
    tokens: judged on its first few trees, the gain would stay 1.00 and goodput would keep
    to the chain. The tree stays a fresh neighbour until its
    evidence weighs `tree_evidence` (~30 tree steps at batch 1), so an unlucky start is
    outweighed and goodput moves to the tree."""
    cost = costs()
    cost.base[NUM_DRAFT_TOKENS + 1][0][1] = 4.2  # the tree costs 5% more than a chain
    actual = {g: cost.predict(g, 1, 0) for g in range(NUM_DRAFT_TOKENS + 2)}

    def true(i):  # the first 30 steps (~7 trees): no gain; then 3.37 vs 3.05 tokens
        return {1: 0.75, WIDTH: 0.75 if i < 30 else 0.81}

    gears = simulate(cost, actual, true, 400, paired=True)
    assert gears[-100:].count(NUM_DRAFT_TOKENS + 1) >= 90
    gears = simulate(cost, actual, true, 400, paired=True, tree_evidence=20.0)
    assert gears[-100:].count(NUM_DRAFT_TOKENS + 1) <= 10  # judged on its first trees: the chain
