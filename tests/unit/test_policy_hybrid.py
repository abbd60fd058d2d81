"""The hybrid policy (eagle3+suffix) at toy size, on the CPU: per request and in one step it
gives suffix decoding to a request copying its prompt (a long draft) and EAGLE-3 to one
writing novel text; it prices suffix drafts by their calibrated match scores; it leaves
the model's cost model alone on steps deeper than its gears.

Data flow (tests only): Requests with token histories -> SuffixProposer.preview /
SuffixPricer.values -> PolicyView.suffix_values -> HybridPolicy.plan -> K, proposers.
"""

from __future__ import annotations

import random

import pytest
from policy_helpers import measured_online, memory_bound_costs

from gearshift.policy.base import PolicyView
from gearshift.policy.cost import CostModel
from gearshift.policy.goodput import GoodputPolicy
from gearshift.policy.hybrid import HybridPolicy
from gearshift.policy.static import AlwaysPolicy
from gearshift.request import Request, SamplingParams
from gearshift.speculative.proposers.suffix import SuffixProposer
from gearshift.speculative.proposers.suffix_price import ScoreMap, SuffixPricer

SPAN = list(range(100, 160))  # a 60-token span the copying request re-emits


def copying(rid: str) -> Request:
    """Prompt: the span, then an instruction; output so far: the span's first 20 tokens."""
    r = Request(rid, SPAN + [7, 8, 9], SamplingParams(max_tokens=200), 0)
    r.output_token_ids = SPAN[:20]
    return r


def novel(rid: str, seed: int = 0) -> Request:
    rng = random.Random(seed)
    r = Request(rid, [rng.randrange(1000, 9000) for _ in range(60)],
                SamplingParams(max_tokens=200), 0)
    r.output_token_ids = [rng.randrange(1000, 9000) for _ in range(20)]
    return r


def view_of(reqs, pricer: SuffixPricer, k_model: int = 4, k_suffix: int = 16) -> PolicyView:
    for r in reqs:  # EAGLE-3's own evidence: acceptance 0.7 per token
        r.spec_alpha_num, r.spec_alpha_den = 700.0, 1000.0
    return PolicyView(reqs, 0, k_model, ((7.0, 10.0), (7.0, 10.0)),
                      suffix_values=pricer.values(reqs, k_suffix), suffix_draft_tokens=k_suffix)


def goodput(k: int = 4) -> GoodputPolicy:
    return GoodputPolicy(measured_online(memory_bound_costs(k)), k, explore_every=10 ** 6)


@pytest.mark.parametrize("inner", ["goodput", "always"])
def test_suffix_for_the_copying_request_eagle3_for_the_novel_one_in_one_step(inner):
    pricer = SuffixPricer(SuffixProposer(0).preview)
    reqs = [copying("copy"), novel("new"), copying("copy2"), novel("new2", 1)]
    view = view_of(reqs, pricer)
    policy = HybridPolicy(goodput() if inner == "goodput" else AlwaysPolicy(4), "eagle3")
    ks = policy.plan(view)
    props = policy.step_proposers(view)
    assert props == ["suffix", "eagle3", "suffix", "eagle3"]
    assert ks[0] > 4 and ks[2] > 4, "a strong match earns a draft longer than the model's K"
    assert ks[1] == ks[3] == 4
    assert view.suffix_values[1] == [], "random text has no match"
    assert policy.picks == {"eagle3": 2, "suffix": 2}


def test_the_modes_compare_one_proposer_against_the_other():
    pricer = SuffixPricer(SuffixProposer(0).preview)
    reqs = [copying("copy"), novel("new")]
    model = HybridPolicy(goodput(), "eagle3", mode="model")
    assert model.plan(view_of(reqs, pricer)) == [4, 4]
    assert model.step_proposers(None) == ["eagle3", "eagle3"]
    alone = HybridPolicy(goodput(), "eagle3", mode="suffix")
    ks = alone.plan(view_of(reqs, pricer))
    assert ks[0] > 4 and ks[1] == 0
    assert alone.step_proposers(None)[0] == "suffix"


