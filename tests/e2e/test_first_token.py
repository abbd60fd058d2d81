"""Time to first token with speculation: the prefill's token streams as soon as it is read,
not after the VERIFY step that follows it (checked through the server, the embedded model
and its EAGLE-3 head, each VERIFY step slowed down on purpose).

Data flow (tests only): httpx stream -> uvicorn -> app -> AsyncEngine -> Engine.step(emit)
-> the first token's chunk; SpecRunner.run wrapped to record when VERIFY steps end.
"""

from __future__ import annotations

import time

import httpx

from gearshift.engine.engine import Engine
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.llm import build_engine_config
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer

SLOW = 1.0  # seconds added to every VERIFY step


def test_the_first_token_streams_before_the_first_verify_step_ends():
    engine = Engine(build_engine_config(None, device="cpu", speculative_algorithm="eagle3",
                                        num_draft_tokens=3, spec_policy="always"))
    verify_ends: list[float] = []
    run = engine.spec.run

    def slow_run(*args, **kwargs):
        time.sleep(SLOW)
        out = run(*args, **kwargs)
        verify_ends.append(time.monotonic())
        return out

    engine.spec.run = slow_run
    with BackgroundServer(build_app(AsyncEngine(engine))) as srv:
        body = {"prompt": "def add(a, b):\n", "max_tokens": 8, "temperature": 0, "stream": True,
                "ignore_eos": True}
        first = None
        with httpx.stream("POST", srv.base_url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if first is None and line.startswith("data: {") and '"text":""' not in line:
                    first = time.monotonic()
    assert first is not None and verify_ends
    assert first < verify_ends[0] - SLOW / 2, (first, verify_ends[0])
