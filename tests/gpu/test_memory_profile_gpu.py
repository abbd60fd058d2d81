"""GPU tier (skipped without CUDA): the start-up memory profile sizes the KV cache so that,
after start-up (graphs captured, speculation warm-up run), the largest steps the engine
can plan run without an allocation failure and the device holds no more than
gpu_memory_utilization of its memory (plus a little allocator slack).

Data flow (tests only): LLM(cuda, no kv_cache_tokens, trees at max_num_seqs) ->
runner.memory_plan -> generate at max_num_seqs, greedy and sampled -> device counters.
"""

from __future__ import annotations

import pytest
import torch

from gearshift import LLM, SamplingParams
from gearshift.engine.memory_profile import after_start
from gearshift.runner.memory_plan import prompt_len

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
UTILIZATION = 0.5  # leaves the card's other half to whatever else runs beside the test
SLACK = 0.05  # of the card: the caching allocator's rounding and fragmentation


def test_largest_planned_steps_run_after_start_up():
    llm = LLM(device="cuda", speculative_algorithm="eagle3", num_draft_tokens=4, tree_width=4,
              tree_budget=16, max_num_seqs=256, spec_policy="always",
              gpu_memory_utilization=UTILIZATION)
    eng = llm.engine
    plan = eng.runner.memory_plan
    assert plan is not None and eng.slots.total == plan.slots == eng.runner.num_slots
    assert eng.runner.kv.k.shape[1] == eng.spec.proposer.kv.k.shape[1] == plan.slots + 1
    b = plan.budget
    assert b.activations > 0 and b.graph_pools > 0 and b.weights > 0 and b.draft > 0
    assert plan.slots >= b.min_slots and plan.headroom > 0
    started = after_start(eng)
    assert started["used"] <= b.total * (UTILIZATION + SLACK)
    torch.cuda.reset_peak_memory_stats()
    n = prompt_len(eng.config, eng.runner.max_positions)  # 256 prompts fill one prefill budget
    prompts = [[(7 * i + j) % 1000 + 1 for j in range(n)] for i in range(256)]
    for params in (SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
                   SamplingParams(max_tokens=24, temperature=1.0, seed=1, ignore_eos=True),
                   SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=1,
                                  ignore_eos=True)):
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert all(len(o.token_ids) == 24 for o in outs)
    stats = eng.spec_stats()
    assert stats["tree_steps"] > 0  # trees verified at up to 256 requests a step
    free, total = torch.cuda.mem_get_info()
    outside = total - free - torch.cuda.memory_reserved()
    assert torch.cuda.max_memory_reserved() + outside <= total * (UTILIZATION + SLACK)