def test_a_weak_match_stays_with_the_model():
    """The same copying request, after its suffix drafts were mostly rejected: the
    calibrated values fall, and EAGLE-3 expects more."""
    pricer = SuffixPricer(SuffixProposer(0).preview)
    for depth in range(1, 17):  # drafts scored >= 0.9 were rejected at every depth
        for _ in range(200):
            pricer.map.record(0.95, depth, False)
    reqs = [copying("copy"), novel("new")]
    policy = HybridPolicy(goodput(), "eagle3")
    policy.plan(view_of(reqs, pricer))
    assert policy.step_proposers(None) == ["eagle3", "eagle3"]


def test_the_score_map_starts_at_the_score_and_follows_outcomes():
    m = ScoreMap()
    assert m(0.95) == pytest.approx(0.95) and m(0.33) == pytest.approx(0.35)
    for _ in range(200):
        m.record(0.95, 1, False)
    assert m(0.95) < 0.1 and m(0.95, 2) == pytest.approx(0.95)
    assert m(0.33) == pytest.approx(0.35)


def test_a_chain_is_priced_node_by_node_as_the_map_says_after_every_outcome():
    rng = random.Random(5)
    m = ScoreMap()
    scores = [rng.random() for _ in range(70)]  # depths past every bucket's bound
    for _ in range(3):
        assert m.chain(scores) == [m(s, j) for j, s in enumerate(scores, start=1)]
        for _ in range(100):
            m.record(rng.random(), rng.randint(1, 40), rng.random() < 0.6)


def test_a_suffix_outcome_calibrates_what_was_priced():
    pricer = SuffixPricer(SuffixProposer(0).preview)
    req = copying("copy")
    values = pricer.values([req], 8)[0]
    assert len(values) == 8 and min(values) > 0.5
    for _ in range(50):
        pricer.values([req], 8)
        pricer.record(req, 8, 2)  # two accepted of eight
    after = pricer.values([req], 8)[0]
    assert after[0] > 0.8 and after[-1] < 0.3


def test_a_pending_token_is_priced_from_the_tokens_known():
    """Planned while the step before samples its token: the chain from one token back, its
    guess for that token dropped."""
    proposer = SuffixProposer(0)
    req = copying("copy")
    req.output_token_ids = SPAN[:20] + [-1]
    req.num_pending = 1
    d = proposer.preview(req, 8)
    assert d.tokens == SPAN[21:29]
    assert d.parents == list(range(8))


def test_deeper_steps_than_the_models_gears_are_not_observed():
    inner = goodput()
    policy = HybridPolicy(inner, "eagle3")
    seen = []
    inner.observe = lambda *a, **kw: seen.append(a)
    policy.observe(12, 1, 100, 5.0)
    policy.observe(3, 2, 100, 5.0, ks=[2, 14])
    policy.observe(3, 2, 100, 5.0, ks=[2, 4])
    assert len(seen) == 1


def test_only_a_policy_that_prices_suffix_drafts_gets_their_values():
    """The suffix matches are host work at planning: EAGLE-3 alone (model-only, or any
    other policy set on a hybrid engine) plans without them."""
    from test_scheduler import step_once

    from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
    from gearshift.scheduler.plan import Speculation
    from gearshift.scheduler.scheduler import Scheduler

    priced = []

    def values(reqs, k):
        priced.append(len(reqs))
        return [[0.9] * k for _ in reqs]

    spec = Speculation(4, 1, lambda k, t: k + 1, lambda k, t: 0, proposer="eagle3",
                       suffix_draft_tokens=8, suffix_values=values)
    for policy, calls in ((HybridPolicy(AlwaysPolicy(4), "eagle3"), 1),
                          (HybridPolicy(AlwaysPolicy(4), "eagle3", mode="model"), 0),
                          (AlwaysPolicy(4), 0)):
        priced.clear()
        slots, rows = SlotPool(256), ReqRowPool(4)
        s = Scheduler(slots, rows, max_num_seqs=4, max_num_batched_tokens=64,
                      max_model_len=200, speculation=spec, policy=policy, overlap=False)
        s.add(Request("r", [1, 2, 3], SamplingParams(max_tokens=8), 0))
        step_once(s, slots, rows, lambda plan: [5])  # the prefill
        plan = s.schedule()
        assert len(priced) == calls
        assert plan.proposers == (["suffix"] if calls else ["eagle3"])
        assert plan.draft_lens == ([8] if calls else [4])


