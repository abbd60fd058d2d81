"""KV-cache events over ZMQ, for routers that track where prefixes are cached (llm-d's KV
cache manager, NVIDIA Dynamo's KV router): which blocks an engine stored and removed.

Our prefix cache is token-granular (a radix tree over single slots); the events speak of
BLOCK_TOKENS-token blocks aligned at the prompt's start, so a block exists while the tree
holds a path through all of its tokens. A block's hash chains its parent's (the same 64-bit
hash as cluster/router.py), so equal prefixes have equal hashes on every replica.

    PrefixCache.insert (a new leaf) ──► KVEventRecorder.stored(path) ─► BlockStored
    PrefixCache.evict (each leaf)   ──► KVEventRecorder.removed(path, n) ─► BlockRemoved
    the publisher starting          ──► AllBlocksCleared (a new or restarted engine:
                                          subscribers drop what they knew of it)
                                          │ queue ─► publisher thread ─► ZMQ PUB

Wire format (modelled on the layout vLLM publishes; msgpack): a multipart message
[topic b"kv-events", sequence number (8 bytes, big-endian), payload], where payload is
[timestamp, [event, ...], replica index] and an event is one of
    ["BlockStored", block_hashes, parent_block_hash | None, token_ids, block_size, None, medium]
    ["BlockRemoved", block_hashes, medium]
    ["AllBlocksCleared"]
with medium "GPU" or "CPU" (the device the engine's KV lives on).

Data flow: `serve --kv-events ENDPOINT` -> attach_publisher(engine, endpoint) -> subscribers.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from typing import Any

from gearshift.config import ConfigError
from gearshift.scheduler.block_hashes import BLOCK_TOKENS, block_hashes

log = logging.getLogger("gearshift.cluster")

TOPIC = b"kv-events"
_ENDPOINT = re.compile(r"^(tcp)://([^:/]+):(\d+)$|^(ipc|inproc)://(.+)$")


def check_endpoint(endpoint: str) -> None:
    """A clear error for an endpoint ZMQ would reject, or for a missing pyzmq."""
    if not _ENDPOINT.match(endpoint):
        raise ConfigError(f"--kv-events {endpoint!r}: expected tcp://HOST:PORT (e.g. "
                          "tcp://*:5557) or ipc://PATH")
    try:
        import msgpack  # noqa: F401
        import zmq  # noqa: F401
    except ImportError:
        raise ConfigError("--kv-events needs pyzmq and msgpack: pip install "
                          "'gearshift[ray]'") from None


def replica_endpoint(endpoint: str, replica: int) -> str:
    """Replica i publishes at port + i (tcp), or PATH-i (ipc)."""
    m = _ENDPOINT.match(endpoint)
    if m is None:
        raise ConfigError(f"bad KV-event endpoint {endpoint!r}")
    if m.group(1):
        return f"tcp://{m.group(2)}:{int(m.group(3)) + replica}"
    return endpoint if replica == 0 else f"{endpoint}-{replica}"


class KVEventRecorder:
    """The prefix cache's listener: the tree's changes as block events, onto `sink`."""

    def __init__(self, sink: Any, medium: str, block_tokens: int = BLOCK_TOKENS) -> None:
        self.sink, self.medium, self.block_tokens = sink, medium, block_tokens
        self.blocks: set[int] = set()  # hashes of the blocks the tree holds whole

    def stored(self, path: list[int]) -> None:
        hashes = block_hashes(path, self.block_tokens)
        new = [b for b, h in enumerate(hashes) if h not in self.blocks]
        if not new:
            return
        self.blocks.update(hashes[b] for b in new)
        first, bt = new[0], self.block_tokens
        self.sink(["BlockStored", [hashes[b] for b in new], hashes[first - 1] if first else None,
                   list(path[first * bt:(new[-1] + 1) * bt]), bt, None, self.medium])

    def removed(self, path: list[int], num_removed: int) -> None:
        """The last `num_removed` tokens of `path` left the tree: every block they cut."""
        start = len(path) - num_removed
        gone = [h for b, h in enumerate(block_hashes(path, self.block_tokens))
                if (b + 1) * self.block_tokens > start and h in self.blocks]
        if gone:
            self.blocks.difference_update(gone)
            self.sink(["BlockRemoved", gone, self.medium])


class KVEventPublisher:
    """A ZMQ PUB socket fed from the engine thread through a queue (never blocks a step)."""

    def __init__(self, endpoint: str, replica: int = 0, batch_s: float = 0.01) -> None:
        import zmq

        self.replica, self.batch_s = replica, batch_s
        self._ctx = zmq.Context.instance()
        self._socket = self._ctx.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self.endpoint = replica_endpoint(endpoint, replica)
        self._socket.bind(self.endpoint)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._seq = 0
        self.put(["AllBlocksCleared"])
        self._thread = threading.Thread(target=self._run, name="gearshift-kv-events",
                                        daemon=True)
        self._thread.start()

    def put(self, event: list) -> None:
        self._queue.put(event)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(5)

    def _run(self) -> None:
        import msgpack

        done = False
        while not done:
            event = self._queue.get()
            events = []
            deadline = time.monotonic() + self.batch_s
            while event is not None:
                events.append(event)
                try:
                    event = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
            done = event is None
            if events:
                payload = msgpack.packb([time.time(), events, self.replica])
                self._socket.send_multipart([TOPIC, self._seq.to_bytes(8, "big"), payload])
                self._seq += 1
        self._socket.close()


def attach_publisher(engine: Any, endpoint: str, replica: int = 0) -> KVEventPublisher:
    """Publish `engine`'s prefix-cache events at `endpoint` (replica i: port + i)."""
    cache = engine.slots.cache
    if cache is None:
        raise ConfigError("--kv-events needs the prefix cache (drop --no-enable-prefix-caching)")
    publisher = KVEventPublisher(endpoint, replica)
    medium = "GPU" if str(engine.config.device).startswith("cuda") else "CPU"
    cache.listener = KVEventRecorder(publisher.put, medium)
    log.info("KV-cache events of replica %d at %s", replica, publisher.endpoint)
    return publisher
