"""Bounded soak test of the server: thousands of requests with random parameters, random
client disconnects and some malformed requests, on loopback only; stops by itself (request
count or time limit) and checks that nothing answered 5xx, no KV slot leaked and the server
is still healthy.

    gearshift bench soak --model DIR [--num-requests 3000] [--concurrency 32]
    gearshift bench soak --hostile ...   # + hostile bodies, greedy checks against solo runs,
                                         #   an idle-connection flood, huge prompts, RSS

Data flow: args -> Engine (in a process of its own, as `serve` runs it) -> AsyncEngine ->
app on 127.0.0.1 (BackgroundServer) <- random httpx clients; at the end GET /metrics (KV
gauges) + /health -> summary table + JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from datetime import UTC, datetime

import httpx

from gearshift.bench.hostile import (
    HOSTILE_BODIES,
    flood,
    greedy_body,
    rss_mb,
    solo_texts,
    stall,
)

BAD_BODIES = [
    b'{"prompt": ',
    b'{"prompt": "\xff"}',
    b"[1, 2, 3]",
    b'{"prompt": "x", "max_tokens": 0}',
    b'{"prompt": "x", "temperature": -1}',
    b'{"prompt": "", "max_tokens": 3}',
    b'{"prompt": "x", "model": "no-such-model"}',
    b'{"prompt": [1, "a"]}',
    b'{"prompt": "x", "max_tokens": 100000000}',
    b'{"prompt": "x", "n": 0}',
]
WORDS = "once upon a time the fox said hello world to the lazy dog and ran far away".split()


def random_body(rng: random.Random, model: str, chat: bool) -> dict:
    body: dict = {"model": model, "max_tokens": rng.randint(1, 48)}
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24)))
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text if rng.random() < 0.8 else [rng.randrange(10, 256)
                                                          for _ in range(rng.randint(1, 40))]
    if rng.random() < 0.5:
        body["temperature"] = round(rng.uniform(0.0, 1.5), 2)
    if rng.random() < 0.3:
        body["top_p"] = round(rng.uniform(0.1, 1.0), 2)
    if rng.random() < 0.3:
        body["top_k"] = rng.choice([-1, 1, 5, 50])
    if rng.random() < 0.3:
        body["seed"] = rng.randrange(1 << 20)
    if rng.random() < 0.2:
        body["n"] = rng.randint(2, 3)
    if rng.random() < 0.2:
        body["stop"] = [rng.choice(WORDS), rng.choice("aeiou .")]
    if rng.random() < 0.3:
        body["ignore_eos"] = True
    if rng.random() < 0.2:
        body["speculative"] = rng.random() < 0.5
    if rng.random() < 0.5:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    return body


async def one(client: httpx.AsyncClient, rng: random.Random, model: str,
              disconnect_prob: float, bad_prob: float, hostile: dict | None = None) -> str:
    """One random request; returns an outcome label ('200', '400', 'disconnect', ...).
    `hostile` (solo greedy texts): some requests are hostile bodies, some greedy requests
    whose text must equal its solo run ('greedy-mismatch' otherwise)."""
    if hostile is not None and rng.random() < bad_prob:
        r = await client.post("/v1/completions", content=rng.choice(HOSTILE_BODIES),
                              headers={"Content-Type": "application/json"})
        return f"hostile-{r.status_code}" if r.status_code < 500 else str(r.status_code)
    if hostile is not None and rng.random() < 0.1:
        i = rng.randrange(len(hostile["texts"]))
        r = await client.post("/v1/completions", json=greedy_body(model, i))
        if r.status_code != 200:
            return str(r.status_code)
        same = r.json()["choices"][0]["text"] == hostile["texts"][i]
        return "greedy-equal" if same else "greedy-mismatch"
    if rng.random() < bad_prob:
        r = await client.post("/v1/completions", content=rng.choice(BAD_BODIES))
        return str(r.status_code)
    chat = rng.random() < 0.4
    body = random_body(rng, model, chat)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    leave = rng.random() < disconnect_prob
    if body.get("stream"):
        leave_after = rng.randint(0, 3)  # SSE events to read before hanging up
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return str(r.status_code)
            if leave and leave_after == 0:
                return "disconnect"
            seen = 0
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                seen += 1
                if line == "data: [DONE]":
                    return "200"
                if line.startswith('data: {"error"'):
                    return "stream-error"
                if leave and seen >= leave_after:
                    return "disconnect"
        return "truncated"
    if leave:
        try:
            await client.post(path, json=body, timeout=rng.uniform(0.001, 0.2))
        except httpx.TimeoutException:
            return "disconnect"
        return "200"
    r = await client.post(path, json=body)
    return str(r.status_code)


async def soak(base_url: str, *, num_requests: int, concurrency: int, time_limit: float,
               seed: int = 0, disconnect_prob: float = 0.1, bad_prob: float = 0.05,
               progress: bool = True, hostile: bool = False, flood_connections: int = 0,
               stall_prompts: int = 3, engine_pid: int | None = None) -> dict:
    """Drive a running server; returns counts by outcome and the end-state checks.
    `engine_pid`: the engine's process, counted in the RSS series with the server's."""
    if not base_url.startswith(("http://127.0.0.1", "http://localhost", "http://[::1]")):
        raise ValueError("the soak runs on loopback only (http://127.0.0.1:PORT)")
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + time_limit
    started = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=120) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        next_index = 0
        extra: dict = {}
        rss: list[tuple[float, float]] = []
        if hostile:
            extra["solo"] = {"texts": await solo_texts(client, model)}
            if flood_connections:
                extra["flood"] = await asyncio.to_thread(flood, base_url, flood_connections)
            if stall_prompts:
                extra["stall"] = await stall(client, model, stall_prompts)
            rss.append((0.0, rss_mb(engine_pid)))
            deadline = time.monotonic() + time_limit  # the probes are not the soak's time
        async def worker() -> None:
            nonlocal next_index
            wrng = random.Random(rng.random())
            while next_index < num_requests and time.monotonic() < deadline:
                next_index += 1
                try:
                    outcomes[await one(client, wrng, model, disconnect_prob, bad_prob,
                                       extra.get("solo"))] += 1
                except httpx.HTTPError as e:
                    outcomes[f"client-error:{type(e).__name__}"] += 1
                if hostile and time.monotonic() - started - rss[-1][0] > 30:
                    rss.append((time.monotonic() - started, rss_mb(engine_pid)))
                if progress and sum(outcomes.values()) % 250 == 0:
                    print(f"soak: {sum(outcomes.values())} requests, {dict(outcomes)}",
                          file=sys.stderr, flush=True)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
        kv = await _wait_idle(client, timeout=30.0)
        health = (await client.get("/health")).status_code
        metrics_5xx = await _count_5xx(client)
    server_errors = sum(v for k, v in outcomes.items() if k.startswith("5"))
    if hostile:
        rss.append((elapsed, rss_mb(engine_pid)))
        extra["rss_mb"] = [[round(t), round(m, 1)] for t, m in rss]
    ok_extra = not hostile or (
        outcomes.get("greedy-mismatch", 0) == 0
        and extra.get("flood", {}).get("health_ok", True)
        and extra.get("flood", {}).get("health_ms_max", 0) < 1000
        and extra.get("flood", {}).get("log_bytes", 0) < 1 << 20
        and extra.get("stall", {}).get("stream_gap_s_max", 0) < 0.5)
    return {**{k: v for k, v in extra.items() if k != "solo"},
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "model": model,
        "requests": sum(outcomes.values()), "elapsed_s": elapsed,
        "requests_per_s": sum(outcomes.values()) / elapsed, "outcomes": dict(outcomes),
        "server_5xx": server_errors, "metrics_5xx": metrics_5xx, "kv": kv,
        "health": health,
        "passed": ok_extra and server_errors == 0 and metrics_5xx == 0 and health == 200
        and kv["kv_slots_free"] + kv["kv_slots_cached"] == kv["kv_slots_total"]
        and not any(k.startswith(("client-error", "stream-error", "truncated")) for k in outcomes),
    }


async def _metrics(client: httpx.AsyncClient) -> list[tuple[str, float]]:
    text = (await client.get("/metrics")).text
    rows = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            rows.append((name, float(value)))
    return rows


async def _wait_idle(client: httpx.AsyncClient, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        rows = dict(await _metrics(client))
        kv = {k: int(rows.get(f"gearshift_{k}", -1))
              for k in ("kv_slots_free", "kv_slots_total", "kv_slots_cached")}
        kv["running"] = int(rows.get("gearshift_num_requests_running", -1))
        kv["waiting"] = int(rows.get("gearshift_num_requests_waiting", -1))
        idle = kv["running"] == 0 and kv["waiting"] == 0
        if (idle and kv["kv_slots_free"] + kv["kv_slots_cached"] == kv["kv_slots_total"]) or \
                time.monotonic() > deadline:
            return kv
        await asyncio.sleep(0.1)


async def _count_5xx(client: httpx.AsyncClient) -> int:
    return int(sum(v for name, v in await _metrics(client)
                   if name.startswith("gearshift_requests_total") and 'status="5' in name))


def add_args(p: argparse.ArgumentParser) -> None:
    from gearshift.engine_args import add_engine_args

    add_engine_args(p)  # the engine flags of `serve`; --seed also seeds the random requests
    p.set_defaults(device="cpu", max_num_seqs=32, kv_cache_tokens=16384)
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="the engine in a process of its own, as `serve` runs it (default)")
    p.add_argument("--num-requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--time-limit", type=float, default=540.0, help="seconds of load")
    p.add_argument("--hostile", action="store_true",
                   help="mix in hostile bodies and greedy checks; flood and stall probes first")
    p.add_argument("--flood-connections", type=int, default=20000,
                   help="--hostile: idle half-open connections of the flood probe (0: none)")
    p.add_argument("--stall-prompts", type=int, default=3,
                   help="--hostile: ~4 MB prompts sent beside a live stream (0: none)")
    p.add_argument("--disconnect-prob", type=float, default=0.1)
    p.add_argument("--bad-prob", type=float, default=0.05)
    p.add_argument("--output-json", default="soak.json")


def run(args: argparse.Namespace) -> int:
    if not args.time_limit > 0:
        raise SystemExit("error: --time-limit must be > 0 seconds")

    from gearshift.engine_args import engine_kwargs

    kwargs = engine_kwargs(args)  # checked before torch loads
    from gearshift.engine.engine import Engine
    from gearshift.frontend.async_engine import AsyncEngine
    from gearshift.llm import build_engine_config
    from gearshift.server.app import build_app
    from gearshift.server.background import BackgroundServer

    config = build_engine_config(**kwargs)
    if args.engine_process:
        from gearshift.frontend.engine_process import EngineProcess

        async_engine = AsyncEngine(EngineProcess(config))
    else:
        async_engine = AsyncEngine(Engine(config))
    # huge prompts need a body limit above their ~4 MB
    app = build_app(async_engine, max_body_bytes=8 << 20 if args.hostile else 4 << 20)
    with BackgroundServer(app) as srv:
        result = asyncio.run(soak(
            srv.base_url, num_requests=args.num_requests, concurrency=args.concurrency,
            time_limit=args.time_limit, seed=args.seed, disconnect_prob=args.disconnect_prob,
            bad_prob=args.bad_prob, hostile=args.hostile,
            flood_connections=args.flood_connections, stall_prompts=args.stall_prompts,
            engine_pid=async_engine.engine.process.pid if args.engine_process else None))
    result["config"] = {k: v for k, v in vars(args).items() if k != "func"}
    result["engine_stats"] = async_engine.snapshot.stats  # fresh: the engine is idle
    print(json.dumps({k: v for k, v in result.items() if k != "config"}, indent=1))
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=1)
    return 0 if result["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gearshift.bench.soak", description=__doc__)
    add_args(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