def test_deep_suffix_drafts_are_cut_to_the_profiled_verify_size():
    """A VERIFY step sends at most the tokens the start-up profiled (max_num_seqs chains of
    the model's depth): suffix drafts deeper than that are cut, deepest first; past
    `deep_batch` decoding requests (no graphs of deep chains) none goes past the model's K."""
    from test_scheduler import step_once

    from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
    from gearshift.scheduler.plan import Speculation
    from gearshift.scheduler.scheduler import Scheduler

    def values(reqs, k):
        return [[0.95] * k for _ in reqs]

    for cap, deep_batch, want in ((0, 0, [8, 8]), (12, 0, [2, 8]), (0, 2, [8, 8]),
                                  (0, 1, [2, 2])):
        spec = Speculation(2, 1, lambda k, t: k + 1, lambda k, t: 0, proposer="eagle3",
                           suffix_draft_tokens=8, suffix_values=values, max_verify_tokens=cap,
                           deep_batch=deep_batch)
        slots, rows = SlotPool(256), ReqRowPool(2)
        s = Scheduler(slots, rows, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=200,
                      speculation=spec, policy=HybridPolicy(AlwaysPolicy(2), "eagle3"),
                      overlap=False)
        s.add(Request("a", [1, 2, 3], SamplingParams(max_tokens=20), 0))
        s.add(Request("b", [1, 2, 3], SamplingParams(max_tokens=20), 0))
        step_once(s, slots, rows, lambda plan: [5, 5])  # the prefills
        plan = s.schedule()
        assert plan.proposers == ["suffix", "suffix"]
        assert sorted(plan.draft_lens) == want
        assert not cap or sum(plan.num_nodes) <= cap


def draft_heavy_costs(kmax: int = 4) -> CostModel:
    """A step: 10 ms, 1 ms per verified draft, 2 ms per draft step of the model."""
    m = CostModel(draft_ms_per_depth=2.0)
    for k in range(kmax + 1):
        m.base[k] = [[1.0, 10.0 + 3.0 * k], [8.0, 12.0 + 3.0 * k]]
        m.attn_ms_per_token[k] = 0.0
    return measured_online(m)


def test_a_step_without_model_drafts_is_priced_without_the_draft_pass():
    """EAGLE-3 at 0.9 expects 4.1 tokens from K = 4 (22 ms with its draft); the suffix chain
    expects 4.0 from K = 4, and runs no draft pass (14 ms): suffix wins by far."""
    pricer = SuffixPricer(SuffixProposer(0).preview)
    req = copying("copy")
    inner = GoodputPolicy(draft_heavy_costs(), 4, explore_every=10 ** 6)
    policy = HybridPolicy(inner, "eagle3")
    view = view_of([req], pricer, k_suffix=8)
    req.spec_alpha_num, req.spec_alpha_den = 900.0, 1000.0
    view.suffix_values = [[0.75] * 4]
    assert policy.plan(view) == [4]
    assert policy.step_proposers(view) == ["suffix"]
    free = policy.free_cost
    assert free.predict(4, 1, 0) == pytest.approx(14.0)  # 22 ms less 4 draft steps
    assert free.predict(8, 1, 0) == pytest.approx(18.0)  # past K = 4: 1 ms per draft


