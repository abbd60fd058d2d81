"""ReplicaSet without Ray (fake engines on threads): requests sharing a prefix stay on one
replica, other prompts spread, aborts reach the replica holding the request, a replica
whose engine fails ends only its own requests (503) while the other serves, it comes back
through make_engine and takes requests again, and the server is told only when every
replica is gone.

Data flow (tests only): httpx -> app -> ReplicaSet -> AsyncEngine(FakeEngine) per replica.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from fake_engine import FakeEngine

from gearshift.cluster.replicas import Replica, ReplicaSet
from gearshift.cluster.router import PrefixRouter
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer

PREFIX = "a shared system prompt that is longer than two blocks of sixteen bytes: "


def replica_set(restart: bool = True, step_delay: float = 0.002) -> ReplicaSet:
    async def make_engine(replica: Replica, deadline: float) -> AsyncEngine:
        await asyncio.sleep(0.05)  # an actor restarting
        return AsyncEngine(FakeEngine(step_delay=step_delay))

    replicas = [Replica(i, None, AsyncEngine(FakeEngine(step_delay=step_delay)))
                for i in range(2)]
    return ReplicaSet(replicas, router=PrefixRouter(2),
                      make_engine=make_engine if restart else None)


def complete(c: httpx.Client, prompt: str, max_tokens: int = 4) -> httpx.Response:
    return c.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens})


def fake(rs: ReplicaSet, i: int) -> FakeEngine:
    return rs.replicas[i].engine.engine


def test_a_prefix_stays_on_its_replica_and_other_prompts_spread():
    rs = replica_set()
    with BackgroundServer(build_app(rs)) as srv, httpx.Client(base_url=srv.base_url) as c:
        for q in ("one", "two", "three"):
            assert complete(c, PREFIX + q).status_code == 200
        assert complete(c, "something else entirely, long enough to hash").status_code == 200
        seen = [set(fake(rs, i).params_seen) for i in (0, 1)]
        metrics = c.get("/metrics").text
    assert sorted(len(s) for s in seen) == [1, 3]
    steps = [fake(rs, i).stats()["steps"] for i in (0, 1)]
    assert f'gearshift_engine_stat{{name="steps"}} {float(sum(steps))}' in metrics
    assert rs.routed[(0, "prefix")] + rs.routed[(1, "prefix")] == 2
    assert 'gearshift_replica_up{replica="1"} 1.0' in metrics
    assert "gearshift_router_requests_total" in metrics


def test_abort_reaches_the_replica_holding_the_request():
    rs = replica_set(step_delay=0.02)
    with BackgroundServer(build_app(rs)) as srv, httpx.Client(base_url=srv.base_url) as c:
        for prompt in (PREFIX + "x", "another prompt entirely, long enough to hash"):
            with c.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 100,
                                                           "stream": True}) as r:
                next(r.iter_lines())  # a first chunk, then the client goes away
        deadline = time.monotonic() + 5
        while sum(len(fake(rs, i).aborted) for i in (0, 1)) < 2:
            assert time.monotonic() < deadline, ([fake(rs, i).aborted for i in (0, 1)],
                                                 [fake(rs, i).params_seen.keys() for i in (0, 1)])
            time.sleep(0.01)
    assert [len(fake(rs, i).aborted) for i in (0, 1)] == [1, 1]


def test_a_failed_replica_fails_its_own_requests_and_comes_back():
    rs = replica_set(step_delay=0.01)
    with BackgroundServer(build_app(rs)) as srv, httpx.Client(base_url=srv.base_url,
                                                             timeout=30) as c:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(complete, c, p, 150) for p in
                       (PREFIX + "a", "a different prompt that goes to the other replica")]
            while not all(fake(rs, i).running for i in (0, 1)):
                time.sleep(0.005)
            victim = rs.replicas[1]
            fake(rs, 1).fail_next_step = RuntimeError("device lost")
            responses = [f.result() for f in futures]
        codes = sorted(r.status_code for r in responses)
        assert codes == [200, 503], [r.text for r in responses]
        failed = next(r for r in responses if r.status_code == 503)
        assert "device lost" in failed.json()["error"]["message"]
        assert complete(c, "right after the failure").status_code == 200
        deadline = time.monotonic() + 5
        while victim.restarts < 1 or not victim.engine.is_alive:
            assert time.monotonic() < deadline, "the replica did not come back"
            time.sleep(0.01)
        assert c.get("/health").status_code == 200
        before = len(fake(rs, 1).params_seen)
        for i in range(4):
            assert complete(c, f"fresh prompt number {i} long enough to hash").status_code == 200
        assert len(fake(rs, 1).params_seen) > before
        assert 'gearshift_replica_restarts{replica="1"} 1.0' in c.get("/metrics").text


def test_the_server_hears_only_when_every_replica_is_gone():
    rs = replica_set(restart=False)
    deaths = []
    with BackgroundServer(build_app(rs)) as srv, httpx.Client(base_url=srv.base_url) as c:
        rs.on_death = deaths.append
        assert complete(c, "warm up both replicas, long enough to hash").status_code == 200
        fake(rs, 0).fail_next_step = RuntimeError("first")
        fake(rs, 1).fail_next_step = RuntimeError("second")
        assert complete(c, PREFIX + "1").status_code == 503
        time.sleep(0.1)
        assert not deaths and c.get("/health").status_code == 200  # one replica left
        assert complete(c, PREFIX + "2").status_code == 503
        deadline = time.monotonic() + 5
        while not deaths:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert c.get("/health").status_code == 503
        assert complete(c, "anyone?").status_code == 503
