"""What `gearshift bench soak --hostile` adds to a soak: request bodies a hostile client
would send, greedy requests checked against their solo runs, a flood of idle connections,
huge prompts beside a live stream, and the server process's memory over time.

Data flow: soak.py -> these probes against the server on 127.0.0.1 -> numbers in the
soak's JSON (5xx, /health latency under the flood, the stream's longest stall, RSS).
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import socket
import time

import httpx

_HUGE = "9" * 5000  # past Python's 4,300-digit int-string limit


def _body(**fields) -> bytes:
    return json.dumps({"prompt": "x", "max_tokens": 4, **fields}).encode()


# bodies that must each get a 4xx and change nothing for anyone else
HOSTILE_BODIES = [
    _body(top_k=2**31), _body(top_k=2**63), _body(top_k=2**70), _body(top_k=10**7),
    _body(seed=2**64), _body(seed=-(2**63) - 1), _body(max_tokens=2**63), _body(n=2**63),
    _body(prompt=[5, 10**7]), _body(prompt=[5, 2**70]), _body(prompt=[5, -1]),
    _body(stop_token_ids=[10**7]), _body(stop_token_ids=[1] * 300_000),
    _body(prompt=[5] * 300_000), _body(stop=["x" * 50_000]), _body(logit_bias={"5": 1e300}),
    f'{{"prompt": "x", "max_tokens": {_HUGE}}}'.encode(),
    f'{{"prompt": [{_HUGE}]}}'.encode(),
    f'{{"prompt": "x", "seed": -{_HUGE}}}'.encode(),
    b'{"prompt": "x", "temperature": 1e999}', b'{"messages": [{"role": "user"}]}',
    b'{"messages": []}', b'{"prompt": "x", "stream_options": 5}', b"\x00" * 1000,
]

GREEDY_PROMPTS = ["def add(a, b):", "class Stack:", "import os\n", "for i in range(10):",
                  "the quick brown fox", "once upon a time"]


def greedy_body(model: str, i: int) -> dict:
    return {"model": model, "prompt": GREEDY_PROMPTS[i % len(GREEDY_PROMPTS)], "max_tokens": 24,
            "temperature": 0, "ignore_eos": True}


async def solo_texts(client: httpx.AsyncClient, model: str) -> list[str]:
    """Each greedy prompt alone, before the load: the texts every later run must equal."""
    texts = []
    for i in range(len(GREEDY_PROMPTS)):
        r = await client.post("/v1/completions", json=greedy_body(model, i))
        r.raise_for_status()
        texts.append(r.json()["choices"][0]["text"])
    return texts


def rss_mb(engine_pid: int | None = None) -> float:
    """Resident memory of this process (the server runs in it) and of the engine's own
    process where it has one."""
    return sum(_vm_rss_mb(pid) for pid in ("self", engine_pid) if pid is not None)


def _vm_rss_mb(pid) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:  # the process is gone
        pass
    return 0.0


def _hold_idle(host: str, port: int, n: int, hold: float, opened) -> None:
    """Child process: n connections that send half a request head and then nothing."""
    socks = []
    for _ in range(n):
        try:
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        except OSError:
            pass
    opened.value += len(socks)
    time.sleep(hold)
    for s in socks:
        s.close()


def flood(base_url: str, connections: int, hold: float = 8.0, per_process: int = 10000) -> dict:
    """Open `connections` idle half-open connections (several processes: each has its own
    file limit) and time /health while they are held; the bytes the server logged meanwhile
    are counted (the server runs in this process). -> {opened, health_ms_max, health_ok,
    log_bytes}."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    ctx = multiprocessing.get_context("fork")
    opened = ctx.Value("i", 0)
    procs = [ctx.Process(target=_hold_idle, args=(host, int(port), min(per_process, left),
                                                  hold, opened))
             for left in range(connections, 0, -per_process)]
    counter = _LogBytes()
    logging.getLogger().addHandler(counter)
    for p in procs:
        p.start()
    worst, ok = 0.0, True
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            ok &= httpx.get(base_url + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            ok = False
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.2)
    for p in procs:
        p.join(hold + 30)
    logging.getLogger().removeHandler(counter)
    return {"connections": connections, "opened": opened.value, "health_ms_max": worst * 1e3,
            "health_ok": ok, "log_bytes": counter.bytes}


class _LogBytes(logging.Handler):
    """Counts the bytes of every record that reaches the root logger (filters applied)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.bytes += len(self.format(record)) + 1


async def stall(client: httpx.AsyncClient, model: str, count: int = 3, mbytes: float = 3.9
                ) -> dict:
    """`count` prompts of ~`mbytes` MB sent while a stream runs: the stream's longest gap
    between chunks, and the status codes of the big ones."""
    big = "word " * int(mbytes * 1024 * 1024 / 5)
    gaps: list[float] = []

    async def stream() -> None:
        body = {"model": model, "prompt": "hi", "max_tokens": 200, "stream": True,
                "ignore_eos": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            last = time.monotonic()
            async for _ in r.aiter_lines():
                now = time.monotonic()
                gaps.append(now - last)
                last = now

    async def post_big() -> int:
        r = await client.post("/v1/completions", json={"model": model, "prompt": big,
                                                       "max_tokens": 1})
        return r.status_code

    task = asyncio.create_task(stream())
    await asyncio.sleep(0.5)
    codes = await asyncio.gather(*(post_big() for _ in range(count)))
    await task
    return {"prompts": count, "megabytes": mbytes, "statuses": sorted(codes),
            "stream_gap_s_max": max(gaps[2:], default=0.0)}
