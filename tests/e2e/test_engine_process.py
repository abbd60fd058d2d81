"""The engine in a process of its own (`gearshift serve`'s default), through the server on a
tiny real checkpoint: what crosses the pipe (the engine's refusals, prefix-cache resets, structured
output, the step trace at stop), start-up failures raised in the server's process, and a
killed engine process ending every stream with /health 503. test_server_live.py runs the
whole client suite in this mode too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import httpx
import pytest

from gearshift.config import ConfigError
from gearshift.engine.engine import PromptError
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.frontend.engine_process import EngineProcess
from gearshift.llm import LLM, build_engine_config
from gearshift.request import SamplingParams
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer

OPTIONS = dict(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=8,
               kv_cache_tokens=4096, max_model_len=512)
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


@pytest.fixture(scope="module")
def served(tiny_llama_dir, tmp_path_factory):
    trace = tmp_path_factory.mktemp("trace") / "steps.jsonl"
    config = build_engine_config(str(tiny_llama_dir), step_trace=str(trace), **OPTIONS)
    process = EngineProcess(config)
    async_engine = AsyncEngine(process)
    with BackgroundServer(build_app(async_engine)) as srv:
        yield srv, async_engine, process, trace
    assert not process.process.is_alive()  # the app's shutdown stopped it


def _complete(srv, **body) -> httpx.Response:
    body = {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0} | body
    return httpx.post(srv.base_url + "/v1/completions", json=body, timeout=60)


def test_greedy_text_equals_offline(served, tiny_llama_dir):
    srv, async_engine, process, _ = served
    assert process.process.pid != os.getpid() and process.process.is_alive()
    got = _complete(srv, model=async_engine.model_name, max_tokens=16).json()
    want = LLM(model=str(tiny_llama_dir), **OPTIONS).generate(
        ["hello world"], SamplingParams(max_tokens=16, temperature=0.0))[0].text
    assert got["choices"][0]["text"] == want


def test_prompt_errors_come_back_across_the_pipe(tiny_llama_dir):
    """What the engine refuses comes back to the caller as the same exception (the server
    checks most of it first, so this drives AsyncEngine directly)."""
    async def main() -> None:
        async_engine = AsyncEngine(EngineProcess(build_engine_config(str(tiny_llama_dir),
                                                                     **OPTIONS)))
        async_engine.start()
        try:
            with pytest.raises(PromptError, match="out of range"):
                await async_engine.add_request("bad", [async_engine.vocab_size], GREEDY)
            stream = await async_engine.add_request("good", [1, 2, 3], GREEDY)
            deltas = [d async for d in stream]
            assert deltas[-1].finished and sum(len(d.new_token_ids) for d in deltas) == 4
            assert async_engine.num_waiting == 0
        finally:
            async_engine.shutdown()
        assert not async_engine.engine.process.is_alive()

    asyncio.run(main())


def test_prefix_cache_reset_and_snapshot_cross_the_pipe(served):
    srv, async_engine, _, _ = served
    assert _complete(srv, model=async_engine.model_name, prompt="a b c d " * 20).status_code == 200
    assert async_engine.snapshot.memory["kv_slots_cached"] > 0
    r = httpx.post(srv.base_url + "/reset_prefix_cache", timeout=30)
    assert r.status_code == 200
    mem = async_engine.snapshot.memory
    assert mem["kv_slots_cached"] == 0 and mem["kv_slots_free"] == mem["kv_slots_total"]


def test_structured_output_compiles_on_both_sides(served):
    srv, async_engine, _, _ = served
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    r = httpx.post(srv.base_url + "/v1/chat/completions", timeout=60, json={
        "model": async_engine.model_name, "max_tokens": 64, "temperature": 0,
        "messages": [{"role": "user", "content": "json"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"])["a"], int)
    bad = httpx.post(srv.base_url + "/v1/chat/completions", timeout=60, json={
        "model": async_engine.model_name, "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                   "schema": {"type": 5}}}})
    assert bad.status_code == 400  # refused by the server's own compiler


def test_the_step_trace_is_written_by_the_engine_process(served):
    srv, async_engine, _, trace = served
    assert _complete(srv, model=async_engine.model_name).status_code == 200
    # the engine flushes whenever it runs out of requests
    deadline = time.monotonic() + 10
    while not (trace.exists() and trace.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    assert steps and {s["mode"] for s in steps} >= {"extend", "decode"}


def test_start_up_failure_is_raised_in_the_server_process(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))  # no weights
    config = build_engine_config(str(tmp_path), **OPTIONS)
    with pytest.raises(ConfigError, match="unknown architecture"):  # the engine's own error
        EngineProcess(config)


def test_a_killed_engine_process_ends_streams_and_health(tiny_llama_dir):
    config = build_engine_config(str(tiny_llama_dir), **OPTIONS)
    process = EngineProcess(config)
    async_engine = AsyncEngine(process)
    died = threading.Event()
    async_engine.on_death = lambda exc: died.set()
    with BackgroundServer(build_app(async_engine)) as srv:
        body = {"model": async_engine.model_name, "prompt": "hello", "max_tokens": 400,
                "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.base_url + "/v1/completions", json=body,
                          timeout=60) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            os.kill(process.process.pid, signal.SIGKILL)
            rest = "\n".join(lines)
        assert "[DONE]" not in rest or "error" in rest
        assert died.wait(10)
        assert httpx.get(srv.base_url + "/health", timeout=5).status_code == 503
        assert not async_engine.is_alive


def test_a_short_soak_through_the_engine_process_passes(tiny_llama_dir):
    """Random parameters, disconnects and bad bodies against the engine in its process: no
    5xx, every KV slot back, still healthy."""
    from gearshift.bench.hostile import rss_mb
    from gearshift.bench.soak import soak

    config = build_engine_config(str(tiny_llama_dir), speculative_algorithm="ngram",
                                 num_draft_tokens=3, spec_policy="random", **OPTIONS)
    async_engine = AsyncEngine(EngineProcess(config))
    with BackgroundServer(build_app(async_engine)) as srv:
        result = asyncio.run(soak(srv.base_url, num_requests=150, concurrency=8, time_limit=90,
                                  seed=3, disconnect_prob=0.2, bad_prob=0.1, progress=False))
        # the soak's RSS series counts the engine's process too (torch alone is > 100 MB)
        assert rss_mb(async_engine.engine.process.pid) - rss_mb() > 100
    assert result["passed"], result
    outcomes = result["outcomes"]
    assert outcomes.get("200", 0) > 50 and outcomes.get("disconnect", 0) > 5
    assert async_engine.snapshot.stats["spec"]["proposed"] > 0
