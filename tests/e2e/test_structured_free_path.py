"""Requests without a grammar pay nothing for structured output: every function of that
machinery is a tripwire while such a batch runs (plain steps overlapped or not, VERIFY
steps on the graphed paths, chains and trees, greedy and sampled), xgrammar's compiler is
never built, and proposals still run as graphs. With a constrained request in the batch,
the target pass stays graphed and only the proposal runs eagerly.

Data flow (tests only): LLM.generate (plain params) -> engine step pipeline, with
structured/, speculative/verify_grammar.py and the engine's early commit patched to raise.
"""

from __future__ import annotations

import pytest
from checkpoints import random_prompts
from eager_graphs import install
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams, StructuredOutput
from gearshift.forward_batch import ForwardMode
from gearshift.runner import batch
from gearshift.scheduler.scheduler import Scheduler
from gearshift.speculative import verify_grammar
from gearshift.speculative.proposers import expand
from gearshift.structured.mask import GrammarBatch

PROMPTS = random_prompts([5, 17, 3, 30, 9], seed=3)


def _tripwire(*args, **kwargs):
    raise AssertionError("a request without a grammar reached structured output's code")


@pytest.fixture
def tripwires(monkeypatch):
    for mod, name in [(batch, "step_masks"), (GrammarBatch, "apply"),
                      (verify_grammar, "TreeOnHost"), (verify_grammar, "node_masks"),
                      (verify_grammar, "constrain"), (expand, "draft_blocked")]:
        monkeypatch.setattr(mod, name, _tripwire)
    schedule = Scheduler.schedule

    def no_early_commit(self):  # a plain plan commits the step in flight first only for masks
        plan = schedule(self)
        if plan.commit_first and plan.mode is not ForwardMode.VERIFY:
            _tripwire()
        return plan
    monkeypatch.setattr(Scheduler, "schedule", no_early_commit)


@pytest.mark.parametrize("spec", [None, dict(num_draft_tokens=3),
                                  dict(num_draft_tokens=3, tree_width=2, tree_budget=6)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_unconstrained_requests_touch_none_of_it(make_llm, tiny_llama_dir, tmp_path, tripwires,
                                                 spec, temperature):
    params = SamplingParams(max_tokens=12, temperature=temperature, seed=1, ignore_eos=True)
    if spec is None:
        for overlap in (True, False):
            llm = make_llm(tiny_llama_dir, overlap_schedule=overlap)
            assert all(o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False))
            assert llm.engine.grammars._compiler is None
        return
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   spec_policy="always", **spec)
    graphs = install(llm)
    assert all(o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False))
    assert llm.engine.grammars._compiler is None and llm.spec_stats()["proposed"] > 0
    assert any(k[:2] == ("eagle3", "expand") for k in graphs.keys)


def test_a_constrained_request_keeps_the_target_pass_graphed(make_llm, tiny_llama_dir, tmp_path):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = make_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head),
                   num_draft_tokens=3, spec_policy="always")
    graphs = install(llm)
    so = StructuredOutput(regex="[a-z]{100}")  # still running when the others finish
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                             structured_output=so if i == 0 else None) for i in range(3)]
    outs = llm.generate(PROMPTS[:3], params, use_tqdm=False)
    assert outs[0].text.isalpha() and outs[0].text.islower()
    kinds = {k[0] for k in graphs.keys}
    assert "target" in kinds and "eagle3" not in kinds  # proposals eager, target graphed
