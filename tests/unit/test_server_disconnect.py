"""Clients that go away: mid-stream, while queued, and while waiting for a non-streamed
answer. Each must abort its engine request at once, so the engine is left with no live
request and /metrics shows every KV slot free again.

Data flow (tests only): httpx (async, many clients) -> uvicorn -> app disconnect watcher ->
AsyncEngine.abort -> inbox -> FakeEngine.abort_request.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from fake_engine import fake_server

LONG = 2000  # tokens: ~10 s at 5 ms a step, so only an abort can end these requests early


@pytest.fixture
def server():
    with fake_server(step_delay=0.005, max_num_seqs=64, max_model_len=4096,
                     kv_slots=1 << 20) as srv:
        yield srv


async def _read_then_leave(client: httpx.AsyncClient, path: str, body: dict, lines: int) -> int:
    """Open a stream, read `lines` SSE data lines, then drop the connection."""
    seen = 0
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        if lines == 0:
            return 0
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen >= lines:
                    break
    return seen


def test_many_parallel_mid_stream_disconnects(server):
    async def main() -> None:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.base_url, limits=limits, timeout=30) as c:
            jobs = []
            for i in range(48):
                body = {"prompt": f"client {i}", "max_tokens": LONG, "stream": True}
                if i % 2:
                    jobs.append(_read_then_leave(c, "/v1/completions", {**body, "n": 2}, 1 + i % 5))
                else:
                    chat = {"messages": [{"role": "user", "content": f"hi {i}"}],
                            "max_tokens": LONG, "stream": True}
                    jobs.append(_read_then_leave(c, "/v1/chat/completions", chat, 1 + i % 7))
            await asyncio.gather(*jobs)

    start = time.monotonic()
    asyncio.run(main())
    server.wait_idle(timeout=5.0)
    assert time.monotonic() - start < LONG * 0.005  # far sooner than the requests would end
    aborted = [rid for rid, reason in server.engine.aborted if reason == "abort"]
    assert len(aborted) == 24 * 2 + 24
    assert server.metric("gearshift_num_requests_running") == 0
    assert server.metric("gearshift_kv_slots_free") == server.metric("gearshift_kv_slots_total")
    # still healthy and serving
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "ok", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_disconnect_while_queued_and_non_streamed(server):
    server.engine.paused.set()  # nothing is admitted: requests sit in the waiting queue

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
            queued = [
                _read_then_leave(c, "/v1/completions",
                                 {"prompt": "q", "max_tokens": 5, "stream": True}, 0)
                for _ in range(4)
            ]
            await asyncio.gather(*queued)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=0.3) as c:
            with pytest.raises(httpx.ReadTimeout):
                await c.post("/v1/completions", json={"prompt": "slow", "max_tokens": 5})

    asyncio.run(main())
    server.wait_idle(timeout=5.0)
    assert len(server.engine.aborted) == 5
    assert server.engine.num_waiting() == 0
    server.engine.paused.clear()
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "ok", "max_tokens": 2})
    assert r.status_code == 200


def test_non_streamed_disconnect_mid_generation(server):
    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=0.3) as c:
            jobs = [c.post("/v1/completions", json={"prompt": str(i), "max_tokens": LONG})
                    for i in range(8)]
            results = await asyncio.gather(*jobs, return_exceptions=True)
            assert all(isinstance(r, httpx.ReadTimeout) for r in results)

    asyncio.run(main())
    server.wait_idle(timeout=5.0)
    assert len(server.engine.aborted) == 8
    assert server.engine.stats()["tokens_generated"] < 8 * LONG / 4


def test_streams_aborted_by_a_disconnect_are_counted(server):
    """Every finish reason is counted, a disconnected stream's "abort" included, and every
    token it was sent counts as generated."""
    def finished(reason: str) -> float:
        text = httpx.get(server.base_url + "/metrics").text
        key = f'gearshift_request_finish_total{{reason="{reason}"}} '
        return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(key)), 0.0)

    aborts, tokens = finished("abort"), server.metric("gearshift_generation_tokens_total")

    async def main() -> int:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
            body = {"prompt": "leaving", "max_tokens": LONG, "stream": True}
            return await _read_then_leave(c, "/v1/completions", body, 6)

    seen = asyncio.run(main())
    server.wait_idle(timeout=5.0)
    deadline = time.monotonic() + 5
    while finished("abort") < aborts + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert finished("abort") == aborts + 1
    assert server.metric("gearshift_generation_tokens_total") - tokens >= seen - 1
