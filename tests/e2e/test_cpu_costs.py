"""Goodput's step costs are measured on the CPU too: the start-up times a few steps per
(batch size, K) up to a small batch, and every plain step's wall time reaches the policy
(a CPU runs a step as it is launched: overlapped or not, its wall time is its cost)."""

from __future__ import annotations

from checkpoints import random_prompts
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams
from gearshift.engine.warmup import CPU_MAX_BATCH
from gearshift.policy.base import Policy


def test_the_cpu_start_up_measures_goodputs_costs(make_llm, tiny_llama_dir, tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2, max_num_seqs=16)  # goodput
    eng = llm.engine
    measured = eng.measured_costs
    assert sorted(measured) == [0, 1, 2]
    sizes = [1.0, 2.0, 4.0, 8.0]
    assert CPU_MAX_BATCH == 8 and all([p[0] for p in pts] == sizes for pts in measured.values())
    for k, pts in measured.items():  # goodput starts from them; 16 keeps the prior's shape
        curve = eng.policy.cost.base[k]
        assert curve[:4] == pts and [p[0] for p in curve[4:]] == [16.0] and curve[4][1] > 0
    assert eng.stats()["steps"] == 0 and not eng.has_unfinished_requests()


def test_no_warm_up_for_a_policy_that_prices_nothing(make_llm, tiny_llama_dir, tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2, spec_policy="always")
    assert llm.engine.measured_costs is None


class PlainRecorder(Policy):
    """Drafts (the draft follows) but plans K = 0; records what the engine observes."""

    def __init__(self) -> None:
        self.observed: list[tuple[int, int, float]] = []

    def plan(self, view):
        return [0] * len(view.requests)

    def observe(self, k, bs, ctx_tokens, ms, ks=None) -> None:
        self.observed.append((k, bs, ms))


def test_overlapped_plain_steps_reach_the_policy_on_the_cpu(make_llm, tiny_llama_dir, tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=2, spec_policy="always")
    eng = llm.engine
    assert eng.overlap  # overlap scheduling is on, as by default
    spy = PlainRecorder()
    eng.set_policy(spy)
    llm.generate(random_prompts([6, 9], seed=3),
                 SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True), use_tqdm=False)
    decode_steps = eng.stats()["decode_steps"]
    assert decode_steps >= 9
    assert len(spy.observed) == decode_steps  # every plain decode step, none missed
    assert all(k == 0 and bs in (1, 2) and ms > 0 for k, bs, ms in spy.observed)
