"""The random-K soak on the GPU (skipped without CUDA): the default model with its EAGLE-3 head,
fp32, Triton attention and CUDA graphs, `spec_policy="random"` over >= 2000 engine steps
(K changes every step, 0 included; on the tree engine chains and trees change too), a KV
pool small enough to preempt, and opted-out requests. Greedy output equals plain greedy
output token for token, opted-out requests never speculate, and the idle invariant holds."""

from __future__ import annotations

import pytest
import torch
from checkpoints import random_prompts

from gearshift import LLM, SamplingParams
from gearshift.models.default import default_target_dir

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("shape", ["chains", "tree"])
def test_random_policy_soak_default_model_fp32(shape):
    prompts = random_prompts([4 + (7 * i) % 37 for i in range(60)], seed=5, vocab=8000)
    params = [SamplingParams(max_tokens=80 + (i % 5) * 20, temperature=0.0, ignore_eos=True,
                             speculative=i % 4 != 0) for i in range(len(prompts))]
    opts = dict(device="cuda", dtype="float32", attention_backend="triton", cuda_graphs=True,
                max_num_seqs=2, max_num_batched_tokens=32, kv_cache_tokens=300)
    model = str(default_target_dir())
    ref = LLM(model, **opts).generate(prompts, params)
    spec = dict(speculative_algorithm="eagle3", num_draft_tokens=4, spec_policy="random")
    if shape == "tree":
        spec.update(tree_width=4, tree_budget=16)
    llm = LLM(model, **opts, **spec)  # the embedded EAGLE-3 head
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert llm.engine.stats()["steps"] >= 2000
    assert llm.engine.stats()["preemptions"] > 0
    assert all(o.spec.proposed == 0 for o, p in zip(outs, params) if not p.speculative)
    stats = llm.spec_stats()
    assert sorted(stats["steps_by_k"]) == [0, 1, 2, 3, 4]
    if shape == "tree":
        assert stats["tree_steps"] > 0 and stats["chain_steps"] > 0
    mem = llm.memory_stats()
    assert mem["kv_slots_free"] + mem["kv_slots_cached"] == mem["kv_slots_total"]
