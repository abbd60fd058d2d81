"""Scheduler unit tests: pure CPU, fed fake step results (no model)."""

from __future__ import annotations

import random

from gearshift.forward_batch import ForwardMode
from gearshift.request import Request, RequestStatus, SamplingParams
from gearshift.scheduler.kv_pool import ReqRowPool, SlotPool
from gearshift.scheduler.plan import Speculation, StepResult
from gearshift.scheduler.scheduler import Scheduler


def make(total=256, seqs=8, budget=64, max_len=256, policy=None, **spec):
    slots, rows = SlotPool(total), ReqRowPool(seqs)
    speculation = None
    if policy is not None:
        spec = {"num_draft_tokens": 3, "draft_topk": 1, "num_nodes": lambda k, w: 1 + k,
                "num_scratch": lambda k, w: 0, **spec}
        speculation = Speculation(**spec)
    return Scheduler(slots, rows, max_num_seqs=seqs, max_num_batched_tokens=budget,
                     max_model_len=max_len, speculation=speculation, policy=policy), slots, rows


def req(rid, n_prompt, max_tokens=4, **kw):
    return Request(rid, list(range(1, n_prompt + 1)), SamplingParams(max_tokens=max_tokens, **kw), 0,
                   eos_token_ids=(0,))


def fake_prepare(plan, slots, rows):
    """What BatchBuilder.prepare does to host state: rows and exactly the planned slots, the
    nodes joining each request's slot list. -> the slots per request."""
    new = []
    for r, n, nodes in zip(plan.reqs, plan.num_slots, plan.num_nodes or plan.extend_lens):
        if r.req_pool_index < 0:
            r.req_pool_index = rows.alloc()
        new.append(slots.alloc(n))
        r.slots.extend(new[-1][:nodes])
    return new


def sampled(plan, tokens):
    """A plain step's StepResult tokens: one token where the plan samples."""
    return [[t] if smp else [] for smp, t in zip(plan.sample, tokens)]


def step_once(sched, slots, rows, tokens):
    """schedule -> prepare -> commit with `tokens(plan)` sampled; -> (plan, outputs)."""
    plan = sched.schedule()
    new = fake_prepare(plan, slots, rows)
    return plan, sched.commit(plan, StepResult(new, sampled(plan, tokens(plan))))


def drive(sched, slots, rows, token=lambda r: 5, max_steps=10_000):
    """Synchronous steps until idle. token(r) is asked once the step is booked: r's output
    ends with the placeholder of the token being sampled."""
    plans = []
    while sched.has_unfinished() and len(plans) < max_steps:
        plan = sched.schedule()
        plans.append(plan)
        new = fake_prepare(plan, slots, rows)
        sched.commit(plan, StepResult(new, sampled(plan, [
            token(r) if idx >= 0 else -1 for r, idx in zip(plan.reqs, plan.placeholders)])))
        for r in sched.running:  # every running request owns a slot per computed token
            assert len(r.slots) == r.num_computed_tokens
    return plans


def test_chunked_prefill_respects_budget_then_decodes():
    sched, slots, rows = make(budget=16)
    r = req("a", 40, max_tokens=3)
    sched.add(r)
    plans = drive(sched, slots, rows)
    assert [p.extend_lens for p in plans[:3]] == [[16], [16], [8]]
    assert [p.sample for p in plans[:3]] == [[False], [False], [True]]
    assert plans[0].mode is ForwardMode.EXTEND
    assert all(p.mode is ForwardMode.DECODE for p in plans[3:])
    assert r.output_token_ids == [5, 5, 5] and r.finish_reason == "length"
    assert slots.num_free == slots.total and rows.num_free == rows.size


def test_mixed_step_carries_decodes_with_a_new_prefill():
    sched, slots, rows = make(budget=32)
    sched.add(req("a", 4, max_tokens=10))
    drive_one = lambda: step_once(sched, slots, rows, lambda p: [7] * p.batch_size)[0]
    drive_one()  # prefill a
    sched.add(req("b", 20))
    p = drive_one()
    assert [r.request_id for r in p.reqs] == ["a", "b"] and p.extend_lens == [1, 20]
    assert p.mode is ForwardMode.EXTEND


