"""Tensor parallelism on a CPU (gloo, 2 ranks, fp32): greedy outputs at TP=2 equal TP=1 for
tiny Llama, Qwen2 and Qwen3 checkpoints (one with fewer KV heads than ranks, one with tied
embeddings), EAGLE-3 chains and trees and a draft model's trees at TP=2 equal plain TP=1,
the random policy keeps every rank on rank 0's plan over many steps (rank 0 reporting each
request's seed), structured output holds, and the start-up checks name what is wrong.

Data flow (tests only): LLM(tensor_parallel_size=2) -> rank 0 here, rank 1 a worker process
-> outputs compared with a one-process engine's.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
import torch
from checkpoints import assert_idle_invariant, make_tiny_checkpoint, random_prompts
from conftest import CPU_ENGINE_DEFAULTS
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import LLM, SamplingParams, StructuredOutput
from gearshift.config import ConfigError

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
# two share a 24-token prefix: the second generate() starts them from the prefix cache
PROMPTS = random_prompts([3, 17, 40, 9], seed=7) + [
    p[:24] + q for p, q in zip(random_prompts([24, 24], seed=8), random_prompts([5, 11], seed=9))]


@contextmanager
def tp_llm(model_dir, **opts):
    llm = LLM(model=str(model_dir), tensor_parallel_size=2, **{**CPU_ENGINE_DEFAULTS, **opts})
    try:
        yield llm
        assert_idle_invariant(llm)
    finally:
        llm.engine.shutdown()


def twice(llm, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    """Token ids of two passes over the prompts (the second one hits the prefix cache)."""
    return [o.token_ids for _ in range(2) for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def llama_kv1_dir(tmp_path_factory):
    """One KV head for two ranks: each rank keeps a copy of it."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("llama_kv1"), "llama",
                                num_key_value_heads=1)


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    return make_eagle3_checkpoint(tmp_path_factory.mktemp("eagle3_tp"), aux_layer_ids=[0, 1, 1])


MODELS = {"llama": "tiny_llama_dir", "qwen2": "tiny_qwen2_dir", "qwen3": "tiny_qwen3_dir",
          "llama-1-kv-head": "llama_kv1_dir", "llama-tied-sharded": "tiny_llama_sharded_tied_dir"}


@pytest.mark.parametrize("model", list(MODELS))
def test_greedy_at_tp2_equals_tp1(request, make_llm, model):
    model_dir = request.getfixturevalue(MODELS[model])
    opts = dict(max_num_batched_tokens=16) if model == "llama" else {}  # chunked prefills
    one = make_llm(model_dir, **opts)
    ref, logits = twice(one), one.engine.prefill_logits(PROMPTS[2])
    with tp_llm(model_dir, **opts) as llm:
        assert twice(llm) == ref
        torch.testing.assert_close(llm.engine.prefill_logits(PROMPTS[2]), logits, rtol=1e-4,
                                   atol=1e-4)  # [tokens, vocab]: every rank's rows gathered
        mem = llm.memory_stats()
        assert mem["tensor_parallel_size"] == 2 and mem["kv_heads_per_rank"] == 1
        assert llm.stats()["prefix_cache"]["hit_tokens"] > 0


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("draft_tp"), "llama",
                                num_hidden_layers=1, seed=3)


SPEC = {"eagle3-chain": dict(num_draft_tokens=3),
        "eagle3-tree": dict(num_draft_tokens=3, tree_width=3, tree_budget=8),
        "draft-model-tree": dict(speculative_algorithm="draft", num_draft_tokens=3, tree_width=2,
                                 tree_budget=6)}


@pytest.mark.parametrize("variant", list(SPEC))
def test_speculation_at_tp2_equals_plain_tp1(make_llm, tiny_llama_dir, head_dir, draft_dir,
                                            variant):
    """Drafts run whole on every rank (the EAGLE-3 head through the target's split
    embedding); every rank verifies the same proposals."""
    ref = twice(make_llm(tiny_llama_dir))
    spec = {"speculative_algorithm": "eagle3", **SPEC[variant]}
    spec["draft_model"] = str(head_dir if spec["speculative_algorithm"] == "eagle3" else draft_dir)
    with tp_llm(tiny_llama_dir, spec_policy="always", **spec) as llm:
        assert twice(llm) == ref
        assert llm.spec_stats()["proposed"] > 0


def test_random_policy_keeps_every_rank_on_one_plan(make_llm, tiny_llama_dir, head_dir):
    """Many steps of K changing per request and step, queueing, preemption and sampled
    requests among greedy ones: every rank checks its plan against rank 0's each step."""
    opts = dict(max_num_seqs=4, kv_cache_tokens=128, max_num_batched_tokens=64)
    prompts = random_prompts([3, 17, 40, 9, 25, 6, 31, 12], seed=11)
    greedy = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=32, temperature=0.9, seed=5, ignore_eos=True)
    params = [greedy if i % 3 else sampled for i in range(len(prompts))]
    one = make_llm(tiny_llama_dir, **opts).generate(prompts, params, use_tqdm=False)
    ref = [o.token_ids for o in one]
    with tp_llm(tiny_llama_dir, **opts, speculative_algorithm="eagle3",
                draft_model=str(head_dir), spec_policy="random") as llm:
        outs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.stats()
    assert [o.token_ids for o, p in zip(outs, params) if p is greedy] == \
        [r for r, p in zip(ref, params) if p is greedy]
    # rank 0 reports each request's seed (given, or drawn as one engine draws it)
    assert [o.seed for o in outs] == [o.seed for o in one] and outs[0].seed == 5
    assert all(len(o.token_ids) == 32 for o in outs)
    assert len([k for k, n in stats["spec"]["steps_by_k"].items() if n]) >= 3
    assert stats["preemptions"] > 0


def test_start_up_checks_name_the_problem(tiny_llama_dir):
    with pytest.raises(ConfigError, match="must divide the model's 4 attention heads"):
        LLM(str(tiny_llama_dir), tensor_parallel_size=3, **CPU_ENGINE_DEFAULTS)
    if torch.cuda.device_count() < 2:  # before anything starts: one line, no worker
        with pytest.raises(ConfigError, match=r"tensor_parallel_size 2 needs GPUs cuda:0\.\.cuda:1"):
            LLM(str(tiny_llama_dir), tensor_parallel_size=2,
                **{**CPU_ENGINE_DEFAULTS, "device": "cuda", "attention_backend": "triton"})


def test_structured_output_at_tp2(make_llm, tiny_llama_dir, head_dir):
    """Grammar matchers do not travel: each rank compiles its own from the params, and
    their masks agree (greedy output equals TP=1's, speculating)."""
    so = StructuredOutput(json={"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 99},
        "role": {"enum": ["admin", "user"]}}, "required": ["id", "role"],
        "additionalProperties": False})
    params = SamplingParams(max_tokens=64, temperature=0.0, structured_output=so)
    ref = [o.token_ids for o in make_llm(tiny_llama_dir).generate(PROMPTS[:4], params,
                                                                  use_tqdm=False)]
    with tp_llm(tiny_llama_dir, speculative_algorithm="eagle3", draft_model=str(head_dir),
                spec_policy="always", num_draft_tokens=3) as llm:
        outs = llm.generate(PROMPTS[:4], params, use_tqdm=False)
    assert [o.token_ids for o in outs] == ref
    assert all(set(json.loads(o.text)) == {"id", "role"} for o in outs)
