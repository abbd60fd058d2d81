"""Log-probabilities against HF transformers on the same checkpoint (fp32): the prompt's
(every position but the first, chunked prefill and preemption included) and each
generated token's, with their top-N alternatives, within 1e-4, without speculation and
with it (n-gram, EAGLE-3 chain and tree, the target drafting for itself: accepted drafts'
logprobs come from the verify pass); greedy and sampled; raw logits even under penalties;
prompt-only requests (max_tokens 0) return the prompt's logprobs alone.

Data flow (tests only): LLM.generate(logprobs / prompt_logprobs) -> RequestOutput <->
log_softmax(HF logits of prompt + output).
"""

from __future__ import annotations

import pytest
import torch
from checkpoints import load_hf_model, random_prompts
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams

TOL = 1e-4
N_TOP = 5
PROMPTS = random_prompts([3, 12, 41], seed=31) + [[60, 61, 62, 60, 61, 62, 60, 61, 62]]


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    model = load_hf_model(tiny_llama_dir)

    @torch.no_grad()
    def logprobs(ids: list[int]) -> torch.Tensor:  # [len, V]: row t scores token t + 1
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)

    return logprobs


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    return make_eagle3_checkpoint(tmp_path_factory.mktemp("eagle3"), aux_layer_ids=[0, 1, 1])


def _check_entry(entry, token: int, row: torch.Tensor, n: int) -> None:
    assert entry.token_id == token
    assert abs(entry.logprob - row[token].item()) <= TOL, (entry.logprob, row[token].item())
    top = row.topk(n)
    assert [t for t, _ in entry.top] == top.indices.tolist()
    assert all(abs(v - w) <= TOL for (_, v), w in zip(entry.top, top.values.tolist()))


def check_output(out, hf, n_top: int | None, n_prompt: int | None) -> None:
    ids = out.prompt_token_ids + out.token_ids
    ref = hf(ids)
    p = len(out.prompt_token_ids)
    if n_top is not None:
        assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
        for j, entry in enumerate(out.logprobs):
            _check_entry(entry, out.token_ids[j], ref[p - 1 + j], n_top)
    else:
        assert out.logprobs is None
    if n_prompt is not None:
        assert len(out.prompt_logprobs) == p and out.prompt_logprobs[0] is None
        for t in range(1, p):
            _check_entry(out.prompt_logprobs[t], ids[t], ref[t - 1], n_prompt)
    else:
        assert out.prompt_logprobs is None


def _params(i: int, **kw) -> SamplingParams:
    """Greedy and sampled requests, different N, some without logprobs, in one batch."""
    base = dict(max_tokens=16, ignore_eos=True, temperature=0.0 if i % 2 == 0 else 1.0, seed=i,
                logprobs=(N_TOP, 0, None, 3)[i % 4], prompt_logprobs=(2, None, N_TOP, 0)[i % 4])
    return SamplingParams(**{**base, **kw})


@pytest.mark.parametrize("engine", [{}, dict(max_num_batched_tokens=16),
                                    dict(kv_cache_tokens=120, max_num_seqs=4),
                                    dict(overlap_schedule=False)])
def test_plain_logprobs_match_hf(make_llm, tiny_llama_dir, hf, engine):
    llm = make_llm(tiny_llama_dir, **engine)
    prompts = PROMPTS * 2
    params = [_params(i) for i in range(len(prompts))]
    for out, p in zip(llm.generate(prompts, params), params):
        check_output(out, hf, p.logprobs, p.prompt_logprobs)
    if "kv_cache_tokens" in engine:
        assert llm.stats()["preemptions"] > 0  # recomputed prompts are not scored twice


SPEC = {
    "ngram": dict(speculative_algorithm="ngram", num_draft_tokens=3),
    "eagle3-chain": dict(speculative_algorithm="eagle3", num_draft_tokens=3),
    "eagle3-tree": dict(speculative_algorithm="eagle3", num_draft_tokens=3, tree_width=3,
                        tree_budget=8),
    "self-draft-chain": dict(speculative_algorithm="draft", num_draft_tokens=4),
    "self-draft-tree": dict(speculative_algorithm="draft", num_draft_tokens=3, tree_width=2,
                            tree_budget=6),
}


