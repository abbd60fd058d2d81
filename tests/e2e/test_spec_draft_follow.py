"""Who the draft follows: every committed token of a request that may speculate (so it
resumes at full acceptance, see test_spec_resume.py), but nothing under spec_policy="off"
(an engine with a draft then costs what one without costs) and nothing of a request that
opted out (SamplingParams(speculative=False)). Plain steps run no draft forward: they
store the target features, and the draft catches up before the request speculates.
Outputs stay equal to plain decoding."""

from __future__ import annotations

import pytest
from checkpoints import random_prompts
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams

PROMPTS = random_prompts([5, 19, 11], seed=4)


def _spy_draft_extends(llm) -> list[list[str]]:
    """Request ids of every draft-extend batch the worker runs."""
    follow, calls = llm.engine.spec.follow, []
    orig = follow.extend

    def spy(reqs, *args):
        calls.append([r.request_id for r in reqs])
        return orig(reqs, *args)

    follow.extend = spy
    return calls


def test_draft_follows_only_requests_that_may_speculate(make_llm, tiny_llama_dir, tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    opted_out = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, speculative=False)
    plain = [o.token_ids for o in make_llm(tiny_llama_dir).generate(PROMPTS, greedy)]
    spec = dict(speculative_algorithm="eagle3", draft_model=str(head), num_draft_tokens=2)

    off = make_llm(tiny_llama_dir, spec_policy="off", **spec)
    calls = _spy_draft_extends(off)
    assert [o.token_ids for o in off.generate(PROMPTS, greedy)] == plain
    assert calls == []  # policy off: no draft work at all

    always = make_llm(tiny_llama_dir, spec_policy="always", **spec)
    calls = _spy_draft_extends(always)
    outs = always.generate(PROMPTS, [greedy, opted_out, greedy])
    assert [o.token_ids for o in outs] == plain
    ids = {rid for batch in calls for rid in batch}
    assert len(ids) == 2 and all(outs[1].request_id != rid for rid in ids)
    assert outs[1].spec is None or outs[1].spec.proposed == 0


