"""Bad requests against a live server (fake engine): each gets its documented status and an
OpenAI-shaped error naming the problem, and /health stays OK after every one.

Data flow (tests only): httpx -> uvicorn -> app (auth, body, protocol, serving) -> error JSON.
"""

from __future__ import annotations

import httpx
import pytest
from fake_engine import fake_server

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT_OK = {"messages": [{"role": "user", "content": "hi"}]}
MAX_BODY = 64 * 1024
MAX_MODEL_LEN = 256

# (name, method, path, request kwargs, status, expected error param or code)
BAD_REQUESTS = [
    ("no api key", "POST", "/v1/completions", {"json": {"prompt": "x"}, "headers": {}},
     401, "invalid_api_key"),
    ("wrong api key", "POST", "/v1/completions",
     {"json": {"prompt": "x"}, "headers": {"Authorization": "Bearer nope"}}, 401, "invalid_api_key"),
    ("wrong auth scheme", "GET", "/v1/models", {"headers": {"Authorization": f"Basic {KEY}"}},
     401, "invalid_api_key"),
    ("malformed json", "POST", "/v1/completions", {"content": b'{"prompt": '}, 400, "invalid_json"),
    ("non-utf8 body", "POST", "/v1/completions", {"content": b'{"prompt": "\xff\xfe"}'},
     400, "invalid_encoding"),
    ("empty body", "POST", "/v1/completions", {"content": b""}, 400, "invalid_json"),
    ("json nested too deeply", "POST", "/v1/completions",
     {"content": b"[" * 20_000 + b"]" * 20_000}, 400, "invalid_json"),
    ("unpaired surrogate escape", "POST", "/v1/completions",
     {"content": b'{"prompt": "\\ud800 hi"}'}, 400, "invalid_encoding"),
    ("json array body", "POST", "/v1/completions", {"json": [1, 2]}, 400, "invalid_json"),
    ("NaN temperature", "POST", "/v1/completions",
     {"content": b'{"prompt": "x", "temperature": NaN}'}, 400, "temperature"),
    ("missing prompt", "POST", "/v1/completions", {"json": {"max_tokens": 4}}, 400, "prompt"),
    ("prompt wrong type", "POST", "/v1/completions", {"json": {"prompt": 5}}, 400, "prompt"),
    ("token list with a string", "POST", "/v1/completions", {"json": {"prompt": [1, "a"]}},
     400, "prompt"),
    ("empty prompt", "POST", "/v1/completions", {"json": {"prompt": ""}}, 400, "prompt"),
    ("empty token list", "POST", "/v1/completions", {"json": {"prompt": []}}, 400, "prompt"),
    ("token id out of vocab", "POST", "/v1/completions", {"json": {"prompt": [5, 999999]}},
     400, "prompt"),
    ("max_tokens string", "POST", "/v1/completions", {"json": {"prompt": "x", "max_tokens": "9"}},
     400, "max_tokens"),
    ("max_tokens zero", "POST", "/v1/completions", {"json": {"prompt": "x", "max_tokens": 0}},
     400, "max_tokens"),
    ("max_tokens negative", "POST", "/v1/completions", {"json": {"prompt": "x", "max_tokens": -5}},
     400, "max_tokens"),
    ("max_tokens float", "POST", "/v1/completions", {"json": {"prompt": "x", "max_tokens": 2.5}},
     400, "max_tokens"),
    ("prompt + max_tokens beyond context", "POST", "/v1/completions",
     {"json": {"prompt": "x", "max_tokens": MAX_MODEL_LEN}}, 400, "context_length_exceeded"),
    ("prompt alone beyond context", "POST", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": "y" * 400}]}}, 400,
     "context_length_exceeded"),
    ("temperature negative", "POST", "/v1/completions", {"json": {"prompt": "x", "temperature": -1}},
     400, "temperature"),
    ("temperature too high", "POST", "/v1/completions", {"json": {"prompt": "x", "temperature": 9}},
     400, "temperature"),
    ("top_p zero", "POST", "/v1/completions", {"json": {"prompt": "x", "top_p": 0}}, 400, "top_p"),
    ("top_p above one", "POST", "/v1/completions", {"json": {"prompt": "x", "top_p": 1.5}},
     400, "top_p"),
    ("top_k negative", "POST", "/v1/completions", {"json": {"prompt": "x", "top_k": -3}},
     400, "top_k"),
    ("n zero", "POST", "/v1/completions", {"json": {"prompt": "x", "n": 0}}, 400, "n"),
    ("n too large", "POST", "/v1/completions", {"json": {"prompt": "x", "n": 1000}}, 400, "n"),
    ("seed past 64 bits", "POST", "/v1/completions", {"json": {"prompt": "x", "seed": 2**64}},
     400, "seed"),
    ("stream not a bool", "POST", "/v1/completions", {"json": {"prompt": "x", "stream": "yes"}},
     400, "stream"),
    ("stop empty string", "POST", "/v1/completions", {"json": {"prompt": "x", "stop": [""]}},
     400, "stop"),
    ("stop wrong type", "POST", "/v1/completions", {"json": {"prompt": "x", "stop": 7}}, 400, "stop"),
    ("logprobs too many", "POST", "/v1/completions", {"json": {"prompt": "x", "logprobs": 21}},
     400, "logprobs"),
    ("logprobs negative", "POST", "/v1/completions", {"json": {"prompt": "x", "logprobs": -1}},
     400, "logprobs"),
    ("chat top_logprobs without logprobs", "POST", "/v1/chat/completions",
     {"json": {**CHAT_OK, "top_logprobs": 3}}, 400, "invalid_value"),
    ("chat top_logprobs too many", "POST", "/v1/chat/completions",
     {"json": {**CHAT_OK, "logprobs": True, "top_logprobs": 25}}, 400, "top_logprobs"),
    ("presence_penalty out of range", "POST", "/v1/completions",
     {"json": {"prompt": "x", "presence_penalty": 2.5}}, 400, "presence_penalty"),
    ("frequency_penalty out of range", "POST", "/v1/chat/completions",
     {"json": {**CHAT_OK, "frequency_penalty": -3}}, 400, "frequency_penalty"),
    ("repetition_penalty zero", "POST", "/v1/completions",
     {"json": {"prompt": "x", "repetition_penalty": 0}}, 400, "repetition_penalty"),
    ("logit_bias key not an id", "POST", "/v1/completions",
     {"json": {"prompt": "x", "logit_bias": {"abc": 1}}}, 400, "logit_bias"),
    ("logit_bias value not a number", "POST", "/v1/completions",
     {"json": {"prompt": "x", "logit_bias": {"5": "big"}}}, 400, "logit_bias.5"),
    ("spec_sampling unknown", "POST", "/v1/completions",
     {"json": {"prompt": "x", "spec_sampling": "exact"}}, 400, "spec_sampling"),
    ("min_tokens negative", "POST", "/v1/completions",
     {"json": {"prompt": "x", "min_tokens": -1}}, 400, "min_tokens"),
    ("min_tokens above max_tokens", "POST", "/v1/completions",
     {"json": {"prompt": "x", "max_tokens": 3, "min_tokens": 5}}, 400, "invalid_value"),
    ("unknown model", "POST", "/v1/completions", {"json": {"prompt": "x", "model": "gpt-9"}},
     404, "model_not_found"),
    ("unknown model (chat)", "POST", "/v1/chat/completions", {"json": {**CHAT_OK, "model": "nope"}},
     404, "model_not_found"),
    ("chat without messages", "POST", "/v1/chat/completions", {"json": {"max_tokens": 3}},
     400, "messages"),
    ("chat empty messages", "POST", "/v1/chat/completions", {"json": {"messages": []}},
     400, "messages"),
    ("chat unknown role", "POST", "/v1/chat/completions",
     {"json": {"messages": [{"role": "robot", "content": "x"}]}}, 400, "messages.0.role"),
    ("chat content wrong type", "POST", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": 42}]}}, 400, "messages.0.content"),
    ("chat max_completion_tokens zero", "POST", "/v1/chat/completions",
     {"json": {**CHAT_OK, "max_completion_tokens": 0}}, 400, "max_completion_tokens"),
    ("chat image content", "POST", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}}, 400,
     "messages.0.content"),
    ("chat tools unsupported", "POST", "/v1/chat/completions",
     {"json": {**CHAT_OK, "tools": [{"type": "function"}]}}, 400, "tools"),
    ("body over the size limit", "POST", "/v1/completions",
     {"json": {"prompt": "z" * (MAX_BODY + 10)}}, 413, "body_too_large"),
    ("unknown route", "POST", "/v1/engines", {"json": {}}, 404, None),
    ("wrong method", "GET", "/v1/completions", {}, 405, None),
]