def test_finish_reasons_eos_stop_ids_ignore_eos():
    sched, slots, rows = make()
    a, b, c = req("a", 3, max_tokens=5), req("b", 3, max_tokens=5, stop_token_ids=[9]), \
        req("c", 3, max_tokens=5, ignore_eos=True)
    for r in (a, b, c):
        sched.add(r)
    seq = {"a": [4, 0], "b": [9], "c": [0, 0, 0, 0, 0]}
    drive(sched, slots, rows, token=lambda r: seq[r.request_id][len(r.output_token_ids) - 1])
    assert (a.finish_reason, a.output_token_ids) == ("stop", [4, 0])
    assert (b.finish_reason, b.output_token_ids) == ("stop", [9])
    assert (c.finish_reason, len(c.output_token_ids)) == ("length", 5)


def test_admission_limited_by_max_num_seqs_and_fifo():
    sched, slots, rows = make(seqs=2, budget=1000)
    rs = [req(str(i), 5, max_tokens=2) for i in range(5)]
    for r in rs:
        sched.add(r)
    p, _ = step_once(sched, slots, rows, lambda p: [5] * p.batch_size)
    assert [r.request_id for r in p.reqs] == ["0", "1"]
    drive(sched, slots, rows)
    assert all(r.status is RequestStatus.FINISHED for r in rs)


def test_preemption_frees_newest_and_recomputes_without_loss():
    sched, slots, rows = make(total=40, seqs=4, budget=64, max_len=40)
    rs = [req(str(i), 8, max_tokens=12) for i in range(3)]
    for r in rs:
        sched.add(r)
    plans = drive(sched, slots, rows, token=lambda r: 99 + len(r.output_token_ids))
    assert sched.num_preemptions > 0
    assert any(p.preempted for p in plans)
    for r in rs:  # every request completed with its full, in-order output
        assert r.output_token_ids == [100 + i for i in range(12)]
    assert slots.num_free == slots.total and rows.num_free == rows.size


def test_abort_running_and_waiting_frees_everything():
    sched, slots, rows = make(seqs=1)
    a, b = req("a", 10, max_tokens=50), req("b", 10)
    sched.add(a)
    sched.add(b)
    step_once(sched, slots, rows, lambda p: [5])
    assert sched.abort("a") is a and a.finish_reason == "abort"
    assert sched.abort("b") is b
    assert not sched.has_unfinished()
    assert slots.num_free == slots.total and rows.num_free == rows.size
    assert sched.abort("nope") is None


def test_random_workload_keeps_invariants():
    rng = random.Random(0)
    sched, slots, rows = make(total=120, seqs=6, budget=24, max_len=120)
    rs = []
    for i in range(40):
        r = req(str(i), rng.randint(1, 40), max_tokens=rng.randint(1, 30))
        rs.append(r)
        sched.add(r)
    plans = drive(sched, slots, rows, token=lambda r: rng.randint(1, 50))
    for p in plans:
        assert p.num_tokens <= 24 and p.batch_size <= 6
        assert len({id(r) for r in p.reqs}) == p.batch_size
    assert all(r.is_finished and len(r.output_token_ids) == r.params.max_tokens for r in rs)
    assert slots.num_free == slots.total and rows.num_free == rows.size


# ---- overlap scheduling: step n+1 planned (and booked) before step n is committed --------

def overlap_drive(sched, slots, rows, token):
    """The engine's overlapped loop: plan step n+1, then commit step n.
    token(request, output index) -> the token sampled there."""
    pending, outputs, placeholder_inputs = None, [], 0
    while sched.has_unfinished() or pending:
        plan = sched.schedule()
        step = None
        if not plan.is_empty:
            new = fake_prepare(plan, slots, rows)
            for r, p, n in zip(plan.reqs, plan.prefix_lens, plan.extend_lens):
                placeholder_inputs += sum(t < 0 for t in r.token_slice(p, p + n))
            step = (plan, new)
        if pending is not None:
            done, new = pending
            toks = [token(r, i) if i >= 0 else -1 for r, i in zip(done.reqs, done.placeholders)]
            outputs.extend(sched.commit(done, StepResult(new, sampled(done, toks))))
        pending = step
    return outputs, placeholder_inputs


def test_overlap_eos_while_next_step_is_launched():
    sched, slots, rows = make()
    a, b = req("a", 3, max_tokens=10), req("b", 5, max_tokens=10)
    sched.add(a)
    sched.add(b)
    # a emits EOS (0) as its 3rd token; by then its 4th step is already launched
    outputs, n_placeholders = overlap_drive(
        sched, slots, rows, lambda r, i: 0 if r is a and i == 2 else 7)
    assert n_placeholders > 0  # decode inputs were staged before their tokens were known
    assert a.output_token_ids == [7, 7, 0] and a.finish_reason == "stop"
    assert b.output_token_ids == [7] * 10 and b.finish_reason == "length"
    assert [o.new_token_ids for o in outputs if o.request_id == "a"] == [[7], [7], [0]]
    assert [o.finished for o in outputs if o.request_id == "b"] == [False] * 9 + [True]
    assert a.num_pending == 0 and b.num_pending == 0
    assert slots.num_free == slots.total and rows.num_free == rows.size


