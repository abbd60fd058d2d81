"""The server on a tiny real checkpoint, driven by the official `openai` client over a live
uvicorn on 127.0.0.1: completions, chat, streaming == non-streamed greedy text, stop strings,
n > 1, usage, 64 concurrent streams == offline LLM.generate, and disconnects free KV slots.

Every test runs twice: the engine on a thread of the server, and in a process of its own.

Data flow (tests only): openai client -> uvicorn -> app -> AsyncEngine -> Engine (tiny
Llama; on a thread, or in an EngineProcess) ; the same prompts -> LLM.generate -> the texts to compare with.
"""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import openai
import pytest

from gearshift.engine.engine import Engine
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.frontend.engine_process import EngineProcess
from gearshift.llm import LLM, build_engine_config
from gearshift.request import SamplingParams
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer

ENGINE_OPTIONS = dict(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=64,
                      kv_cache_tokens=8192, max_num_batched_tokens=1024)
WORDS = "the quick brown fox jumps over lazy dog hello world once upon a time small model".split()


@pytest.fixture(scope="module", params=["thread", "process"])
def live(request, tiny_llama_dir):
    """The engine on a thread of the server, and in a process of its own (`serve`'s way)."""
    config = build_engine_config(str(tiny_llama_dir), **ENGINE_OPTIONS)
    engine = Engine(config) if request.param == "thread" else EngineProcess(config)
    async_engine = AsyncEngine(engine)
    with BackgroundServer(build_app(async_engine)) as srv:
        yield srv, async_engine


@pytest.fixture(scope="module")
def offline(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), **ENGINE_OPTIONS)


@pytest.fixture(scope="module")
def client(live):
    srv, _ = live
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def model_name(live):
    return live[1].model_name


def _prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def _greedy(offline, prompts, max_tokens: int, **kw) -> list[str]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)
    return [o.text for o in offline.generate(prompts, params)]


def _kv(srv) -> tuple[float, float]:
    """(free + cached, total) KV slots: equal when idle."""
    values = {}
    for line in httpx.get(srv.base_url + "/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("gearshift_kv_slots_free", "gearshift_kv_slots_cached",
                    "gearshift_kv_slots_total"):
            values[name] = float(value)
    return (values["gearshift_kv_slots_free"] + values["gearshift_kv_slots_cached"],
            values["gearshift_kv_slots_total"])


def test_completion_stream_and_usage(client, offline, model_name):
    prompt = "Once upon a time"
    want = _greedy(offline, [prompt], 24)[0]
    full = client.completions.create(model=model_name, prompt=prompt, max_tokens=24,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert full.choices[0].text == want
    n_prompt = len(offline.tokenizer.encode(prompt))
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (n_prompt, 24)
    chunks = list(client.completions.create(
        model=model_name, prompt=prompt, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert chunks[-1].usage.completion_tokens == 24 and chunks[-1].usage.prompt_tokens == n_prompt


def test_chat_stream_equals_non_stream(client, offline, model_name):
    messages = [{"role": "user", "content": "hello there"}]
    full = client.chat.completions.create(model=model_name, messages=messages, max_tokens=20,
                                          temperature=0)
    stream = client.chat.completions.create(model=model_name, messages=messages, max_tokens=20,
                                            temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == \
        full.choices[0].message.content
    text = offline.tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
    ids = offline.tokenizer.encode(text, add_special_tokens=False)
    want = offline.generate([ids], SamplingParams(max_tokens=20, temperature=0))[0]
    assert full.choices[0].message.content == want.text
    assert full.usage.prompt_tokens == len(ids)
    assert full.usage.completion_tokens == len(want.token_ids)


def test_stop_strings(client, offline, model_name):
    prompt = "the quick brown fox"
    base = _greedy(offline, [prompt], 40, ignore_eos=True)[0]
    stop = next(base[i:i + 2] for i in range(6, len(base) - 2) if base[i:i + 2].strip())
    cut = base[: base.index(stop)]
    out = client.completions.create(model=model_name, prompt=prompt, max_tokens=40,
                                    temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert out.choices[0].text == cut and out.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=model_name, prompt=prompt, max_tokens=40,
                                         temperature=0, stop=stop, stream=True,
                                         extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == cut


def test_n_choices(client, offline, model_name):
    greedy = client.completions.create(model=model_name, prompt="hello world", max_tokens=12,
                                       temperature=0, n=3)
    assert len({c.text for c in greedy.choices}) == 1
    assert greedy.choices[0].text == _greedy(offline, ["hello world"], 12)[0]
    kwargs = dict(model=model_name, prompt="hello world", max_tokens=12, temperature=1.0, n=4,
                  seed=7, extra_body={"ignore_eos": True})
    sampled = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    assert [c.text for c in sampled.choices] == [c.text for c in again.choices]  # seeded
    assert len({c.text for c in sampled.choices}) > 1  # choice i samples with seed + i
    assert sampled.usage.completion_tokens == 4 * 12
    assert sampled.usage.prompt_tokens == len(offline.tokenizer.encode("hello world"))


def test_64_concurrent_streams_equal_offline(live, offline, model_name):
    srv, async_engine = live
    prompts = _prompts(64, seed=3)
    want = _greedy(offline, prompts, 16)

    async def one(client: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await client.completions.create(model=model_name, prompt=prompt, max_tokens=16,
                                                 temperature=0, stream=True)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key="none",
                                    max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(one(client, p) for p in prompts))
        finally:
            await client.close()

    got = asyncio.run(main())
    assert got == want
    assert async_engine.snapshot.stats["running"] == 0


def test_parallel_disconnects_free_kv_slots(live, model_name):
    srv, _ = live
    generated_before = _tokens_generated(srv)

    async def leave_early(c: httpx.AsyncClient, i: int) -> None:
        body = {"model": model_name, "prompt": f"client {i} says", "max_tokens": 400,
                "stream": True, "ignore_eos": True}
        async with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen >= 1 + i % 3:
                    break

    async def main() -> None:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as c:
            await asyncio.gather(*(leave_early(c, i) for i in range(24)))

    asyncio.run(main())
    deadline = time.monotonic() + 20
    while (kv := _kv(srv))[0] != kv[1]:
        assert time.monotonic() < deadline, f"KV slots not freed: {kv}"
        time.sleep(0.05)
    assert _tokens_generated(srv) - generated_before < 24 * 400 / 4  # aborted, not finished
    assert httpx.get(srv.base_url + "/health").status_code == 200


def _tokens_generated(srv) -> float:
    for line in httpx.get(srv.base_url + "/metrics").text.splitlines():
        if line.startswith('gearshift_engine_stat{name="tokens_generated"}'):
            return float(line.split()[-1])
    raise KeyError("tokens_generated")
