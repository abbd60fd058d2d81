"""Replicas on Ray (a local Ray instance, the default model, CPU): two replicas behind one
OpenAI endpoint serve a burst with two long shared prefixes, both serve, repeats of a
prefix land on the replica that cached it (cached_tokens), greedy text equals one engine's,
/metrics has per-replica series; a replica whose actor is killed mid-burst fails its own
requests with a clear 503 while the next requests succeed, and Ray brings it back; tensor
parallelism with its two ranks placed by Ray (gloo) equals one rank, and a killed rank
fails its replica, which Ray restarts whole.

Data flow (tests only): start_replicas (cluster/launch.py) -> ReplicaSet -> build_app ->
uvicorn in a thread -> openai / httpx clients; LLM.generate for the texts to compare with.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'gearshift[ray]')")

from gearshift.cluster.launch import connect_ray, start_replicas  # noqa: E402
from gearshift.llm import LLM, build_engine_config  # noqa: E402
from gearshift.request import SamplingParams  # noqa: E402
from gearshift.server.app import build_app  # noqa: E402
from gearshift.server.background import BackgroundServer, free_port  # noqa: E402

pytestmark = pytest.mark.timeout(300)

OPTIONS = dict(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=8,
               kv_cache_tokens=4096, max_num_batched_tokens=512)
PREFIX_A = ("You are a careful assistant for a small library. Answer every question about "
            "opening hours, loans and late fees in one short sentence. Question: ")
PREFIX_B = ("The following is a story about a fox and a crow who meet in a quiet forest near "
            "a river at dawn, told for children. Chapter: ")
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def cluster():
    connect_ray(num_cpus=4)  # logical CPUs: one per replica or rank, not threads
    yield
    ray.shutdown()


KV_PORT = free_port()  # replica i publishes its KV-cache events at KV_PORT + i


@pytest.fixture(scope="module")
def served(cluster):
    replicas = start_replicas(build_engine_config(None, **OPTIONS), 2, start_timeout=240,
                              kv_events=f"tcp://127.0.0.1:{KV_PORT}")
    with BackgroundServer(build_app(replicas)) as srv:
        yield srv, replicas


@pytest.fixture(scope="module")
def offline():
    return LLM(None, **OPTIONS)


def _client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0,
                         timeout=120)


def _complete(client, prompt: str, max_tokens: int = MAX_TOKENS, **extra):
    return client.completions.create(model=client.models.list().data[0].id, prompt=prompt,
                                     max_tokens=max_tokens, temperature=0, **extra)


def _metrics(srv) -> dict[str, float]:
    out = {}
    for line in httpx.get(srv.base_url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_two_prefixes_stick_to_their_replicas_and_equal_one_engine(served, offline):
    srv, replicas = served
    client = _client(srv)
    prompts = [p + q for q in ("when do you open?", "how long is a loan?", "what if I am late?",
                               "can I renew online?") for p in (PREFIX_A, PREFIX_B)]
    want = [o.text for o in offline.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS,
                                                                     temperature=0.0),
                                             use_tqdm=False)]
    with ThreadPoolExecutor(8) as pool:
        first = list(pool.map(lambda p: _complete(client, p), prompts[:2]))  # A and B at once
        burst = list(pool.map(lambda p: _complete(client, p), prompts[2:]))
    got = [r.choices[0].text for r in first + burst]
    assert got == want
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in burst]
    prefix_tokens = min(len(offline.engine.tokenizer.encode(p)) for p in (PREFIX_A, PREFIX_B))
    assert min(cached) >= prefix_tokens - 8, cached  # each repeat found its prefix cached
    routed = replicas.routed
    assert routed[(0, "load")] + routed[(0, "prefix")] >= 1
    assert routed[(1, "load")] + routed[(1, "prefix")] >= 1
    assert routed[(0, "prefix")] + routed[(1, "prefix")] == len(burst)
    m = _metrics(srv)
    for i in (0, 1):
        assert m[f'gearshift_replica_up{{replica="{i}"}}'] == 1
        assert m[f'gearshift_replica_kv_slots_total{{replica="{i}"}}'] == 4096
        assert m[f'gearshift_replica_prefix_cache_hit_rate{{replica="{i}"}}'] > 0.3
    assert m["gearshift_kv_slots_total"] == 2 * 4096
    assert m["vllm:num_requests_running"] == 0
    assert m['gearshift_router_requests_total{reason="prefix",replica="0"}'] >= 1


def test_each_replica_publishes_its_kv_events(served):
    msgpack = pytest.importorskip("msgpack")
    zmq = pytest.importorskip("zmq")
    srv, replicas = served
    subs = []
    for i in (0, 1):
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
        sub.setsockopt(zmq.RCVTIMEO, 200)
        sub.connect(f"tcp://127.0.0.1:{KV_PORT + i}")
        subs.append(sub)
    try:
        time.sleep(0.5)  # the subscriptions reach the publishers
        before = dict(replicas.routed)
        _complete(_client(srv), "A brand new prefix that no replica has seen so far, long "
                                "enough to fill two blocks of sixteen tokens each.")
        target = next(i for i in (0, 1) if replicas.routed[(i, "load")] > before[(i, "load")])
        deadline = time.monotonic() + 30
        stored = []
        while not stored:
            assert time.monotonic() < deadline, "no BlockStored from the replica that served"
            try:
                _, _, payload = subs[target].recv_multipart()
            except zmq.Again:
                continue
            _, events, replica = msgpack.unpackb(payload)
            assert replica == target
            stored = [e for e in events if e[0] == "BlockStored"]
        assert stored[0][4] == 16 and len(stored[0][1]) >= 2
    finally:
        for sub in subs:
            sub.close()


def test_a_killed_replica_fails_its_requests_and_the_rest_serve(served):
    srv, replicas = served
    client = _client(srv)
    victim = replicas.replicas[1]
    pid = victim.engine.engine.pid
    long = dict(max_tokens=200, extra_body={"ignore_eos": True})
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_complete, client, f"{i} tell me about rivers number {i}", **long)
                   for i in range(4)]
        deadline = time.monotonic() + 60
        while victim.engine.num_live_streams == 0 or victim.engine.num_running == 0:
            assert time.monotonic() < deadline, "no request reached replica 1"
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        outcomes = []
        for f in futures:
            try:
                outcomes.append(len(f.result(timeout=120).choices[0].text) > 0)
            except openai.APIStatusError as e:
                assert e.status_code == 503, e
                assert "replica 1 died" in str(e), e
                outcomes.append(False)
    assert any(outcomes) and not all(outcomes), outcomes  # replica 0's finished, 1's failed
    after = [_complete(client, f"and then number {i}") for i in range(3)]
    assert all(r.choices[0].finish_reason in ("length", "stop") for r in after)
    deadline = time.monotonic() + 120
    while not (victim.engine.is_alive and victim.restarts == 1):
        assert time.monotonic() < deadline, "replica 1 did not come back"
        time.sleep(0.2)
    assert victim.engine.engine.pid != pid
    m = _metrics(srv)
    assert m['gearshift_replica_up{replica="1"}'] == 1
    assert m['gearshift_replica_restarts{replica="1"}'] == 1
    with ThreadPoolExecutor(4) as pool:  # both replicas take requests again
        list(pool.map(lambda i: _complete(client, f"once more {i} " * 3), range(4)))
    assert replicas.routed[(1, "load")] + replicas.routed[(1, "prefix")] >= 2


def test_tensor_parallel_ranks_placed_by_ray_equal_one_rank(cluster, offline):
    config = build_engine_config(None, **{**OPTIONS, "tensor_parallel_size": 2})
    replicas = start_replicas(config, 1, start_timeout=240)
    prompts = [PREFIX_A + "is it open on sunday?", PREFIX_B + "one", "hello world"]
    want = [o.text for o in offline.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS,
                                                                     temperature=0.0),
                                             use_tqdm=False)]
    with BackgroundServer(build_app(replicas)) as srv:
        client = _client(srv)
        got = [_complete(client, p).choices[0].text for p in prompts]
        m = _metrics(srv)
        assert got == want
        assert m["gearshift_tensor_parallel_size"] == 2
        # rank 1 dies: the replica fails (503, no hang) and Ray restarts it, ranks and all
        replica = replicas.replicas[0]
        (rank1,) = ray.get(replica.actor.rank_pids.remote())
        os.kill(rank1, signal.SIGKILL)
        with pytest.raises(openai.APIStatusError) as failed:
            _complete(client, prompts[0])
        assert failed.value.status_code == 503
        deadline = time.monotonic() + 120
        while not (replica.engine.is_alive and replica.restarts == 1):
            assert time.monotonic() < deadline, "the replica did not come back"
            time.sleep(0.2)
        assert _complete(client, prompts[0]).choices[0].text == want[0]
        assert ray.get(replica.actor.rank_pids.remote()) != [rank1]
