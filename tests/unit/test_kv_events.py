"""KV-cache events: the prefix cache's paths as 16-token blocks (stored when a path first
covers a whole block, removed when eviction cuts into it, chained hashes equal to the
router's), and the ZMQ publisher's wire format read back by a subscriber."""

from __future__ import annotations

import time

import pytest

from gearshift.config import ConfigError
from gearshift.frontend.kv_events import (
    KVEventPublisher,
    KVEventRecorder,
    check_endpoint,
    replica_endpoint,
)
from gearshift.scheduler.block_hashes import block_hashes
from gearshift.scheduler.prefix_cache import PrefixCache

PATH = list(range(1000, 1064))  # 64 tokens: 4 blocks


def cache_with_events() -> tuple[PrefixCache, list]:
    events: list = []
    cache = PrefixCache()
    cache.listener = KVEventRecorder(events.append, "CPU")
    return cache, events


def test_whole_blocks_are_stored_once_with_their_parent():
    cache, events = cache_with_events()
    hashes = block_hashes(PATH)
    cache.insert(PATH[:40], list(range(40)), 0)  # blocks 0 and 1; 8 tokens of block 2
    assert events == [["BlockStored", hashes[:2], None, PATH[:32], 16, None, "CPU"]]
    cache.insert(PATH, list(range(64)), 0)  # extends the path: blocks 2 and 3
    assert events[1] == ["BlockStored", hashes[2:], hashes[1], PATH[32:], 16, None, "CPU"]
    cache.insert(PATH, list(range(64)), 0)  # nothing new
    assert len(events) == 2


def test_eviction_removes_the_blocks_it_cuts_leaf_first():
    cache, events = cache_with_events()
    hashes = block_hashes(PATH)
    cache.insert(PATH[:40], list(range(40)), 0)
    cache.insert(PATH, list(range(64)), 0)
    events.clear()
    cache.evict(1)  # the leaf PATH[40:64]: blocks 2 (32..48) and 3
    assert events == [["BlockRemoved", hashes[2:], "CPU"]]
    cache.clear()
    assert events[1] == ["BlockRemoved", hashes[:2], "CPU"]


def test_a_branch_keeps_the_shared_blocks():
    cache, events = cache_with_events()
    other = PATH[:32] + [7] * 32
    cache.insert(PATH, list(range(64)), 0)
    cache.insert(other, list(range(64, 128)), 0)
    stored = [h for e in events for h in e[1]]
    assert stored == block_hashes(PATH) + block_hashes(other)[2:]
    events.clear()
    cache.evict(1)
    assert len(events) == 1 and len(events[0][1]) == 2  # one branch's two blocks only
    assert set(events[0][1]).isdisjoint(block_hashes(PATH)[:2])


def test_endpoints_are_checked_and_numbered_per_replica():
    check_endpoint("tcp://*:5557")
    with pytest.raises(ConfigError, match="tcp://HOST:PORT"):
        check_endpoint("5557")
    assert replica_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert replica_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv-1"


def test_the_publisher_sends_sequenced_msgpack_batches():
    msgpack = pytest.importorskip("msgpack")
    zmq = pytest.importorskip("zmq")
    from gearshift.server.background import free_port

    port = free_port()
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(f"tcp://127.0.0.1:{port}")  # replica 3 of the endpoint below: port - 3 + 3
    pub = KVEventPublisher(f"tcp://127.0.0.1:{port - 3}", replica=3)
    try:
        time.sleep(0.3)  # the subscription reaches the publisher
        events = []
        pub.put(["BlockRemoved", [1, 2], "CPU"])
        deadline = time.monotonic() + 5
        seqs = []
        while not any(e[0] == "BlockRemoved" for e in events) and time.monotonic() < deadline:
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv-events"
            seqs.append(int.from_bytes(seq, "big"))
            ts, batch, replica = msgpack.unpackb(payload)
            assert replica == 3 and ts > 0
            events += batch
        assert ["BlockRemoved", [1, 2], "CPU"] in events
        assert seqs == sorted(seqs)
    finally:
        pub.close()
        sub.close()