@pytest.fixture(scope="module")
def server():
    with fake_server(api_key=KEY, max_body_bytes=MAX_BODY, max_model_len=MAX_MODEL_LEN) as srv:
        yield srv


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "expected"),
                         [case[1:] for case in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_bad_request(server, method, path, kwargs, status, expected):
    kwargs = dict(kwargs)
    headers = kwargs.pop("headers", AUTH)
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        r = client.request(method, path, headers=headers, **kwargs)
        assert r.status_code == status, r.text
        body = r.json()
        assert set(body) == {"error"}
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert isinstance(err["message"], str) and err["message"]
        assert isinstance(err["type"], str) and err["type"]
        if expected is not None:
            assert expected in (err["param"], err["code"]), err
            if err["param"] is not None:  # the message names the offending field
                assert err["param"].split(".")[0] in err["message"], err
        if status == 401:
            assert r.headers.get("content-type", "").startswith("application/json")
        health = client.get("/health")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert not server.engine.live_request_ids()


def test_table_is_large_enough():
    assert len(BAD_REQUESTS) >= 20
    assert {c[4] for c in BAD_REQUESTS} >= {400, 401, 404, 413}


def test_null_means_default(server):
    body = {"prompt": "ab", "max_tokens": None, "temperature": None, "n": None, "stop": None,
            "seed": None, "stream": None, "model": None}
    r = httpx.post(server.base_url + "/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 16  # the OpenAI default max_tokens


def test_good_request_after_bad_ones(server):
    with httpx.Client(base_url=server.base_url, headers=AUTH, timeout=10) as client:
        for case in BAD_REQUESTS[:10]:
            client.request(case[1], case[2], **{k: v for k, v in case[3].items() if k != "headers"})
        r = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 5, "temperature": 0})
        assert r.status_code == 200
        assert r.json()["usage"]["completion_tokens"] == 5
        metrics = client.get("/metrics").text
    assert 'gearshift_requests_total{endpoint="/v1/completions",status="400"}' in metrics
    assert 'gearshift_requests_total{endpoint="/v1/completions",status="200"}' in metrics