def test_overlap_eos_on_the_token_before_the_length_limit():
    """The last token (by length) is launched while the one before it turns out to be EOS."""
    sched, slots, rows = make()
    a = req("a", 3, max_tokens=4)
    sched.add(a)
    outputs, _ = overlap_drive(sched, slots, rows,
                               lambda r, i: 0 if i == 2 else 7)
    assert a.output_token_ids == [7, 7, 0] and a.finish_reason == "stop"
    assert [o.finish_reason for o in outputs] == [None, None, "stop"]
    assert slots.num_free == slots.total


def test_overlap_preempted_request_waits_for_its_pending_token():
    sched, slots, rows = make(total=24, budget=64)
    reqs = [req(f"r{i}", 6, max_tokens=8) for i in range(3)]
    for r in reqs:
        sched.add(r)
    outputs, _ = overlap_drive(sched, slots, rows, lambda r, i: 3)
    assert sched.num_preemptions > 0
    assert all(r.output_token_ids == [3] * 8 and r.finish_reason == "length" for r in reqs)
    assert slots.num_free == slots.total and rows.num_free == rows.size


def test_speculation_plans_a_uniform_k_near_max_tokens_and_commit_stops_at_the_limit():
    """K is the policy's for every decoding request, also for one with fewer tokens left
    than K (cutting it would give the batch mixed K, which has no captured graph); the
    VERIFY commit keeps the accepted nodes' slots and still stops that request at
    max_tokens."""
    from gearshift.policy.static import AlwaysPolicy

    sched, slots, rows = make(policy=AlwaysPolicy(3))
    a, b = req("a", 3, max_tokens=2), req("b", 3, max_tokens=20)
    sched.add(a)
    sched.add(b)
    step_once(sched, slots, rows, lambda p: [5, 5])  # prefill
    plan = sched.schedule()
    assert plan.mode is ForwardMode.VERIFY and plan.draft_lens == [3, 3]
    assert plan.num_nodes == [4, 4] and plan.num_slots == [4, 4]
    new = fake_prepare(plan, slots, rows)  # the pending token + 3 drafts each
    outs = sched.commit(plan, StepResult(new, [[6, 7, 8, 9], [6, 7, 8, 9]],
                                         kept=[[0, 1, 2, 3], [0, 1, 2, 3]]))
    assert a.output_token_ids == [5, 6] and a.finish_reason == "length"
    assert [o.new_token_ids for o in outs] == [[6], [6, 7, 8, 9]]
    assert b.num_computed_tokens == 7 and b.slots == [4, 5, 6] + new[1]


def test_verify_commit_keeps_the_accepted_path_and_frees_the_rest_by_count():
    """A tree step's nodes are not in position order: commit keeps the accepted path's slots
    at positions prefix.. in path order and frees every other node and the draft's scratch."""
    from gearshift.policy.static import AlwaysPolicy

    sched, slots, rows = make(policy=AlwaysPolicy(2, topk=2), num_draft_tokens=2, draft_topk=2,
                              num_nodes=lambda k, w: 5 if w > 1 else 1 + k,
                              num_scratch=lambda k, w: 2 * (k - 1) * w)
    r = req("r", 4, max_tokens=20)
    sched.add(r)
    step_once(sched, slots, rows, lambda p: [5])
    free = slots.num_free
    plan = sched.schedule()
    assert plan.mode is ForwardMode.VERIFY and plan.draft_topk == 2
    assert plan.num_nodes == [5] and plan.num_scratch == [4] and plan.num_slots == [9]
    new = fake_prepare(plan, slots, rows)
    assert slots.num_free == free - 9 and r.slots[4:] == new[0][:5]
    sched.commit(plan, StepResult(new, [[8, 9, 10]], kept=[[0, 3, 4]]))
    assert r.slots[4:] == [new[0][0], new[0][3], new[0][4]]
    assert r.num_computed_tokens == 7 and r.output_token_ids == [5, 8, 9, 10]
    assert slots.num_free == free - 3  # two nodes and four scratch slots back
    # a failed step keeps nothing: every slot it allocated goes back
    plan = sched.schedule()
    new = fake_prepare(plan, slots, rows)
    sched.commit(plan, StepResult(new, [[]], kept=[[]]))
    assert r.num_computed_tokens == 7 and len(r.slots) == 7 and slots.num_free == free - 3
    sched.abort("r")
    assert slots.num_free == slots.total and rows.num_free == rows.size


