"""GPU tier (skipped without CUDA): `serve`'s engine process on the GPU (a spawned process
with its own CUDA context, CUDA graphs, speculation) answers what the offline engine
generates."""

from __future__ import annotations

import httpx
import pytest
import torch

from gearshift import LLM, SamplingParams
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.frontend.engine_process import EngineProcess
from gearshift.llm import build_engine_config
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

OPTIONS = dict(device="cuda", dtype="float32", max_num_seqs=8, kv_cache_tokens=4096,
               speculative_algorithm="ngram", num_draft_tokens=3, spec_policy="random")


def test_engine_process_on_cuda_serves_the_offline_tokens(tiny_llama_dir):
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 33, 9)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    want = [o.text for o in LLM(str(tiny_llama_dir), **OPTIONS).generate(prompts, params)]
    torch.cuda.empty_cache()
    async_engine = AsyncEngine(EngineProcess(build_engine_config(str(tiny_llama_dir),
                                                                 **OPTIONS)))
    with BackgroundServer(build_app(async_engine)) as srv:
        got = [httpx.post(srv.base_url + "/v1/completions", timeout=120, json={
            "model": async_engine.model_name, "prompt": p, "max_tokens": 24,
            "temperature": 0, "ignore_eos": True}).json()["choices"][0]["text"] for p in prompts]
        stats = async_engine.snapshot.stats
    assert got == want
    assert stats["graphs"]["decode_graphed"] + stats["graphs"]["verify_graphed"] > 0