def test_overload_returns_503_with_retry_after():
    """With admission paused, the waiting queue fills; the next request gets 503."""
    with fake_server(max_waiting=3, max_num_seqs=1) as srv:
        srv.engine.paused.set()
        body = {"prompt": "x", "max_tokens": 2}
        with httpx.Client(base_url=srv.base_url, timeout=10) as client:
            import concurrent.futures as cf

            with cf.ThreadPoolExecutor(3) as pool:
                waiting = [pool.submit(client.post, "/v1/completions", json=body)
                           for _ in range(3)]
                _wait_for(lambda: srv.async_engine.num_waiting == 3)
                r = client.post("/v1/completions", json=body)
                assert r.status_code == 503
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "overloaded"
                r = client.post("/v1/completions", json={**body, "n": 1})
                assert r.status_code == 503
                r = client.post("/v1/completions", json={**body, "n": 4})  # can never fit
                assert r.status_code == 400 and r.json()["error"]["param"] == "n"
                assert client.get("/health").status_code == 200
                srv.engine.paused.clear()
                assert [f.result().status_code for f in waiting] == [200, 200, 200]
            assert client.post("/v1/completions", json=body).status_code == 200


def test_engine_failure_fails_requests_and_health():
    with fake_server(step_delay=0.01) as srv, httpx.Client(base_url=srv.base_url) as client:
        srv.engine.fail_next_step = RuntimeError("device on fire")
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 503
        assert "device on fire" in r.json()["error"]["message"]
        assert client.get("/health").status_code == 503
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 503


def _wait_for(cond, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_schema_needs_the_key_and_there_are_no_docs_pages(server):
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        assert client.get("/openapi.json").status_code == 401
        r = client.get("/openapi.json", headers=AUTH)
        assert r.status_code == 200 and "/v1/completions" in r.json()["paths"]
        assert client.get("/docs", headers=AUTH).status_code == 404
        assert client.get("/redoc", headers=AUTH).status_code == 404
