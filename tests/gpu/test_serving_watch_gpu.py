"""GPU tier (skipped without CUDA): after the start-up warm-up, serving captures no CUDA
graph and compiles no Triton kernel (runner/serving_watch.py counts both), through the
shapes a burst of arrivals brings: chunked prefills beside decoders, the draft's catch-up
over whole prompts, every batch size up to max_num_seqs, with speculation (greedy and
sampled) and without."""

from __future__ import annotations

import random

import pytest
import torch
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize(("speculative", "policy", "temperature"),
                         [(True, "always", 0.0), (True, "random", 0.0), (True, "always", 0.8),
                          (False, "always", 0.0)])
def test_a_burst_captures_and_compiles_nothing_after_the_warm_up(tiny_llama_dir, tmp_path,
                                                                speculative, policy, temperature):
    head = make_eagle3_checkpoint(tmp_path / "h", aux_layer_ids=[0, 1, 1])
    llm = LLM(str(tiny_llama_dir), device="cuda", dtype="bfloat16", max_num_seqs=16,
              kv_cache_tokens=16384, max_num_batched_tokens=256,
              speculative_algorithm="eagle3", draft_model=str(head), num_draft_tokens=3,
              spec_policy=policy)  # random: a K per request, so steps mix K
    eng = llm.engine
    rng = random.Random(0)
    params = SamplingParams(max_tokens=24, temperature=temperature, ignore_eos=True,
                            speculative=speculative)
    for burst in range(2):  # all at once, then again with the prefix cache warm
        for i in range(16):
            eng.add_request(f"b{burst}r{i}", [rng.randrange(3, 200) for _ in range(100)],
                            params)
        while eng.has_unfinished_requests():
            eng.step()
    late = eng.stats()["late"]
    assert {k: late[k] for k in ("graph_captures", "triton_compiles", "gemm_choices")} == \
        {"graph_captures": 0, "triton_compiles": 0, "gemm_choices": 0}, late
