"""Every field of the OpenAI request schemas (read from the official `openai` package) is
either implemented (a request with a non-default value succeeds) or refused with a 400
naming it; neutral values of unimplemented fields pass; keys outside the OpenAI API and
Gearshift's extensions are refused as unknown (fake engine).

Data flow (tests only): openai params types -> field lists -> httpx / openai client ->
uvicorn -> app -> protocol (openai_fields.py) -> 200 or error JSON.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from fake_engine import fake_server
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params

from gearshift.server.openai_fields import UNSUPPORTED

MESSAGES = [{"role": "user", "content": "hi"}]


def _fields(module) -> set[str]:
    return (set(module.CompletionCreateParamsBase.__annotations__)
            | set(module.CompletionCreateParamsStreaming.__annotations__))


# field -> a non-default value Gearshift implements: the request succeeds
COMPLETION_WORKS = {
    "model": "fake-model", "prompt": "hello", "max_tokens": 5, "n": 2, "seed": 3,
    "stop": ["zz"], "temperature": 0.5, "top_p": 0.9, "stream": True,
    "stream_options": {"include_usage": True}, "user": "someone",
    "echo": True, "frequency_penalty": 0.5, "logit_bias": {"5": 10}, "logprobs": 2,
    "presence_penalty": 0.5,
}
# field -> a value Gearshift refuses (not implemented)
COMPLETION_REFUSED = {"best_of": 3, "suffix": " end"}
CHAT_WORKS = {
    "messages": [{"role": "system", "content": "be brief"}, *MESSAGES], "model": "fake-model",
    "max_tokens": 5, "max_completion_tokens": 4, "n": 2, "seed": 3, "stop": "zz",
    "temperature": 0.5, "top_p": 0.9, "stream": True, "stream_options": {"include_usage": True},
    "user": "someone", "safety_identifier": "someone",
    "parallel_tool_calls": False,  # no tools can be sent, so there is nothing to parallelise
    "frequency_penalty": 0.5, "logit_bias": {"5": 10}, "logprobs": True,
    "presence_penalty": 0.5, "top_logprobs": 3, "response_format": {"type": "json_object"},
}
CHAT_REFUSED = {
    "audio": {"voice": "alloy", "format": "wav"},
    "function_call": {"name": "f"}, "functions": [{"name": "f"}],
    "metadata": {"k": "v"}, "modalities": ["text", "audio"],
    "moderation": {"model": "omni-moderation-latest"},
    "prediction": {"type": "content", "content": "x"},
    "prompt_cache_key": "k", "prompt_cache_options": {"mode": "explicit"},
    "prompt_cache_retention": "24h", "reasoning_effort": "high",
    "service_tier": "flex", "store": True,
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "verbosity": "low", "web_search_options": {"search_context_size": "low"},
}
# checked against n once every field is read: the message names it, param is not set
PARAM_UNSET = {"best_of"}
# what clients send for "nothing asked": accepted
NEUTRAL_DECLARED = {
    "completions": {"echo": False, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                    "logit_bias": {}, "suffix": "", "best_of": 1},
    "chat": {"logprobs": False, "tools": [], "response_format": {"type": "text"},
             "presence_penalty": 0.0, "frequency_penalty": 0.0, "logit_bias": {}},
}


@pytest.fixture(scope="module")
def server():
    with fake_server() as srv:
        yield srv


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=10)


def test_every_openai_field_is_classified():
    assert set(COMPLETION_WORKS) | set(COMPLETION_REFUSED) == _fields(completion_params)
    assert set(CHAT_WORKS) | set(CHAT_REFUSED) == _fields(chat_params)
    assert not set(COMPLETION_WORKS) & set(COMPLETION_REFUSED)
    assert not set(CHAT_WORKS) & set(CHAT_REFUSED)


@pytest.mark.parametrize(("path", "field", "value", "base"), [
    *(("/v1/completions", f, v, {"prompt": "hello"}) for f, v in COMPLETION_WORKS.items()),
    *(("/v1/chat/completions", f, v, {"messages": MESSAGES}) for f, v in CHAT_WORKS.items()),
], ids=lambda x: x if isinstance(x, str) and not x.startswith("/") else None)
def test_implemented_field_works(server, path, field, value, base):
    body = {**base, "max_tokens": 3, field: value}
    if field == "stream_options":
        body["stream"] = True
    if field == "top_logprobs":  # alternatives of the logprobs asked for
        body["logprobs"] = True
    r = _post(server, path, body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("path", "field", "value", "base"), [
    *(("/v1/completions", f, v, {"prompt": "hello"}) for f, v in COMPLETION_REFUSED.items()),
    *(("/v1/chat/completions", f, v, {"messages": MESSAGES}) for f, v in CHAT_REFUSED.items()),
], ids=lambda x: x if isinstance(x, str) and not x.startswith("/") else None)
def test_unimplemented_field_is_refused_by_name(server, path, field, value, base):
    r = _post(server, path, {**base, "max_tokens": 3, field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert field in err["message"], err
    assert err["param"] == (None if field in PARAM_UNSET else field), err


@pytest.mark.parametrize(("path", "field", "value"), [
    *(("/v1/completions", f, v) for f, v in NEUTRAL_DECLARED["completions"].items()),
    *(("/v1/chat/completions", f, v) for f, v in NEUTRAL_DECLARED["chat"].items()),
    *(("/v1/chat/completions", f, v) for f, values in UNSUPPORTED["ChatCompletionRequest"].items()
      for v in values),
])
def test_neutral_values_of_unimplemented_fields_pass(server, path, field, value):
    base = {"prompt": "hello"} if path == "/v1/completions" else {"messages": MESSAGES}
    r = _post(server, path, {**base, "max_tokens": 3, field: value})
    assert r.status_code == 200, r.text


def test_null_is_the_default_for_unimplemented_fields_too(server):
    body = {"messages": MESSAGES, "max_tokens": 3, **dict.fromkeys(CHAT_REFUSED)}
    assert _post(server, "/v1/chat/completions", body).status_code == 200


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{**MESSAGES[0], "tool_calls": [{"id": "1"}]}]}, "messages.0.tool_calls"),
    ({"messages": [{"role": "assistant", "content": "x", "refusal": "no"}, *MESSAGES]},
     "messages.0.refusal"),
    ({"messages": [*MESSAGES, {"role": "tool", "content": "4", "tool_call_id": "c1"}]},
     "messages.1.tool_call_id"),
    ({"messages": MESSAGES, "stream": True, "stream_options": {"include_obfuscation": True}},
     "stream_options.include_obfuscation"),
])
def test_unimplemented_nested_fields_are_refused_by_name(server, body, param):
    r = _post(server, "/v1/chat/completions", {**body, "max_tokens": 3})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, "unsupported_parameter"), err
    assert param.rsplit(".", 1)[-1] in err["message"]


def test_neutral_nested_values_pass(server):
    body = {"messages": [{**MESSAGES[0], "tool_calls": []}], "max_tokens": 3, "stream": True,
            "stream_options": {"include_obfuscation": False, "include_usage": True}}
    assert _post(server, "/v1/chat/completions", body).status_code == 200


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "x", "min_p": 0.1}, "min_p"),
    ("/v1/completions", {"prompt": "x", "max_token": 5}, "max_token"),  # a typo is no no-op
    ("/v1/chat/completions", {"messages": MESSAGES, "guided_json": {}}, "guided_json"),
    ("/v1/chat/completions", {"messages": [{**MESSAGES[0], "mood": "happy"}]}, "messages.0.mood"),
])
def test_unknown_keys_are_refused_by_name(server, path, body, param):
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, "unknown_parameter"), err
    assert param in err["message"]


@pytest.mark.parametrize("role", ["user", "system", "developer"])
def test_message_without_content_is_refused(server, role):
    messages = [{"role": role}] if role == "user" else [{"role": role}, *MESSAGES]
    r = _post(server, "/v1/chat/completions", {"messages": messages})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages.0.content" and "content" in err["message"], err


def test_assistant_message_may_omit_content(server):
    messages = [*MESSAGES, {"role": "assistant"}, {"role": "user", "content": "again"}]
    assert _post(server, "/v1/chat/completions", {"messages": messages,
                                                  "max_tokens": 3}).status_code == 200


def test_official_client_sees_the_refusal(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake-model", messages=MESSAGES, store=True)
    assert e.value.param == "store" and e.value.code == "unsupported_parameter"
    out = client.chat.completions.create(model="fake-model", messages=MESSAGES, max_tokens=3,
                                         store=False, tool_choice="none")
    assert out.choices[0].message.content
