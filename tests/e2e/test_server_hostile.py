"""A hostile client against a live server on a tiny real checkpoint (speculation on): no
request body, however malformed or extreme, gets a 5xx or stops the engine, and a normal
request afterwards still gets the same text. A fault inside one request's processing fails
that request alone; a fault in the engine loop makes /health 503 and `serve` exit non-zero.

Data flow (tests only): httpx -> uvicorn -> app -> AsyncEngine -> Engine (tiny Llama, n-gram
drafts, random K) ; the greedy reference -> LLM.generate.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from gearshift.engine.engine import Engine
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.llm import LLM, build_engine_config
from gearshift.request import Request
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer

OPTIONS = dict(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=16,
               kv_cache_tokens=4096, max_num_batched_tokens=256)
SPEC = dict(speculative_algorithm="ngram", num_draft_tokens=3, spec_policy="random")
NORMAL = {"prompt": "the quick brown fox", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
HUGE = "9" * 5000  # past Python's 4,300-digit int-string limit


def _body(**fields) -> bytes:
    return json.dumps({"prompt": "x", "max_tokens": 4, **fields}).encode()


def _raw(text: str) -> bytes:
    return text.encode()


# (name, body bytes, param or code named in the 400)
HOSTILE = [
    ("top_k 2^31", _body(top_k=2**31), "top_k"),
    ("top_k 2^63", _body(top_k=2**63), "top_k"),
    ("top_k 2^70", _body(top_k=2**70), "top_k"),
    ("top_k above the vocabulary", _body(top_k=100_000), "top_k"),
    ("seed 2^64", _body(seed=2**64), "seed"),
    ("seed -2^63 - 1", _body(seed=-(2**63) - 1), "seed"),
    ("max_tokens 2^63", _body(max_tokens=2**63), "max_tokens"),
    ("n 2^63", _body(n=2**63), "n"),
    ("token id out of the vocabulary", _body(prompt=[5, 10**6]), "prompt"),
    ("token id 2^70", _body(prompt=[5, 2**70]), "prompt"),
    ("negative token id", _body(prompt=[5, -1]), "prompt"),
    ("stop id out of the vocabulary", _body(stop_token_ids=[10**6]), "stop_token_ids"),
    ("stop id 2^64", _body(stop_token_ids=[2**64]), "stop_token_ids"),
    ("a million stop ids", _body(stop_token_ids=[1] * 10**6), "stop_token_ids"),
    ("a million prompt ids", _body(prompt=[5] * 10**6), "prompt"),
    ("a huge stop string", _body(stop=["x" * 100_000]), "stop"),
    ("5,000-digit max_tokens", _raw(f'{{"prompt": "x", "max_tokens": {HUGE}}}'), "invalid_json"),
    ("5,000-digit top_k", _raw(f'{{"prompt": "x", "top_k": {HUGE}}}'), "invalid_json"),
    ("5,000-digit seed", _raw(f'{{"prompt": "x", "seed": -{HUGE}}}'), "invalid_json"),
    ("5,000-digit token id", _raw(f'{{"prompt": [{HUGE}]}}'), "invalid_json"),
]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    out = LLM(model=str(tiny_llama_dir), **OPTIONS).generate(
        [NORMAL["prompt"]], __import__("gearshift").SamplingParams(
            max_tokens=12, temperature=0.0, ignore_eos=True))
    return out[0].text


@pytest.fixture(scope="module")
def live(tiny_llama_dir):
    engine = Engine(build_engine_config(str(tiny_llama_dir), **OPTIONS, **SPEC))
    with BackgroundServer(build_app(AsyncEngine(engine))) as srv:
        yield srv, engine


def _normal(client: httpx.Client) -> str:
    r = client.post("/v1/completions", json=NORMAL)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.mark.parametrize("name,body,named", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_body_is_a_400_naming_the_field(live, reference, name, body, named):
    srv, engine = live
    with httpx.Client(base_url=srv.base_url, timeout=60) as client:
        r = client.post("/v1/completions", content=body,
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert named in (err["param"], err["code"]), err
        assert client.get("/health").status_code == 200
        assert _normal(client) == reference
    assert not engine.has_unfinished_requests() or engine.num_running() >= 0


def test_accepted_neighbours_work(live, reference):
    """Values at the edge of the bounds are served, not rejected."""
    srv, engine = live
    with httpx.Client(base_url=srv.base_url, timeout=60) as client:
        for extra in ({"seed": -1, "temperature": 1.0}, {"seed": 2**63 - 1, "temperature": 1.0},
                      {"top_k": engine.vocab_size, "temperature": 1.0},
                      {"stop_token_ids": [engine.vocab_size - 1]}):
            r = client.post("/v1/completions", json={**NORMAL, **extra})
            assert r.status_code == 200, (extra, r.text)
        assert _normal(client) == reference


VICTIM_MAX_TOKENS = 13  # the request the injected fault hits


def _fault_on(monkeypatch, cls, name: str) -> None:
    """Make cls.name raise for the victim request (its max_tokens marks it)."""
    orig = getattr(cls, name)

    def faulty(self, *args, **kwargs):
        req = self if isinstance(self, Request) else args[0]
        if req.params.max_tokens == VICTIM_MAX_TOKENS:
            raise RuntimeError("injected fault")
        return orig(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, faulty)


@pytest.mark.parametrize("stage", ["prepare", "commit"])
def test_a_fault_in_one_request_fails_that_request_only(tiny_llama_dir, reference, monkeypatch,
                                                         stage):
    from gearshift.scheduler.scheduler import Scheduler

    engine = Engine(build_engine_config(str(tiny_llama_dir), **OPTIONS))
    with BackgroundServer(build_app(AsyncEngine(engine))) as srv:
        if stage == "prepare":
            _fault_on(monkeypatch, Request, "token_slice")
        else:
            _fault_on(monkeypatch, Scheduler, "_write")
        victim = {**NORMAL, "max_tokens": VICTIM_MAX_TOKENS}
        with httpx.Client(base_url=srv.base_url, timeout=60) as client:
            texts = [_normal(client), _normal(client)]
            r = client.post("/v1/completions", json=victim)
            assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
            assert "injected fault" in r.json()["error"]["message"]
            r = client.post("/v1/completions", json={**victim, "stream": True})
            assert r.status_code == 200 and '"code":"internal_error"' in r.text.replace(" ", "")
            assert client.get("/health").status_code == 200
            texts.append(_normal(client))
            metrics = client.get("/metrics").text
        assert texts == [reference] * 3
        assert "gearshift_request_finish_total{reason=\"error\"} 2.0" in metrics, \
            "\n".join(x for x in metrics.splitlines() if "finish_total" in x)
        deadline = time.monotonic() + 10
        while engine.has_unfinished_requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        mem = engine.memory_stats()
        assert mem["kv_slots_free"] + mem["kv_slots_cached"] == mem["kv_slots_total"]


def test_a_fault_in_the_engine_loop_ends_the_server(tiny_llama_dir, tmp_path):
    """/health answers 503 at once, the process exits non-zero within 10 s, the log says why
    once."""
    script = tmp_path / "serve.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from gearshift.frontend.async_engine import AsyncEngine
        from gearshift.engine.engine import Engine
        from gearshift.llm import build_engine_config
        from gearshift.server.cli import serve
        engine = Engine(build_engine_config({str(tiny_llama_dir)!r}, **{OPTIONS!r}))
        step = engine.step
        def faulty(emit=None):
            if engine.step_stats.counts["steps"] >= 3:
                raise RuntimeError("injected engine-loop fault")
            return step(emit)
        engine.step = faulty
        sys.exit(serve(AsyncEngine(engine), host="127.0.0.1", port=int(sys.argv[1])))
    """))
    from gearshift.server.background import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script), str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        r = httpx.post(base + "/v1/completions", json=NORMAL, timeout=30)
        assert r.status_code == 503
        t_dead = time.monotonic()
        try:
            assert httpx.get(base + "/health", timeout=2).status_code == 503
        except httpx.HTTPError:
            pass  # already gone
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode != 0 and time.monotonic() - t_dead < 10
        assert out.count("injected engine-loop fault") >= 1
        assert out.count("the engine stopped") == 1
    finally:
        if proc.poll() is None:
            proc.kill()
