"""Logprobs, echo and penalties through the official `openai` client against a live server
on a tiny real checkpoint with speculation on: the values equal the offline LLM's (which
tests/e2e/test_logprobs.py holds to HF), echo-only scoring returns the prompt's logprobs,
penalised greedy text equals the offline text, a logit_bias id beyond the vocabulary is a
400.

Data flow (tests only): openai client -> uvicorn -> app -> AsyncEngine -> Engine (tiny
Llama, n-gram speculation) ; the same requests -> LLM.generate.
"""

from __future__ import annotations

import math

import openai
import pytest

from gearshift.engine.engine import Engine
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.llm import LLM, build_engine_config
from gearshift.request import SamplingParams
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer

OPTIONS = dict(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=16,
               kv_cache_tokens=4096, max_num_batched_tokens=256, speculative_algorithm="ngram",
               num_draft_tokens=3, spec_policy="always")
PROMPT = "the quick brown fox jumps over the lazy dog the quick brown"


@pytest.fixture(scope="module")
def live(tiny_llama_dir):
    engine = Engine(build_engine_config(str(tiny_llama_dir), **OPTIONS))
    with BackgroundServer(build_app(AsyncEngine(engine))) as srv:
        yield srv, engine.model_name


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live[0].base_url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def offline(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), **OPTIONS)


def _close(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None) or math.isclose(x, y, abs_tol=1e-5) for x, y in zip(a, b))


def test_completion_logprobs_and_echo_equal_offline(client, live, offline):
    ref = offline.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                    logprobs=3, prompt_logprobs=3))[0]
    out = client.completions.create(model=live[1], prompt=PROMPT, max_tokens=12, temperature=0,
                                    logprobs=3, echo=True, extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    p = len(ref.prompt_token_ids)
    assert out.choices[0].text == PROMPT + ref.text
    want = [None] + [e.logprob for e in ref.prompt_logprobs[1:]] + [e.logprob for e in ref.logprobs]
    assert _close(lp.token_logprobs, want)
    assert lp.top_logprobs[0] is None and all(len(t) <= 4 for t in lp.top_logprobs[1:])
    assert all(t[tok] == v for tok, v, t in zip(lp.tokens[1:], lp.token_logprobs[1:],
                                                lp.top_logprobs[1:]))  # the token + 3
    tok = offline.tokenizer
    assert lp.tokens[p:] == [tok.decode([t]) for t in ref.token_ids]
    best = ref.logprobs[0].top[0]
    assert math.isclose(lp.top_logprobs[p][tok.decode([best[0]])], best[1], abs_tol=1e-5)


def test_echo_only_scoring(client, live, offline):
    """max_tokens 0 + echo: the prompt's logprobs (an evaluation harness's request)."""
    ref = offline.generate([PROMPT], SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
    out = client.completions.create(model=live[1], prompt=[PROMPT, "hello world"], max_tokens=0,
                                    echo=True, logprobs=1)
    first = out.choices[0]
    assert first.text == PROMPT and first.finish_reason == "length"
    assert _close(first.logprobs.token_logprobs,
                  [None] + [e.logprob for e in ref.prompt_logprobs[1:]])
    assert out.usage.completion_tokens == 0
    assert out.choices[1].text == "hello world"


def test_chat_logprobs_streamed_equal_non_streamed(client, live):
    kw = dict(model=live[1], messages=[{"role": "user", "content": "hello there"}], max_tokens=10,
              temperature=0, logprobs=True, top_logprobs=4)
    full = client.chat.completions.create(**kw).choices[0].logprobs.content
    streamed = [e for c in client.chat.completions.create(stream=True, **kw)
                for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in full] and len(full) >= 1
    assert _close([e.logprob for e in streamed], [e.logprob for e in full])
    assert all(len(e.top_logprobs) == 4 and e.top_logprobs[0].logprob >= e.logprob for e in full)


def test_penalties_equal_offline(client, live, offline):
    kw = dict(presence_penalty=1.2, frequency_penalty=0.6, logit_bias={"100": 5.0})
    ext = dict(repetition_penalty=1.5, min_tokens=4, ignore_eos=True)
    params = SamplingParams(max_tokens=16, temperature=0, logit_bias={100: 5.0},
                            presence_penalty=1.2, frequency_penalty=0.6, **ext)
    want = offline.generate([PROMPT], params)[0].text
    out = client.completions.create(model=live[1], prompt=PROMPT, max_tokens=16, temperature=0,
                                    extra_body=ext, **kw)
    assert out.choices[0].text == want
    plain = offline.generate([PROMPT], SamplingParams(max_tokens=16, temperature=0,
                                                      ignore_eos=True))[0].text
    assert want != plain


def test_logit_bias_beyond_the_vocabulary_is_refused(client, live):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=live[1], prompt="x", max_tokens=2,
                                  logit_bias={"99999": 1.0})
    assert "99999" in str(e.value)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_stop_ids_ignore_eos_and_min_tokens(client, live, api):
    """EOS made certain by a bias: min_tokens holds it back, ignore_eos runs to the length;
    a stop id ends the text (both APIs)."""
    from checkpoints import EOS_ID

    def run(**extra):
        kw = dict(model=live[1], max_tokens=8, temperature=0)
        bias = extra.pop("logit_bias")
        if api == "chat":
            out = client.chat.completions.create(
                messages=[{"role": "user", "content": "hi"}], logit_bias=bias, extra_body=extra,
                **kw)
        else:
            out = client.completions.create(prompt="hi", logit_bias=bias, extra_body=extra, **kw)
        return out.usage.completion_tokens, out.choices[0].finish_reason

    assert run(logit_bias={str(EOS_ID): 100}) == (1, "stop")
    assert run(logit_bias={str(EOS_ID): 100}, min_tokens=3) == (4, "stop")
    assert run(logit_bias={str(EOS_ID): 100}, ignore_eos=True) == (8, "length")
    assert run(logit_bias={"77": 100}, stop_token_ids=[77], ignore_eos=True) == (1, "stop")
    assert run(logit_bias={"77": 100}, stop_token_ids=[77], min_tokens=5) == (6, "stop")