@pytest.mark.parametrize("variant", list(SPEC))
def test_speculative_logprobs_match_hf(make_llm, tiny_llama_dir, head_dir, hf, variant):
    opts = dict(SPEC[variant])
    if opts["speculative_algorithm"] != "ngram":
        opts["draft_model"] = str(head_dir if variant.startswith("eagle3") else tiny_llama_dir)
    llm = make_llm(tiny_llama_dir, spec_policy="always", max_num_batched_tokens=16, **opts)
    prompts = PROMPTS * 2
    params = [_params(i) for i in range(len(prompts))]
    for out, p in zip(llm.generate(prompts, params), params):
        check_output(out, hf, p.logprobs, p.prompt_logprobs)
    stats = llm.spec_stats()
    assert stats["proposed"] > 0
    if variant.startswith("self-draft"):  # accepted drafts: their logprobs from the verify pass
        assert stats["accepted"] > 20


def test_logprobs_are_of_the_raw_logits_under_penalties(make_llm, tiny_llama_dir, hf):
    llm = make_llm(tiny_llama_dir, speculative_algorithm="draft", draft_model=str(tiny_llama_dir),
                   num_draft_tokens=3, spec_policy="always")
    params = [_params(i, repetition_penalty=1.7, presence_penalty=1.0, logit_bias={9: 3.0},
                      temperature=0.5 * (i % 2), logprobs=N_TOP) for i in range(4)]
    for out, p in zip(llm.generate(PROMPTS, params), params):
        check_output(out, hf, N_TOP, p.prompt_logprobs)


@pytest.mark.parametrize("engine", [{}, dict(max_num_batched_tokens=16)])
def test_prompt_only_requests(make_llm, tiny_llama_dir, hf, engine):
    """max_tokens 0: the prompt is computed and scored, nothing is generated."""
    llm = make_llm(tiny_llama_dir, speculative_algorithm="ngram", num_draft_tokens=3, **engine)
    params = [SamplingParams(max_tokens=0, prompt_logprobs=N_TOP, logprobs=2),
              SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)] * 2
    outs = llm.generate(PROMPTS, params)
    for out, p in zip(outs, params):
        if p.max_tokens == 0:
            assert out.token_ids == [] and out.finish_reason == "length" and out.text == ""
            check_output(out, hf, 2, N_TOP)  # logprobs of no token: []
        else:
            assert len(out.token_ids) == 6


def test_chunks_scoring_the_prompt_do_not_ride_in_verify_steps(make_llm, tiny_llama_dir):
    """An eager chain engine lets prefill chunks ride in VERIFY passes; a chunk whose prompt
    tokens are scored runs as a plain EXTEND step instead (its every token's logits)."""
    llm = make_llm(tiny_llama_dir, speculative_algorithm="draft", draft_model=str(tiny_llama_dir),
                   num_draft_tokens=3, spec_policy="always", max_num_batched_tokens=8)
    assert llm.engine.scheduler.speculation.mixed
    plans, schedule = [], llm.engine.scheduler.schedule

    def spy():
        plan = schedule()
        plans.append((plan.mode.value, [r.params.prompt_logprobs for r, n, d in
                                        zip(plan.reqs, plan.extend_lens, plan.decoding) if not d]))
        return plan

    llm.engine.scheduler.schedule = spy
    params = [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=1)]
    llm.generate([PROMPTS[0], PROMPTS[2]], params)
    riders = [p for mode, chunks in plans if mode == "verify" for p in chunks]
    assert 1 not in riders
    assert any(mode == "verify" for mode, _ in plans)


@pytest.mark.parametrize("variant", ["eagle3-chain", "eagle3-tree", "self-draft-chain"])
def test_graphed_speculative_paths(make_llm, tiny_llama_dir, head_dir, hf, variant):
    """The CUDA-graph paths (padded batches, graphed greedy verification; run eagerly on a
    CPU stand-in) report the same logprobs."""
    from eager_graphs import install

    opts = dict(SPEC[variant])
    opts["draft_model"] = str(head_dir if variant.startswith("eagle3") else tiny_llama_dir)
    llm = make_llm(tiny_llama_dir, spec_policy="always", **opts)
    graphs = install(llm)
    for temperature in (0.0, 1.0):  # graphed greedy verification, then the sampled path
        params = [_params(i, prompt_logprobs=None, temperature=temperature)
                  for i in range(len(PROMPTS))]
        for out, p in zip(llm.generate(PROMPTS, params), params):
            check_output(out, hf, p.logprobs, None)
    assert {"target", "verify-greedy"} <= {k[0] for k in graphs.keys}
    assert llm.spec_stats()["proposed"] > 0
