"""GPU tier (skipped without CUDA): coupled speculation on the GPU path (Triton attention,
CUDA graphs for decode, VERIFY and the draft) keeps seeded text: each request's sampled
tokens equal plain seeded decoding's, in fp32, for EAGLE-3 chains and trees and n-gram.

Data flow (tests only): LLM(cuda, spec_sampling="coupled") -> generate(seeded) -> tokens
compared with an engine without speculation.
"""

from __future__ import annotations

import pytest
import torch
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PROMPTS = [list(range(3, 3 + n)) for n in (5, 17, 33, 2, 60, 9)]


def _tokens(model_dir, **kw) -> tuple[list[list[int]], LLM]:
    llm = LLM(str(model_dir), device="cuda", dtype="float32", attention_backend="triton",
              max_num_seqs=8, kv_cache_tokens=4096, **kw)
    params = [SamplingParams(max_tokens=40, temperature=0.9, top_k=50, seed=100 + i,
                             ignore_eos=True) for i in range(len(PROMPTS))]
    return [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)], llm


@pytest.mark.parametrize("spec", [
    dict(speculative_algorithm="eagle3", num_draft_tokens=3, spec_policy="always"),
    dict(speculative_algorithm="eagle3", num_draft_tokens=3, tree_width=2, tree_budget=6,
         spec_policy="random"),
    dict(speculative_algorithm="ngram", num_draft_tokens=4, spec_policy="always"),
    dict(speculative_algorithm="suffix", num_draft_tokens=8, spec_policy="always"),
])
def test_coupled_speculation_keeps_seeded_text_on_gpu(tiny_llama_dir, tmp_path, spec):
    if spec["speculative_algorithm"] == "eagle3":
        spec = dict(spec, draft_model=str(make_eagle3_checkpoint(tmp_path / "h",
                                                                 aux_layer_ids=[0, 1, 1])))
    ref, _ = _tokens(tiny_llama_dir)
    got, llm = _tokens(tiny_llama_dir, spec_sampling="coupled", **spec)
    assert got == ref
    assert llm.engine.spec_stats()["proposed"] > 0
