"""Requests that use no penalty, bias, min_tokens or logprobs pay nothing for them: every
function of that machinery is a tripwire while such a batch runs (plain steps, overlapped
or not, and VERIFY steps on the graphed paths: chains, trees, greedy and sampled), no count
table is made, and the speculative steps replay the same graph shapes as before. With a
penalised request in the batch the target pass stays graphed and only the proposal runs
eagerly.

Data flow (tests only): LLM.generate (plain params) -> engine step pipeline, with
runner/penalties.py, runner/logprobs.py, speculative/verify_logits.py and the draft's
penalties patched to raise.
"""

from __future__ import annotations

import pytest
from checkpoints import random_prompts
from eager_graphs import install
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams
from gearshift.runner import logprobs, penalties
from gearshift.speculative import verify_logits
from gearshift.speculative.proposers import expand

PROMPTS = random_prompts([5, 17, 3, 30, 9], seed=3)


def _tripwire(*args, **kwargs):
    raise AssertionError("a request without penalties or logprobs reached their code")


@pytest.fixture
def tripwires(monkeypatch):
    for mod, name in [(penalties.PenaltyBatch, "apply"), (penalties, "stage_penalties"),
                      (penalties.TokenCounts, "__init__"), (logprobs, "plan_logprobs"),
                      (logprobs, "token_logprobs"), (verify_logits, "penalise"),
                      (verify_logits, "path_logprobs"), (expand, "_penalised")]:
        monkeypatch.setattr(mod, name, _tripwire)
    # the modules that imported these names keep their own references
    from gearshift.runner import batch, model_runner

    for mod, name in [(batch, "stage_penalties"), (batch, "plan_logprobs"),
                      (model_runner, "token_logprobs")]:
        monkeypatch.setattr(mod, name, _tripwire)


@pytest.mark.parametrize("spec", [None, dict(num_draft_tokens=3),
                                  dict(num_draft_tokens=3, tree_width=2, tree_budget=6)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_plain_requests_touch_none_of_it(make_llm, tiny_llama_dir, tmp_path, tripwires, spec,
                                         temperature):
    params = SamplingParams(max_tokens=12, temperature=temperature, seed=1, ignore_eos=True,
                            stop_token_ids=[7])
    if spec is None:
        for overlap in (True, False):
            llm = make_llm(tiny_llama_dir, overlap_schedule=overlap)
            assert all(o.token_ids for o in llm.generate(PROMPTS, params))
            assert llm.engine.runner._counts is None
        return
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   spec_policy="always", **spec)
    graphs = install(llm)
    assert all(o.token_ids for o in llm.generate(PROMPTS, params))
    assert llm.engine.runner._counts is None and llm.spec_stats()["proposed"] > 0
    assert any(k[:2] == ("eagle3", "expand") for k in graphs.keys)


def test_a_penalised_request_keeps_the_target_pass_graphed(make_llm, tiny_llama_dir, tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, spec_policy="always")
    graphs = install(llm)
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                             repetition_penalty=1.5 if i == 0 else 1.0) for i in range(3)]
    llm.generate(PROMPTS[:3], params)
    kinds = {k[0] for k in graphs.keys}
    assert "target" in kinds and "eagle3" not in kinds  # proposals eager, target graphed
