"""The engine lets the policy prepare the next plan during a VERIFY step: Policy.prepare is
called once per VERIFY step, with that step's decoding requests, after the step is
launched and before its result is read (on a GPU the host would otherwise wait idle for
the device there; goodput scores its gears in that time)."""

from __future__ import annotations

from checkpoints import random_prompts
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams
from gearshift.policy.base import Policy, PolicyView


class Recording(Policy):
    """K = 2 every decode step; records what plan and prepare saw."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def plan(self, view: PolicyView) -> list[int]:
        assert view.draft_catches_up  # EAGLE-3 keeps draft KV: goodput prices its catch-up
        self.seen.append(("plan", [(r.request_id, len(r.output_token_ids))
                                   for r in view.requests]))
        return [2] * len(view.requests)

    def prepare(self, view: PolicyView) -> None:
        self.seen.append(("prepare", [(r.request_id, len(r.output_token_ids))
                                      for r in view.requests]))


def test_prepare_runs_inside_each_verify_step_before_its_commit(make_llm, tiny_llama_dir,
                                                                tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([5, 19, 11], seed=4)
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    plain = [o.token_ids for o in make_llm(tiny_llama_dir).generate(prompts, greedy)]
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2, overlap_schedule=False)
    eng = llm.engine
    pol = Recording()
    eng.set_policy(pol)
    verify_steps = []
    run = eng.spec.run
    eng.spec.run = lambda plan, batch, **kw: verify_steps.append(plan) or run(plan, batch, **kw)
    assert [o.token_ids for o in llm.generate(prompts, greedy)] == plain
    prepared = [seen for kind, seen in pol.seen if kind == "prepare"]
    assert len(prepared) == len(verify_steps) > 0
    # each prepare follows its step's plan and sees the same requests, nothing committed yet
    for i, (kind, seen) in enumerate(pol.seen):
        if kind == "prepare":
            assert pol.seen[i - 1] == ("plan", seen)


class Observing(Recording):
    """Recording, plus the steps it observes: (K, batch size, ms)."""

    def observe(self, k: int, bs: int, ctx_tokens: int, ms: float, ks=None) -> None:
        self.seen.append(("observe", (k, bs, round(ms, 6))))


def test_a_verify_steps_cost_is_observed_inside_the_next_step_before_its_sync(
        make_llm, tiny_llama_dir, tmp_path):
    """Observing a VERIFY step's cost (goodput: its cost model's update) waits for the next
    step: a VERIFY step observes it in its prepare window (the device busy, the host
    otherwise waiting), just before prepare(); a plain step or an idle engine, before it
    runs. Nothing is lost, and it reaches the policy that ran the step."""
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    prompts = random_prompts([5, 19, 11], seed=4)
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2, overlap_schedule=False)
    eng = llm.engine
    pol = Observing()
    eng.set_policy(pol)
    walls = []
    step = eng.step

    def timed_step():
        out = step()
        if eng.last_step.get("mode") == "verify":
            ms = eng.last_step["time_s"] * 1e3 - eng.spec.follow.catch_up_ms()
            walls.append((2, eng.last_step["batch_size"], round(ms, 6)))
        return out

    eng.step = timed_step
    llm.generate(prompts, greedy)
    observed = [seen for kind, seen in pol.seen if kind == "observe" and seen[0] == 2]
    assert len(walls) > 2 and observed == walls[:-1]  # the last one waits for a next step
    kinds = [kind for kind, _ in pol.seen]
    for i, (kind, seen) in enumerate(pol.seen):
        if kind == "observe" and seen[0] == 2 and kinds[i + 1:i + 2] == ["prepare"]:
            assert kinds[i - 1] == "plan"  # between the next step's plan and its prepare
    later = Observing()
    eng.step = step
    eng.set_policy(later)
    eng.step()  # the last step's cost went to the policy that ran it
    assert [s for kind, s in pol.seen if kind == "observe" and s[0] == 2] == walls
    assert later.seen == []


class MixedThenUniform(Policy):
    """K = 1, 3, 1, ... per request on odd plans, K = 2 for all on even ones; records what
    it observes: (gear, batch size, K per request or None)."""

    def __init__(self) -> None:
        self.calls, self.observed = 0, []

    def plan(self, view: PolicyView) -> list[int]:
        self.calls += 1
        n = len(view.requests)
        return [1 + 2 * (i % 2) for i in range(n)] if self.calls % 2 else [2] * n

    def observe(self, k: int, bs: int, ctx_tokens: int, ms: float, ks=None) -> None:
        self.observed.append((k, bs, ks))


def test_a_mixed_k_step_is_observed_with_its_k_per_request(make_llm, tiny_llama_dir):
    """goodput-request prices a step that mixes K against the mix (CostFeedback passes the
    plan's K per request); a uniform step is observed as its gear alone."""
    from gearshift.policy.allocation import chain_gear

    llm = make_llm(tiny_llama_dir, speculative_algorithm="ngram", num_draft_tokens=3,
                   overlap_schedule=False)
    pol = MixedThenUniform()
    llm.engine.set_policy(pol)
    llm.generate(random_prompts([6, 9, 4, 12], seed=2),
                 SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    mixed = [(k, ks) for k, bs, ks in pol.observed if ks is not None]
    uniform = [k for k, bs, ks in pol.observed if k and ks is None]
    assert mixed and all(len(set(ks)) > 1 and k == chain_gear(ks) for k, ks in mixed)
    assert uniform and set(uniform) == {2}


class CountingObserver(Policy):
    """K = 2 every decode step; records the gears observed."""

    def __init__(self) -> None:
        self.observed: list[int] = []

    def plan(self, view: PolicyView) -> list[int]:
        return [2] * len(view.requests)

    def observe(self, k: int, bs: int, ctx_tokens: int, ms: float, ks=None) -> None:
        self.observed.append(k)


def test_a_verify_step_with_a_prefill_chunk_riding_along_is_not_observed(make_llm,
                                                                          tiny_llama_dir):
    """A chunk riding in a VERIFY step (every step here: prompts arrive in 4-token chunks)
    adds its prefill to the step's wall time, which is no gear's price: such steps are not
    observed; the others are."""
    llm = make_llm(tiny_llama_dir, speculative_algorithm="ngram", num_draft_tokens=3,
                   overlap_schedule=False, max_num_batched_tokens=5)
    pol = CountingObserver()
    llm.engine.set_policy(pol)
    schedule, plans = llm.engine.scheduler.schedule, []
    llm.engine.scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
    llm.generate(random_prompts([3, 30, 40], seed=4),
                 SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    verify = [p for p in plans if p.speculating]
    riding = [p for p in verify if not all(p.decoding)]
    assert riding and len(riding) < len(verify)
    # a VERIFY step is observed inside the next one (or at a plain step): the last may not be
    spec = [k for k in pol.observed if k]
    assert len(verify) - len(riding) - 1 <= len(spec) <= len(verify) - len(riding)
