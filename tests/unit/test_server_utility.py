"""The routes beside the OpenAI API (fake engine): GET /v1/models/{id} (and the official
client's models.retrieve), POST /tokenize and /detokenize in vLLM's shapes, GET /version;
all behind the API key like /v1.

Data flow (tests only): httpx / openai client -> uvicorn -> app -> server/utility.py ->
the fake engine's byte tokenizer.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from fake_engine import BOS_ID, BYTE_OFFSET, VOCAB_SIZE, fake_server

import gearshift

KEY = "utility-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server():
    with fake_server(api_key=KEY, model_name="org/fake-model", max_model_len=256) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.base_url, headers=AUTH, timeout=10) as c:
        yield c


def _bytes(text: str) -> list[int]:
    return [b + BYTE_OFFSET for b in text.encode()]


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/models/org/fake-model"), ("POST", "/tokenize"), ("POST", "/detokenize"),
    ("POST", "/v1/tokenize"), ("POST", "/v1/detokenize"), ("GET", "/version"),
])
def test_routes_need_the_api_key(server, method, path):
    r = httpx.request(method, server.base_url + path, json={"tokens": [5]})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_model_card_by_id(server, client):
    r = client.get("/v1/models/org/fake-model")  # ids may hold slashes
    assert r.status_code == 200
    assert r.json()["id"] == "org/fake-model" and r.json()["max_model_len"] == 256
    r = client.get("/v1/models/gpt-9")
    assert r.status_code == 404
    err = r.json()["error"]
    assert "gpt-9" in err["message"] and err["code"] == "model_not_found"
    oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
    assert oai.models.retrieve("org/fake-model").id == "org/fake-model"
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("gpt-9")


def test_tokenize_a_prompt(client):
    r = client.post("/tokenize", json={"prompt": "héllo"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == [BOS_ID, *_bytes("héllo")]
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 256
    assert body["token_strs"] is None
    body = client.post("/tokenize", json={"prompt": "hi", "add_special_tokens": False,
                                          "return_token_strs": True}).json()
    assert body["tokens"] == _bytes("hi") and body["token_strs"] == ["h", "i"]


def test_tokenize_messages_counts_as_the_chat_request(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    body = client.post("/tokenize", json={"messages": messages}).json()
    assert body["tokens"] == _bytes("<|system|>be brief\n<|user|>hi\n<|assistant|>")
    chat = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert chat.json()["usage"]["prompt_tokens"] == body["count"]
    plain = client.post("/tokenize", json={"messages": messages, "add_generation_prompt": False,
                                           "add_special_tokens": True}).json()
    assert plain["tokens"] == [BOS_ID, *_bytes("<|system|>be brief\n<|user|>hi\n")]


def test_a_prompt_starting_with_bos_gets_no_second(client):
    """As a completion's text prompt: the tokenizer's BOS is not added before a BOS the text
    already holds (an evaluation harness's decoded ids)."""
    body = client.post("/tokenize", json={"prompt": "<|begin|>hi"}).json()
    assert body["tokens"] == [BOS_ID, *_bytes("hi")]
    body = client.post("/tokenize", json={"prompt": "<|begin|>hi", "add_special_tokens": False})
    assert body.json()["tokens"] == [BOS_ID, *_bytes("hi")]
    r = client.post("/v1/completions", json={"prompt": "<|begin|>hi", "max_tokens": 1})
    assert r.json()["usage"]["prompt_tokens"] == 3
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1,
                                             "add_special_tokens": False})
    assert r.json()["usage"]["prompt_tokens"] == 2


def test_tokenize_and_detokenize_under_v1(client):
    """Also where an OpenAI client's base URL points (vLLM serves both paths)."""
    for prefix in ("", "/v1"):
        ids = client.post(prefix + "/tokenize", json={"prompt": "héllo"}).json()["tokens"]
        assert ids == [BOS_ID, *_bytes("héllo")]
        r = client.post(prefix + "/detokenize", json={"tokens": ids[1:]})
        assert r.status_code == 200 and r.json() == {"prompt": "héllo"}
        r = client.post(prefix + "/detokenize", json={"tokens": [-1]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


def test_detokenize(client):
    r = client.post("/detokenize", json={"tokens": _bytes("wörld")})
    assert r.status_code == 200 and r.json() == {"prompt": "wörld"}
    assert client.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/detokenize", {"tokens": [5, VOCAB_SIZE]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": ["a"]}, "tokens.0"),
    ("/detokenize", {}, "tokens"),
    ("/tokenize", {}, None),
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, None),
    ("/tokenize", {"messages": [{"role": "user"}]}, "messages.0.content"),
    ("/tokenize", {"prompt": "x", "model": "gpt-9"}, "model"),
    ("/tokenize", {"prompt": "x", "tools": []}, "tools"),
])
def test_bad_bodies_are_refused(client, path, body, param):
    r = client.post(path, json=body)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    if path == "/detokenize" and param == "tokens" and body.get("tokens"):
        assert str(body["tokens"][-1]) in err["message"]  # names the id


def test_version(client):
    assert client.get("/version").json() == {"version": gearshift.__version__}


def test_tokenizer_missing_or_without_template():
    with fake_server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        srv.async_engine.tokenizer.chat_template = None
        r = c.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "no_chat_template"
        srv.async_engine.tokenizer = None
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [5]})):
            r = c.post(path, json=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "no_tokenizer"
