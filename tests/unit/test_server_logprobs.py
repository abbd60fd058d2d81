"""The server's logprobs, echo and penalty fields with a fake engine, through the official
`openai` client: the wire formats (completions' parallel lists, chat's content entries),
streamed chunks carrying exactly the tokens' entries, echo with and without logprobs and
echo-only scoring (max_tokens 0), and every sampling field reaching SamplingParams.

Data flow (tests only): openai client -> uvicorn -> app -> AsyncEngine -> FakeEngine
(fake_logprob entries) -> server/logprobs.py -> JSON.
"""

from __future__ import annotations

import openai
import pytest
from fake_engine import expected_tokens, fake_logprob, fake_server

from gearshift.request import SamplingParams


@pytest.fixture(scope="module")
def server():
    with fake_server(step_delay=0.0005) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def _text(server, token_id: int) -> str:
    return server.engine.tokenizer.decode([token_id])


def _expected(server, prompt: str, n: int, top: int):
    ids = server.engine.tokenizer.encode(prompt)
    toks = expected_tokens(ids, SamplingParams(temperature=0), n)
    return ids, toks, [fake_logprob(t, i, top) for i, t in enumerate(toks)]


def test_completion_logprobs(server, client):
    ids, toks, entries = _expected(server, "Hi there", 12, 3)
    out = client.completions.create(model="fake-model", prompt="Hi there", max_tokens=12,
                                    temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert lp.tokens == [_text(server, t) for t in toks]
    assert lp.token_logprobs == [e.logprob for e in entries]
    assert lp.top_logprobs == [{_text(server, t): v for t, v in e.top} for e in entries]
    assert all(len(top) == 3 for top in lp.top_logprobs)  # the token is among the 3 here
    assert lp.text_offset == [sum(len(x) for x in lp.tokens[:i]) for i in range(len(toks))]
    plain = client.completions.create(model="fake-model", prompt="Hi there", max_tokens=12,
                                      temperature=0)
    assert plain.choices[0].logprobs is None


def test_completion_stream_carries_each_tokens_logprobs(server, client):
    kwargs = dict(model="fake-model", prompt="Once", max_tokens=30, temperature=0, logprobs=2)
    full = client.completions.create(**kwargs).choices[0]
    tokens, values, text = [], [], ""
    for chunk in client.completions.create(stream=True, **kwargs):
        for ch in chunk.choices:
            text += ch.text
            if ch.logprobs is not None:
                tokens += ch.logprobs.tokens
                values += ch.logprobs.token_logprobs
    assert text == full.text
    assert tokens == full.logprobs.tokens and values == full.logprobs.token_logprobs


def _echoed(resp, stream: bool, field: str) -> tuple[str, list, list]:
    """A completion's text, its logprobs' tokens and one more logprobs field, streamed or
    not."""
    chunks = list(resp) if stream else [resp]
    text = "".join(ch.text for c in chunks for ch in c.choices)
    tokens, values = [], []
    for c in chunks:
        for ch in c.choices:
            if ch.logprobs is not None:
                tokens += ch.logprobs.tokens
                values += getattr(ch.logprobs, field)
    return text, tokens, values


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_and_echo_only(server, client, stream):
    prompt = "Score me"
    ids = server.engine.tokenizer.encode(prompt)
    for max_tokens in (0, 5):
        resp = client.completions.create(model="fake-model", prompt=prompt, max_tokens=max_tokens,
                                         temperature=0, echo=True, logprobs=1, stream=stream)
        text, tokens, values = _echoed(resp, stream, "token_logprobs")
        gen = expected_tokens(ids, SamplingParams(temperature=0), max_tokens)
        assert text.startswith(prompt) and len(tokens) == len(ids) + max_tokens
        assert tokens == [_text(server, t) for t in ids + gen]
        assert values[0] is None
        assert values[1:len(ids)] == [fake_logprob(t, -i, 1).logprob
                                      for i, t in enumerate(ids[1:], 1)]
        if max_tokens == 0:
            assert text == prompt


def _slices(text: str, offsets: list[int]) -> list[str]:
    return [text[a:b] for a, b in zip(offsets, offsets[1:] + [len(text)])]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("prompt", ["def add(a, b):", "h\u00e9llo \u2713 ok"])
def test_echo_offsets_slice_the_returned_text(server, client, stream, prompt):
    """text_offset indexes the returned text: the BOS the tokenizer adds takes no room, each
    token's slice is its text, the pieces of a multi-byte character join it; the same whether
    the prompt comes as text or as ids (echoed as their decoding, BOS included)."""
    tok = server.engine.tokenizer
    ids = tok.encode(prompt)
    assert ids[0] == tok.bos_token_id
    for sent in (prompt, ids):
        resp = client.completions.create(model="fake-model", prompt=sent, max_tokens=40,
                                         temperature=0, echo=True, logprobs=2, stream=stream)
        text, tokens, offsets = _echoed(resp, stream, "text_offset")
        echoed = prompt if isinstance(sent, str) else tok.decode(ids)
        assert text.startswith(echoed) and len(text) > len(echoed)
        assert offsets == sorted(offsets) and offsets[-1] < len(text)
        pieces = _slices(text, offsets)
        assert "".join(pieces) == text
        if isinstance(sent, str):
            assert offsets[:2] == [0, 0] and pieces[0] == ""  # BOS: not in the text
        for i, (token, piece) in enumerate(zip(tokens, pieces, strict=True)):
            if "\ufffd" in token:  # a piece of a character: the last piece holds it
                assert piece == "" or "\ufffd" not in tokens[i + 1]
            elif i > 0 or not isinstance(sent, str):
                assert piece == token, (pieces, tokens)


@pytest.mark.parametrize("stream", [False, True])
def test_top_logprobs_hold_the_token_and_n_alternatives(server, client, stream):
    """As vLLM and OpenAI's completions ("up to logprobs + 1 elements"): the position's
    token is always in its top_logprobs, with its own logprob, beside the N most likely,
    prompt positions (where it is not among them) as generated ones."""
    resp = client.completions.create(model="fake-model", prompt="import os", max_tokens=6,
                                     temperature=0, echo=True, logprobs=1, stream=stream)
    chunks = list(resp) if stream else [resp]
    rows = [(tok, lp, top) for c in chunks for ch in c.choices if ch.logprobs is not None
            for tok, lp, top in zip(ch.logprobs.tokens, ch.logprobs.token_logprobs,
                                    ch.logprobs.top_logprobs, strict=True)]
    n_prompt = len(server.engine.tokenizer.encode("import os"))
    assert len(rows) == n_prompt + 6 and rows[0][2] is None
    for i, (tok, lp, top) in enumerate(rows[1:], 1):
        assert top[tok] == lp
        assert len(top) == (2 if i < n_prompt else 1)  # prompt: the token + the 1 likeliest
        assert max(top.values()) > lp if i < n_prompt else max(top.values()) == lp


def test_echo_without_logprobs(server, client):
    out = client.completions.create(model="fake-model", prompt="Echo", max_tokens=4,
                                    temperature=0, echo=True)
    assert out.choices[0].text.startswith("Echo") and len(out.choices[0].text) > 4
    assert out.choices[0].logprobs is None


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs(server, client, stream):
    messages = [{"role": "user", "content": "hello"}]
    resp = client.chat.completions.create(model="fake-model", messages=messages, max_tokens=10,
                                          temperature=0, logprobs=True, top_logprobs=2,
                                          stream=stream)
    if stream:
        content = [e for c in resp for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    else:
        content = resp.choices[0].logprobs.content
    assert len(content) == 10
    for e in content:
        assert e.bytes == list(e.token.encode()) and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].logprob == e.logprob and e.logprob < 0
    plain = client.chat.completions.create(model="fake-model", messages=messages, max_tokens=3,
                                           logprobs=True)
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)


def test_sampling_fields_reach_the_engine(server, client):
    client.completions.create(
        model="fake-model", prompt="x", max_tokens=6, presence_penalty=0.5, frequency_penalty=-0.5,
        logit_bias={"7": 150, "9": -3}, logprobs=4, echo=True,
        extra_body={"repetition_penalty": 1.2, "min_tokens": 2, "stop_token_ids": [5]})
    p = list(server.engine.params_seen.values())[-1]
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_tokens) == \
        (0.5, -0.5, 1.2, 2)
    assert p.logit_bias == {7: 100.0, 9: -3.0} and p.stop_token_ids == [5]
    assert (p.logprobs, p.prompt_logprobs) == (4, 4)
    client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}],
                                   max_tokens=2, logprobs=True, top_logprobs=7)
    p = list(server.engine.params_seen.values())[-1]
    assert (p.logprobs, p.prompt_logprobs) == (7, None)
