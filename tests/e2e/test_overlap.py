"""Overlap scheduling (the default) changes when the host learns a step's tokens, never
which tokens: outputs equal the synchronous engine's token for token, for greedy and seeded
sampling, with EOS / stop ids finishing requests while their next step is already launched,
multi-chunk prefill, preemption, aborts mid-run, and a draft model that follows every
token on the device (EAGLE-3 at K = 0 and under the random policy)."""

from __future__ import annotations

import pytest
from checkpoints import random_prompts
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams

PROMPTS = random_prompts([3, 17, 40, 9, 25, 6, 31, 12], seed=21)
ENGINES = {
    "plain": {},
    "chunked": dict(max_num_batched_tokens=16),
    "preempt": dict(kv_cache_tokens=160, max_num_batched_tokens=64),
}


def _params(stop_token: int | None) -> list[SamplingParams]:
    out = []
    for i in range(len(PROMPTS)):
        stop = [stop_token] if stop_token is not None and i % 2 == 0 else None
        if i % 3 == 2:  # seeded sampling: counter-based, so the same tokens in any schedule
            out.append(SamplingParams(max_tokens=20 + i, temperature=0.9, top_p=0.9, seed=i,
                                      stop_token_ids=stop))
        else:
            out.append(SamplingParams(max_tokens=20 + i, temperature=0.0, stop_token_ids=stop))
    return out


def _run(make_llm, model_dir, overlap: bool, params, **kw):
    llm = make_llm(model_dir, overlap_schedule=overlap, **kw)
    return [(o.token_ids, o.finish_reason) for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("engine", list(ENGINES))
def test_overlap_equals_synchronous(make_llm, tiny_llama_dir, engine):
    kw = ENGINES[engine]
    ref = _run(make_llm, tiny_llama_dir, False, _params(None), **kw)
    stop_token = ref[0][0][4]  # a token greedy request 0 emits: stops requests early
    params = _params(stop_token)
    sync = _run(make_llm, tiny_llama_dir, False, params, **kw)
    assert any(reason == "stop" for _, reason in sync)  # early finishes really happen
    assert _run(make_llm, tiny_llama_dir, True, params, **kw) == sync


def test_abort_mid_run_leaves_the_others_intact(make_llm, tiny_llama_dir):
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    ref = _run(make_llm, tiny_llama_dir, False, [params] * len(PROMPTS))
    llm = make_llm(tiny_llama_dir, overlap_schedule=True)
    eng = llm.engine
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", p, params)
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPTS))}
    steps = 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            got[o.request_id].extend(o.new_token_ids)
        steps += 1
        if steps == 6:  # r1 and r4 are decoding with a step in flight
            eng.abort_request("r1")
            eng.abort_request("r4")
    for i, (tokens, _) in enumerate(ref):
        if i in (1, 4):
            assert got[f"r{i}"] == tokens[: len(got[f"r{i}"])] and len(got[f"r{i}"]) < 30
        else:
            assert got[f"r{i}"] == tokens


@pytest.mark.parametrize("policy", ["off", "random"])
def test_overlap_with_eagle3_draft_following_on_device(make_llm, tiny_llama_dir,
                                                       tmp_path_factory, policy):
    head = make_eagle3_checkpoint(tmp_path_factory.mktemp("head"), aux_layer_ids=[0, 1, 1])
    params = [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)] * len(PROMPTS)
    plain = _run(make_llm, tiny_llama_dir, False, params)
    spec = dict(speculative_algorithm="eagle3", draft_model=str(head), num_draft_tokens=3,
                spec_policy=policy, max_num_batched_tokens=16)
    sync = make_llm(tiny_llama_dir, overlap_schedule=False, **spec)
    over = make_llm(tiny_llama_dir, overlap_schedule=True, **spec)
    outs = [[(o.token_ids, o.finish_reason) for o in llm.generate(PROMPTS, params)]
            for llm in (sync, over)]
    assert outs[0] == plain and outs[1] == plain
    # the draft followed the overlapped steps' tokens on the device: same proposals, same
    # acceptance (the random policy sees the same plans in both engines)
    stats = [llm.spec_stats() for llm in (sync, over)]
    assert [s["proposed"] for s in stats] == [stats[0]["proposed"]] * 2
    assert [s["accepted"] for s in stats] == [stats[0]["accepted"]] * 2
    assert policy == "off" or stats[0]["proposed"] > 0
