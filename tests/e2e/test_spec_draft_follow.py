"""Who the draft follows: every committed token of a request that may speculate (so it
resumes at full acceptance, see test_spec_resume.py), but nothing under spec_policy="off"
(an engine with a draft then costs what one without costs) and nothing of a request that
opted out (SamplingParams(speculative=False)). Outputs stay equal to plain decoding."""

from __future__ import annotations

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