def test_speculation_plan_records_the_policys_tree_width_and_counts_its_slots():
    """The plan carries the step's tree width (the policy's, asked before allocation) and
    the scheduler counts the slots of that shape: a tree that does not fit in the pool
    while a chain would makes the step plain, not half-allocated."""
    from gearshift.policy.static import AlwaysPolicy

    def decoding(topk, total=256):
        """A tree-capable scheduler (width 4) with one request past its prefill."""
        sched, slots, rows = make(total=total, policy=AlwaysPolicy(2, topk), num_draft_tokens=2,
                                  draft_topk=4, num_nodes=lambda k, w: 16 if w > 1 else 1 + k)
        sched.add(req("a", 3, max_tokens=20))
        step_once(sched, slots, rows, lambda p: [5])
        return sched

    for topk, want in ((None, 4), (1, 1), (4, 4)):
        plan = decoding(topk).schedule()
        assert plan.mode is ForwardMode.VERIFY and plan.draft_topk == want
    # a pool with room for a chain's slots but not a tree's: plain decode
    sched = decoding(None, total=8)
    plan = sched.schedule()
    assert plan.mode is ForwardMode.DECODE and not plan.draft_lens and plan.draft_topk == 1
    sched = decoding(None, total=8)
    sched.set_policy(AlwaysPolicy(2, topk=1))
    plan = sched.schedule()
    assert plan.mode is ForwardMode.VERIFY and plan.draft_topk == 1


def test_the_plan_says_how_the_engine_runs_the_step():
    """Plain steps overlap (sync only with overlap scheduling off); a VERIFY step commits
    the step in flight first and runs synchronously; a plain step commits first only where
    a grammar's mask needs a token still in flight."""
    from gearshift.policy.static import AlwaysPolicy

    sched, slots, rows = make()
    sched.add(req("a", 3, max_tokens=8))
    plan = sched.schedule()  # the prefill: nothing in flight
    assert (plan.commit_first, plan.sync, plan.draft_follows) == (False, False, False)
    fake_prepare(plan, slots, rows)
    plan = sched.schedule()  # the decode launched while the prefill's token is in flight
    assert (plan.commit_first, plan.sync) == (False, False)
    sched, slots, rows = make()
    sched.overlap = False
    sched.add(req("a", 3, max_tokens=8))
    assert sched.schedule().sync
    sched, slots, rows = make(policy=AlwaysPolicy(3))
    sched.add(req("a", 3, max_tokens=8))
    step_once(sched, slots, rows, lambda p: [5])
    plan = sched.schedule()
    assert plan.mode is ForwardMode.VERIFY and plan.commit_first and plan.sync
    assert plan.draft_follows


class _Masked:
    """Stands in for a request's grammar: the scheduler only asks whether there is one."""


def test_a_grammar_with_a_token_in_flight_commits_it_first():
    sched, slots, rows = make()
    a, b = req("a", 3, max_tokens=8), req("b", 3, max_tokens=8)
    b.grammar = _Masked()
    sched.add(a)
    first = sched.schedule()
    fake_prepare(first, slots, rows)
    assert not sched.schedule().commit_first  # a's next step needs no mask
    sched, slots, rows = make()
    sched.add(b)
    fake_prepare(sched.schedule(), slots, rows)
    assert sched.schedule().commit_first  # b's mask reads the token in flight


def test_a_verify_plan_states_the_draft_s_catch_up():
    """Rows each request's draft must consume before it proposes: those it committed while
    it ran at K = 0 (none for a draft that keeps no state, or a request at K = 0)."""
    from gearshift.policy.static import AlwaysPolicy

    sched, slots, rows = make(policy=AlwaysPolicy(3), draft_catches_up=True)
    a, b = req("a", 3, max_tokens=20), req("b", 5, max_tokens=20, speculative=False)
    sched.add(a)
    sched.add(b)
    step_once(sched, slots, rows, lambda p: [5, 5])
    a.draft_rows = 1  # the draft ran over a's first row only
    plan = sched.schedule()
    assert plan.mode is ForwardMode.VERIFY and plan.draft_lens == [3, 0]
    assert plan.draft_catch_up == [2, 0]
    sched, slots, rows = make(policy=AlwaysPolicy(3))  # n-gram: no draft state
    sched.add(req("c", 3, max_tokens=20))
    step_once(sched, slots, rows, lambda p: [5])
    plan = sched.schedule()
    assert plan.mode is ForwardMode.VERIFY and plan.draft_catch_up == []