def test_a_verify_step_extends_the_draft_or_stores_features_never_both(
        make_llm, tiny_llama_dir, tmp_path):
    """After a VERIFY step, a request whose draft was current runs the draft over its
    accepted tokens; only the others store their features for a later catch-up (splitting
    the two groups after the extend, which moves draft_rows, would store every extended
    request's features again: host time each VERIFY step pays)."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    # without the prefix cache, which keeps every committed token's features
    llm = make_llm(tiny_llama_dir, spec_policy="always", speculative_algorithm="eagle3",
                   draft_model=str(head), num_draft_tokens=2, enable_prefix_caching=False)
    eng, follow, calls, step = llm.engine, llm.engine.spec.follow, [], [0, False]
    run, after_commit = eng.spec.run, eng.spec.after_commit

    def spied(stage, new_step):  # number the VERIFY steps; calls outside them are not counted
        def call(*args, **kwargs):
            step[0], step[1] = step[0] + new_step, True
            try:
                return stage(*args, **kwargs)
            finally:
                step[1] = False
        return call
    eng.spec.run, eng.spec.after_commit = spied(run, 1), spied(after_commit, 0)
    for name in ("extend", "store"):
        orig = getattr(follow, name)

        def spy(reqs, *args, name=name, orig=orig):
            if step[1]:
                calls.extend((name, step[0], r.request_id) for r in reqs)
            return orig(reqs, *args)
        setattr(follow, name, spy)
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    plain = [o.token_ids for o in make_llm(tiny_llama_dir).generate(PROMPTS, greedy)]
    assert [o.token_ids for o in llm.generate(PROMPTS, greedy)] == plain
    extended = {c[1:] for c in calls if c[0] == "extend"}  # (VERIFY step, request)
    stored = {c[1:] for c in calls if c[0] == "store"}
    assert len(extended) > len(PROMPTS) and not extended & stored


def test_plain_steps_store_features_and_the_draft_catches_up_before_speculating(
        make_llm, tiny_llama_dir, tmp_path):
    from gearshift.policy.base import Policy

    class Scripted(Policy):  # plain decode for 5 steps, then K = 2
        calls = 0

        def plan(self, view):
            self.calls += 1
            return [0 if self.calls <= 5 else 2] * len(view.requests)

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2)
    eng = llm.engine
    eng.set_policy(Scripted())
    proposer, draft_runs, at_propose = eng.spec.proposer, [], []
    orig_extend, orig_propose = proposer.draft_extend, proposer.propose
    proposer.draft_extend = lambda fb, f: (draft_runs.append(fb.num_tokens), orig_extend(fb, f))[1]
    proposer.propose = lambda ctx: (at_propose.append(
        [(r.draft_rows, r.num_computed_tokens) for r in ctx.reqs]), orig_propose(ctx))[1]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(PROMPTS):
        eng.add_request(str(i), p, params)
    for _ in range(6):  # prefill + 5 plain decode steps: features stored
        eng.step()
    reqs = list(eng.scheduler.running)
    # the prefill step ran the draft over each prompt but its last row; decode steps did not
    assert draft_runs == [sum(len(p) - 1 for p in PROMPTS)]
    assert [r.draft_rows for r in reqs] == [len(p) - 1 for p in PROMPTS]
    stored = proposer.features[[s for r in reqs for s in r.slots]]
    assert stored.abs().sum(-1).gt(0).all()  # fc(features) of every computed token
    while not at_propose:
        eng.step()
    assert all(rows == computed for rows, computed in at_propose[0])  # caught up first
    assert draft_runs[1] == 6 * len(PROMPTS)  # one catch-up batch: 1 prompt row + 5 decoded
    while eng.has_unfinished_requests():
        eng.step()


def test_catch_up_is_timed_and_not_charged_to_the_verify_steps_k(
        make_llm, tiny_llama_dir, tmp_path):
    """The first VERIFY step after plain steps catches the draft up over their rows; that is
    the price of those steps, so the goodput policy observes the step's wall time less the
    catch-up (else an exploration step after many plain steps would read as that K's cost).
    Plain-decoded requests' acceptance evidence ages meanwhile."""
    from gearshift.policy.base import Policy

    class Scripted(Policy):  # plain decode for 5 steps, then K = 2
        calls = 0
        observed: list = []

        def plan(self, view):
            self.calls += 1
            return [0 if self.calls <= 5 else 2] * len(view.requests)

        def observe(self, k, bs, ctx, ms, ks=None):
            self.observed.append((k, ms))

        def observe_catch_up(self, rows, ms):  # what leaving K = 0 cost, per row
            self.caught_up.append((rows, ms))

    Scripted.caught_up = []

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2, overlap_schedule=False)
    eng = llm.engine
    pol = Scripted()
    eng.set_policy(pol)
    follow = eng.spec.follow
    orig = follow.extend

    def slow_extend(*args):  # a catch-up that visibly costs 50 ms
        import time
        time.sleep(0.05)
        return orig(*args)

    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(PROMPTS):
        eng.add_request(str(i), p, params)
    for _ in range(3):  # prefill + 2 plain steps
        eng.step()
    reqs = list(eng.scheduler.running)
    for r in reqs:
        r.spec_alpha_num, r.spec_alpha_den = 9.0, 10.0  # evidence from earlier VERIFY steps
    for _ in range(3):  # 3 more plain steps: evidence ages by 0.9 each
        eng.step()
    assert all(abs(r.spec_alpha_den - 10.0 * 0.9 ** 3) < 1e-9 for r in reqs)
    follow.extend = slow_extend
    behind = sum(r.num_computed_tokens - r.draft_rows for r in reqs)
    eng.step()  # the first VERIFY step: catch-up over every stored row
    assert eng.last_step["mode"] == "verify"
    assert follow.catch_up_ms() >= 50.0
    want = eng.last_step["time_s"] * 1e3 - follow.catch_up_ms()
    assert all(k == 0 for k, _ in pol.observed)  # a VERIFY step's cost arrives one step late
    assert pol.caught_up == [(behind, follow.catch_up_ms())] and behind >= 3 * len(reqs)
    stats = eng.spec_stats()  # reported: what leaving K = 0 cost
    assert (stats["catch_up_rows"], stats["catch_up_ms"]) == (behind, follow.catch_up_ms())
    eng.step()  # nothing behind now: nothing subtracted
    assert follow.catch_up_ms() == 0.0 and len(pol.caught_up) == 1
    assert pol.observed[-1] == (2, want)  # observed inside this VERIFY step
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.spec.acceptance.population()[0][1] > 0  # evidence over all greedy requests


def test_plain_steps_fade_the_population_towards_the_prior(make_llm, tiny_llama_dir, tmp_path):
    """After a stretch at K = 0 (the policy read hard text), new requests are priced with
    a population that fades towards goodput's prior, so speculation is tried again."""
    from gearshift.policy.base import Policy, PolicyView
    from gearshift.policy.cost import CostModel
    from gearshift.policy.goodput import GoodputPolicy

    class Plain(Policy):  # drafts (the draft follows), but plans K = 0 throughout
        def plan(self, view):
            return [0] * len(view.requests)

    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2)
    eng = llm.engine
    eng.set_policy(Plain())
    acc = eng.spec.acceptance
    acc._pop[0] = [5.0, 100.0]  # evidence of 5% acceptance from earlier requests
    prior = GoodputPolicy(CostModel(), 2).scorer.population_prior
    before = prior(PolicyView([], 0, 2, population=acc.population()))
    for rid in ("0", "1"):
        eng.add_request(rid, PROMPTS[int(rid)], SamplingParams(max_tokens=40, temperature=0.0,
                                                               ignore_eos=True))
    aged, age = [], acc.age_population
    acc.age_population = lambda g, s: aged.append((g, s)) or age(g, s)
    while eng.has_unfinished_requests():
        eng.step()
    (num, den), sampled = acc.population()
    # per request-step: two greedy requests decoding age it twice a step
    assert len(aged) >= 38 and set(aged) == {(2, 0)}
    assert den == pytest.approx(100.0 * 0.99 ** (2 * len(aged))) and sampled == (0.0, 0.0)
    assert num / den == pytest.approx(0.05)  # faded, not changed
    after = prior(PolicyView([], 0, 2, population=((num, den), sampled)))
    assert before < 0.11 < after  # from 5% towards goodput's prior (0.6)
