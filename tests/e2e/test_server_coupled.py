"""Coupled speculation through the server: concurrent seeded requests asking for
`spec_sampling: "coupled"` (the engine's default is rejection; every other request keeps
it) get the text plain decoding gives for their seeds, completions and chats, streamed or
not; an unseeded request reports the seed it drew, in the body's `seed` and the
x-gearshift-seed header, and sending that seed replays its text.

Data flow (tests only): openai client (threads) -> uvicorn -> app -> AsyncEngine -> Engine
(tiny Llama drafting for itself, so whole chains are accepted) ; the same requests ->
LLM.generate without speculation.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from gearshift.engine.engine import Engine
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.llm import LLM, build_engine_config
from gearshift.request import SamplingParams
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer
from gearshift.server.serving import SEED_HEADER

OPTS = dict(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=16,
            kv_cache_tokens=4096)
PROMPTS = ["hello world once", "the quick brown fox", "a small model", "one two three four",
           "seeded text stays", "under load too"]
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    engine = Engine(build_engine_config(
        str(tiny_llama_dir), speculative_algorithm="draft", draft_model=str(tiny_llama_dir),
        num_draft_tokens=3, spec_policy="always", spec_sampling="rejection", **OPTS))
    with BackgroundServer(build_app(AsyncEngine(engine))) as srv:
        yield srv, engine


@pytest.fixture(scope="module")
def plain(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), **OPTS)


def expected(plain: LLM, prompt: str, seed: int, temperature: float = 0.9) -> str:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, top_p=0.95,
                            seed=seed, ignore_eos=True)
    return plain.generate([prompt], params, use_tqdm=False)[0].text


def test_concurrent_coupled_requests_get_the_plain_seeded_text(server, plain):
    srv, engine = server
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)

    def ask(i: int) -> str:
        mode = "coupled" if i % 2 == 0 else "rejection"
        body = {"ignore_eos": True, "spec_sampling": mode}
        common = dict(model=engine.model_name, max_tokens=MAX_TOKENS, temperature=0.9,
                      top_p=0.95, seed=1000 + i, extra_body=body)
        prompt = PROMPTS[i % len(PROMPTS)]
        if i % 4 == 0:  # streamed completion
            stream = client.completions.create(prompt=prompt, stream=True, **common)
            return "".join(c.choices[0].text for c in stream if c.choices)
        return client.completions.create(prompt=prompt, **common).choices[0].text

    before = engine.spec_stats()["accepted"]
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(ask, range(16)))
    want = [expected(plain, PROMPTS[i % len(PROMPTS)], 1000 + i) for i in range(16)]
    assert texts[::2] == want[::2]
    assert texts[1::2] != want[1::2]  # rejection sampling keeps the law, not the text
    assert engine.spec_stats()["accepted"] > before


def test_unseeded_request_reports_a_seed_that_replays(server):
    srv, engine = server
    body = {"model": engine.model_name, "prompt": PROMPTS[1], "max_tokens": MAX_TOKENS,
            "temperature": 1.0, "ignore_eos": True, "spec_sampling": "coupled"}
    first = httpx.post(srv.base_url + "/v1/completions", json=body, timeout=60)
    assert first.status_code == 200
    seed = first.json()["seed"]
    assert isinstance(seed, int) and first.headers[SEED_HEADER] == str(seed)
    again = httpx.post(srv.base_url + "/v1/completions", json={**body, "seed": seed}, timeout=60)
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    assert again.json()["seed"] == seed
    other = httpx.post(srv.base_url + "/v1/completions", json=body, timeout=60)
    assert other.json()["seed"] != seed  # a fresh seed per request
    chat = {"model": engine.model_name, "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json=chat,
                      timeout=60) as r:
        assert r.status_code == 200 and int(r.headers[SEED_HEADER]) >= 0
        r.read()
