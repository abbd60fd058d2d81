"""The server with speculation on (EAGLE-3 head, goodput policy): greedy completions and
streams equal the plain engine's text, `speculative: false` opts a request out, and the
speculation counters reach /metrics."""

from __future__ import annotations

import httpx
import openai
import pytest
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift.engine.engine import Engine
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.llm import LLM, build_engine_config
from gearshift.request import SamplingParams
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer

OPTS = dict(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=16,
            kv_cache_tokens=4096)
PROMPTS = ["hello world once", "the quick brown fox", "a small model"]


@pytest.fixture(scope="module")
def spec_server(tiny_llama_dir, tmp_path_factory):
    head = make_eagle3_checkpoint(tmp_path_factory.mktemp("h"), aux_layer_ids=[0, 1, 1])
    engine = Engine(build_engine_config(str(tiny_llama_dir), speculative_algorithm="eagle3",
                                        draft_model=str(head), num_draft_tokens=3,
                                        spec_policy="always", **OPTS))
    with BackgroundServer(build_app(AsyncEngine(engine))) as srv:
        yield srv, engine


def test_speculative_server_matches_plain_text_and_reports_counters(spec_server,
                                                                     tiny_llama_dir):
    srv, engine = spec_server
    plain = LLM(str(tiny_llama_dir), **OPTS).generate(
        PROMPTS, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)
    for prompt, ref in zip(PROMPTS, plain):
        out = client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=24,
                                        temperature=0, extra_body={"ignore_eos": True})
        assert out.choices[0].text == ref.text
        stream = client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=24,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        assert "".join(c.choices[0].text for c in stream if c.choices) == ref.text
    before = engine.spec_stats()["proposed"]
    out = client.completions.create(model=engine.model_name, prompt=PROMPTS[0], max_tokens=8,
                                    temperature=0, extra_body={"speculative": False,
                                                               "ignore_eos": True})
    assert out.choices[0].text == plain[0].text[: len(out.choices[0].text)]
    assert engine.spec_stats()["proposed"] == before  # alone in the batch: nothing drafted
    metrics = httpx.get(srv.base_url + "/metrics").text
    assert 'name="spec.proposed"' in metrics and 'name="spec.accepted"' in metrics
    mem = engine.memory_stats()
    assert mem["kv_slots_free"] + mem["kv_slots_cached"] == mem["kv_slots_total"]
