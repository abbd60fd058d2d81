"""Floods that must not starve the server: idle connections that never finish their headers
(the guard caps connections, evicting idle ones first, and closes them after the header
timeout; repeated errors are logged once per interval), and huge prompts, whose
tokenisation runs off the event loop while other streams keep flowing.

Data flow (tests only): raw sockets / httpx -> uvicorn (GuardedH11) -> app -> FakeEngine.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import httpx
import pytest
from fake_engine import fake_server

from gearshift.server.guard import RateLimitFilter


def _open_idle(base_url: str, n: int) -> list[socket.socket]:
    host, port = base_url.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finishes the head
        socks.append(s)
    return socks


def test_idle_connections_past_the_cap_leave_health_answering(caplog):
    with fake_server(limits={"max_connections": 64, "header_timeout": 2.0}) as srv:
        socks = _open_idle(srv.base_url, 600)
        try:
            t0 = time.monotonic()
            r = httpx.get(srv.base_url + "/health", timeout=5)
            assert r.status_code == 200 and time.monotonic() - t0 < 1.0
            r = httpx.post(srv.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4},
                           timeout=5)
            assert r.status_code == 200
        finally:
            for s in socks:
                s.close()


def test_a_connection_that_never_sends_its_head_is_closed_after_the_timeout():
    with fake_server(limits={"header_timeout": 0.5}) as srv:
        (s,) = _open_idle(srv.base_url, 1)
        s.settimeout(5)
        t0 = time.monotonic()
        assert s.recv(1024) == b""  # closed by the server
        assert 0.3 < time.monotonic() - t0 < 3
        s.close()


def test_repeated_errors_are_logged_once_per_interval():
    flt = RateLimitFilter(interval=0.2)
    log = logging.getLogger("gearshift.test.flood")
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    log.addHandler(Keep())
    log.addFilter(flt)
    log.propagate = False
    for _ in range(1000):
        log.error("socket.accept() out of system resource")
    time.sleep(0.25)
    log.error("socket.accept() out of system resource")
    log.error("another problem")
    assert records == ["socket.accept() out of system resource",
                       "socket.accept() out of system resource (999 more like this in the last "
                       "0 s)", "another problem"]


@pytest.mark.timeout(120)
def test_huge_prompts_do_not_stall_other_streams():
    """Three ~4 MB prompts (tokenised off the event loop) while a stream runs: the stream's
    longest gap between chunks stays under 0.5 s."""
    big = ("word " * (4 * 1024 * 1024 // 5 - 100))
    with fake_server(max_body_bytes=5 << 20, step_delay=0.01, max_model_len=10**7) as srv:
        gaps: list[float] = []

        def stream():
            with httpx.stream("POST", srv.base_url + "/v1/completions", timeout=60,
                              json={"prompt": "hi", "max_tokens": 300, "stream": True,
                                    "ignore_eos": True}) as r:
                last = time.monotonic()
                for _ in r.iter_lines():
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(0.3)
        posters = [threading.Thread(target=lambda: httpx.post(
            srv.base_url + "/v1/completions", json={"prompt": big, "max_tokens": 1},
            timeout=60)) for _ in range(3)]
        for p in posters:
            p.start()
        for p in posters:
            p.join()
        t.join()
        assert len(gaps) > 100 and max(gaps[2:]) < 0.5, max(gaps)
