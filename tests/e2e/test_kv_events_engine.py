"""The KV-event stream of a real engine (the default model, CPU): a finished request's
committed tokens arrive as BlockStored with the router's chained hashes of its prompt
blocks, a prefix-cache reset as BlockRemoved of the same hashes; and `gearshift serve
--kv-events` publishes from its engine process.

Data flow (tests only): LLM / `serve --kv-events` -> PrefixCache listener -> ZMQ PUB ->
a SUB socket here -> msgpack batches.
"""

from __future__ import annotations

import time

import openai
import pytest
from served_process import serve_process

msgpack = pytest.importorskip("msgpack")
zmq = pytest.importorskip("zmq")

from gearshift import LLM, SamplingParams  # noqa: E402
from gearshift.cluster.router import block_hashes  # noqa: E402
from gearshift.frontend.kv_events import attach_publisher  # noqa: E402
from gearshift.models.default import default_target_dir  # noqa: E402
from gearshift.server.background import free_port  # noqa: E402

PROMPT = ("The library opens at nine in the morning and closes at six in the evening on "
          "weekdays; on saturdays it closes at noon. Loans last three weeks.")


def subscriber(port: int):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    sub.setsockopt(zmq.RCVTIMEO, 200)
    sub.connect(f"tcp://127.0.0.1:{port}")
    return sub


def events_until(sub, done, timeout: float = 30.0) -> list:
    events: list = []
    deadline = time.monotonic() + timeout
    while not done(events):
        assert time.monotonic() < deadline, events
        try:
            _, _, payload = sub.recv_multipart()
        except zmq.Again:
            continue
        events += msgpack.unpackb(payload)[1]
    return events


def test_an_engines_cache_blocks_are_published():
    llm = LLM(None, device="cpu", kv_cache_tokens=2048, max_num_seqs=4)
    port = free_port()
    sub = subscriber(port)
    publisher = attach_publisher(llm.engine, f"tcp://127.0.0.1:{port}")
    try:
        time.sleep(0.3)  # the subscription reaches the publisher
        prompt_ids = llm.engine.tokenizer.encode(PROMPT)
        assert len(prompt_ids) >= 32
        llm.generate([PROMPT], SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
        stored = events_until(sub, lambda ev: any(e[0] == "BlockStored" for e in ev))
        block = next(e for e in stored if e[0] == "BlockStored")
        want = block_hashes(prompt_ids)
        assert block[1][:len(want)] == want and block[2] is None
        assert block[3][:len(prompt_ids) // 16 * 16] == prompt_ids[:len(prompt_ids) // 16 * 16]
        assert block[4] == 16 and block[6] == "CPU"
        llm.engine.reset_prefix_cache()
        removed = events_until(sub, lambda ev: any(e[0] == "BlockRemoved" for e in ev))
        gone = {h for e in removed if e[0] == "BlockRemoved" for h in e[1]}
        assert gone == set(block[1])
    finally:
        publisher.close()
        sub.close()


def test_serve_publishes_from_its_engine_process():
    port = free_port()
    sub = subscriber(port)
    try:
        with serve_process(default_target_dir(), "--kv-events", f"tcp://127.0.0.1:{port}") \
                as (base, _):
            client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
            model = client.models.list().data[0].id
            client.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0)
            events = events_until(sub, lambda ev: any(e[0] == "BlockStored" for e in ev))
        assert any(e[0] == "BlockStored" and e[4] == 16 for e in events)
    finally:
        sub.close()
