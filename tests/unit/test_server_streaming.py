"""Server behaviour with a fake engine, driven by the official `openai` client: streamed text
reassembles to the non-streamed text, n > 1 with seeds, usage, stop strings, UTF-8 safety,
batches and token-id prompts.

Data flow (tests only): openai client -> uvicorn -> app -> AsyncEngine -> FakeEngine.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from fake_engine import EOS_ID, STORY, expected_text, fake_server

from gearshift.request import SamplingParams


@pytest.fixture(scope="module")
def server():
    with fake_server(step_delay=0.0005) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def _ids(server, text: str) -> list[int]:
    return server.engine.tokenizer.encode(text)


def _stream_completion(client, **kwargs) -> tuple[dict[int, str], dict[int, str], list]:
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    chunks = list(client.completions.create(stream=True, **kwargs))
    for chunk in chunks:
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason:
                reasons[ch.index] = ch.finish_reason
    return texts, reasons, chunks


def test_completion_stream_equals_non_stream(server, client):
    kwargs = dict(model="fake-model", prompt="Tell me", max_tokens=40, temperature=0)
    full = client.completions.create(**kwargs)
    texts, reasons, chunks = _stream_completion(client, **kwargs)
    want = expected_text(_ids(server, "Tell me"), SamplingParams(temperature=0), 40)
    assert full.choices[0].text == want
    assert texts == {0: want}
    assert reasons == {0: "length"} and full.choices[0].finish_reason == "length"
    assert len(chunks) > 10  # really streamed, token by token
    assert all("\ufffd" not in ch.choices[0].text for ch in chunks)  # no split UTF-8 chars


def test_chat_stream_equals_non_stream(server, client):
    messages = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hello"}]
    full = client.chat.completions.create(model="fake-model", messages=messages,
                                          max_completion_tokens=30, temperature=0)
    chunks = list(client.chat.completions.create(model="fake-model", messages=messages,
                                                 max_tokens=30, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    prompt = server.engine.tokenizer.apply_chat_template(messages, tokenize=False,
                                                         add_generation_prompt=True)
    ids = server.engine.tokenizer.encode(prompt, add_special_tokens=False)
    assert full.choices[0].message.content == streamed
    assert streamed == expected_text(ids, SamplingParams(temperature=0), 30)
    assert full.usage.prompt_tokens == len(ids) and full.usage.completion_tokens == 30
    assert chunks[-1].choices[0].finish_reason == "length"


def test_usage_and_include_usage(server, client):
    prompt = "count me"
    full = client.completions.create(model="fake-model", prompt=prompt, max_tokens=7)
    n_prompt = len(_ids(server, prompt))
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (n_prompt, 7)
    assert full.usage.total_tokens == n_prompt + 7
    _, _, chunks = _stream_completion(client, model="fake-model", prompt=prompt, max_tokens=7,
                                      n=2, stream_options={"include_usage": True})
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (n_prompt, 14)


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_continuous_usage_stats(server, client, route):
    """vLLM's stream_options.continuous_usage_stats (load generators such as guidellm send
    it): every chunk carries the usage so far, the last the total."""
    kwargs = dict(model="fake-model", max_tokens=9, stream=True, extra_body={"ignore_eos": True},
                  stream_options={"include_usage": True, "continuous_usage_stats": True})
    if route == "chat":
        chunks = list(client.chat.completions.create(
            messages=[{"role": "user", "content": "count"}], **kwargs))
    else:
        chunks = list(client.completions.create(prompt="count", **kwargs))
    usages = [c.usage for c in chunks]
    assert all(u is not None for u in usages)
    counts = [u.completion_tokens for u in usages]
    assert counts == sorted(counts) and counts[-1] == 9 and chunks[-1].choices == []
    assert len({u.prompt_tokens for u in usages}) == 1
    assert all(u.total_tokens == u.prompt_tokens + u.completion_tokens for u in usages)


def test_n_choices_use_seed_plus_index(server, client):
    prompt = "seeded"
    ids = _ids(server, prompt)
    out = client.completions.create(model="fake-model", prompt=prompt, max_tokens=12, n=3,
                                    temperature=0.8, seed=100)
    assert [c.index for c in out.choices] == [0, 1, 2]
    for i, choice in enumerate(out.choices):
        want = expected_text(ids, SamplingParams(temperature=0.8, seed=100 + i), 12)
        assert choice.text == want
    assert len({c.text for c in out.choices}) == 3
    texts, _, _ = _stream_completion(client, model="fake-model", prompt=prompt, max_tokens=12,
                                     n=3, temperature=0.8, seed=100)
    assert texts == {c.index: c.text for c in out.choices}
    chat = client.chat.completions.create(model="fake-model", n=2, max_tokens=5, temperature=0,
                                          messages=[{"role": "user", "content": "x"}])
    assert len(chat.choices) == 2 and chat.choices[0].message.content == chat.choices[1].message.content


def test_stop_strings(server, client):
    prompt = "stop here"
    base = client.completions.create(model="fake-model", prompt=prompt, max_tokens=60,
                                     temperature=0).choices[0].text
    stop = base[20:24]
    assert stop and stop in base
    out = client.completions.create(model="fake-model", prompt=prompt, max_tokens=60,
                                    temperature=0, stop=[stop, "never-there"])
    assert out.choices[0].text == base[: base.index(stop)]
    assert out.choices[0].finish_reason == "stop"
    texts, reasons, _ = _stream_completion(client, model="fake-model", prompt=prompt,
                                           max_tokens=60, temperature=0, stop=stop)
    assert texts == {0: base[: base.index(stop)]} and reasons == {0: "stop"}
    server.wait_idle()  # the stop-hit request was aborted in the engine, reason "stop"
    assert server.engine.aborted[-1][1] == "stop"


def test_token_id_prompt_and_batch(server, client):
    ids = _ids(server, "abc")
    by_ids = client.completions.create(model="fake-model", prompt=ids, max_tokens=9, temperature=0)
    by_text = client.completions.create(model="fake-model", prompt="abc", max_tokens=9,
                                        temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = client.completions.create(model="fake-model", prompt=["abc", "zzz top"], n=2,
                                      max_tokens=9, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    want_b = expected_text(_ids(server, "zzz top"), SamplingParams(temperature=0), 9)
    assert [c.text for c in batch.choices] == [by_text.choices[0].text] * 2 + [want_b] * 2
    assert batch.usage.prompt_tokens == len(ids) + len(_ids(server, "zzz top"))


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}


def test_multi_token_steps_and_eos():
    """Speculation-like steps (3 tokens at once) and EOS handling, incl. ignore_eos."""
    with fake_server(tokens_per_step=3, eos_after=10) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
        ids = srv.engine.tokenizer.encode("multi")
        greedy = SamplingParams(temperature=0)
        texts, reasons, chunks = _stream_completion(client, model="fake-model", prompt="multi",
                                                    max_tokens=30, temperature=0)
        assert texts == {0: expected_text(ids, greedy, 10)} and reasons == {0: "stop"}
        full = client.completions.create(model="fake-model", prompt="multi", max_tokens=30,
                                         temperature=0, extra_body={"ignore_eos": True})
        assert full.choices[0].text == expected_text(ids, greedy, 30)
        assert full.choices[0].finish_reason == "length"
        assert full.usage.completion_tokens == 30
        stopped = client.completions.create(model="fake-model", prompt="multi", max_tokens=30,
                                            temperature=0, extra_body={"stop_token_ids": [EOS_ID]})
        assert stopped.choices[0].finish_reason == "stop"
        srv.wait_idle()


def test_utf8_multibyte_characters_never_split(server, client):
    """STORY has 2- and 3-byte characters; the fake emits one byte per token."""
    assert any(len(ch.encode()) > 1 for ch in STORY)
    texts, _, chunks = _stream_completion(client, model="fake-model", prompt="utf",
                                          max_tokens=len(STORY.encode()), temperature=0)
    assert sorted(texts[0]) == sorted(STORY)  # a rotation of the whole story
    assert all("\ufffd" not in ch.choices[0].text for ch in chunks)