def test_steps_without_model_drafts_price_themselves_not_the_models_gears():
    inner = GoodputPolicy(draft_heavy_costs(), 4, explore_every=10 ** 6)
    policy = HybridPolicy(inner, "eagle3")
    pricer = SuffixPricer(SuffixProposer(0).preview)
    policy.plan(view_of([copying("copy")], pricer))  # builds the suffix steps' table
    before = [list(p) for p in inner.cost.base[2]]
    priced = policy.free_cost.predict(2, 1, 100)
    policy.observe_model_free(2, 1, 100, 8.0)
    assert inner.cost.base[2] == before, "no draft pass ran: not a price of gear 2"
    assert policy.free_cost.predict(2, 1, 0) == pytest.approx(8.0)
    # the bench's measured / predicted per mode: the model-free steps against their table
    assert "free" not in inner.prediction_log
    assert policy.prediction_log["free"] == [8.0, pytest.approx(priced), 1] and priced > 8.0
    alone = HybridPolicy(GoodputPolicy(draft_heavy_costs(), 4, explore_every=10 ** 6),
                         "eagle3", mode="suffix")
    seen = []
    alone.inner.observe = lambda *a, **kw: seen.append(a)
    alone.observe_model_free(2, 1, 100, 8.0)
    assert seen == [(2, 1, 100, 8.0, None)], "suffix decoding alone prices its gears as before"


def test_the_models_last_rows_decode_plainly_where_its_draft_pass_no_longer_pays():
    """Goodput plans K = 4 for both requests (at 0.9 acceptance); the copying one then
    drafts from its suffix. The novel one's 3.1 extra tokens would need the draft pass
    (8 ms): without it the step is 4 + 14 ms shorter, so it decodes plainly."""
    pricer = SuffixPricer(SuffixProposer(0).preview)
    reqs = [copying("copy"), novel("new")]
    inner = GoodputPolicy(draft_heavy_costs(), 4, explore_every=10 ** 6)
    policy = HybridPolicy(inner, "eagle3")
    view = view_of(reqs, pricer, k_suffix=8)
    for r in reqs:
        r.spec_alpha_num, r.spec_alpha_den = 900.0, 1000.0
    view.suffix_values = [[0.95] * 8, []]
    assert inner.plan(view) == [4, 4]
    assert policy.plan(view) == [8, 0]
    assert policy.step_proposers(view) == ["suffix", "eagle3"]


def test_a_slow_suffix_gear_does_not_move_the_others():
    inner = GoodputPolicy(draft_heavy_costs(), 4, explore_every=10 ** 6)
    policy = HybridPolicy(inner, "eagle3")
    policy.plan(view_of([copying("copy")], SuffixPricer(SuffixProposer(0).preview)))
    deep = policy.free_cost.predict(8, 1, 0)
    for _ in range(20):
        policy.observe_model_free(4, 1, 0, 200.0)
    assert policy.free_cost.predict(4, 1, 0) > 100.0
    assert policy.free_cost.predict(8, 1, 0) == pytest.approx(deep)


def test_the_models_tree_steps_price_its_tree_gear():
    """A tree step is gear K + 1 of the model's cost model: the hybrid passes its time on
    (dropped, the tree's price stays at its start-up figure however slow real tree steps
    run, and goodput keeps choosing it); a mixed chain step deeper than K is no gear."""
    class Inner(GoodputPolicy):
        def __init__(self):
            super().__init__(measured_online(memory_bound_costs(4)), 4)
            self.seen = []

        def step_topk(self, view):
            return 4  # trees

        def observe(self, k, bs, ctx_tokens, ms, ks=None):
            self.seen.append((k, ks))

    inner = Inner()
    policy = HybridPolicy(inner, "eagle3", mode="model")
    reqs = [novel("a"), novel("b")]
    policy.plan(PolicyView(reqs, 0, 4))
    assert policy.step_topk(PolicyView(reqs, 0, 4)) == 4
    policy.observe(5, 2, 100, 90.0)  # the tree
    policy.observe(4, 2, 100, 20.0, ks=[9, 4])  # a suffix chain deeper than K beside the model's
    policy.observe(3, 2, 100, 15.0)
    assert inner.seen == [(5, None), (3, None)]



def test_requests_suffix_decoding_does_not_draft_are_previewed_less_often():
    """A request priced and not drafted by suffix decoding (the plan fed back by chosen()),
    or with no chain at all, waits 1, 2, 4, then 8 plans before its next preview; one that
    suffix decoding drafts is previewed every plan, and being chosen again resets the wait."""
    seen = []
    proposer = SuffixProposer(0)

    def preview(req, k):
        seen.append(req.request_id)
        return proposer.preview(req, k)

    pricer = SuffixPricer(preview)
    reqs = [copying("copy"), copying("other"), novel("new")]
    for _ in range(24):
        values = pricer.values(reqs, 16)
        assert values[0] and not values[2]
        pricer.chosen(reqs, ["suffix", "eagle3", "eagle3"])
    assert seen.count("copy") == 24
    assert seen.count("other") == seen.count("new") == 5  # plans 1, 3, 6, 11, 20 of 24
    previewed = []
    for _ in range(12):  # once previewed again, suffix decoding takes it: every plan after
        n = seen.count("other")
        values = pricer.values(reqs, 16)
        previewed.append(seen.count("other") > n)
        pricer.chosen(reqs, ["suffix", "suffix" if values[1] else "", ""])
    first = previewed.index(True)
    assert first <= 8 and all(previewed[first:])


def test_deep_suffix_chains_replace_the_models_tree_where_they_pay():
    """An engine with trees: the inner policy picks the model's tree; where requests copy,
    chains with their suffix drafts past the tree's depth are predicted to commit more a
    millisecond, so the step verifies chains; novel requests keep the tree."""
    cost = measured_online(memory_bound_costs(5))  # gears K = 0..4 and the tree (5)

    def plan(reqs):
        pricer = SuffixPricer(SuffixProposer(0).preview)
        policy = HybridPolicy(GoodputPolicy(cost, 4, explore_every=10 ** 6), "eagle3")
        for r in reqs:
            r.spec_alpha_num, r.spec_alpha_den = 700.0, 1000.0
        view = PolicyView(reqs, 0, 4, ((7.0, 10.0), (7.0, 10.0)), topk=2,
                          tree_population=(1400.0, 2000.0, 1000.0),  # trees: 1.4x drafts
                          suffix_values=pricer.values(reqs, 16), suffix_draft_tokens=16)
        ks = policy.plan(view)
        return ks, policy.step_topk(view), policy.step_proposers(view)

    ks, topk, props = plan([copying("c1"), copying("c2")])
    assert topk == 1 and props == ["suffix", "suffix"] and min(ks) > 4
    ks, topk, props = plan([novel("n1"), novel("n2", 1)])
    assert topk == 2 and ks == [4, 4] and props == ["eagle3", "eagle3"]


def test_a_request_whose_index_is_being_built_is_priced_the_next_plan():
    """A deferred preview (index_ahead builds the request's index while the device runs) is
    no evidence against suffix decoding: the request is priced again at the next plan,
    without the wait a request with no chain gets."""
    suffix = SuffixProposer(0)
    pricer = SuffixPricer(suffix.preview, suffix.defer)
    suffix.index_ahead([])  # the engine indexes between steps from now on
    req = copying("copy")
    assert pricer.values([req], 8) == [[]]
    pricer.chosen([req], ["eagle3"])
    suffix.index_ahead([req])  # while the step's device runs
    assert len(pricer.values([req], 8)[0]) == 8
