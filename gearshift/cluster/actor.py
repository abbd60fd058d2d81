"""One engine replica in a Ray actor: the same step loop the server runs in its engine
process (frontend/engine_loop.py), with Ray calls where that process has pipes.

    front end (ReplicaHandle)                   ReplicaActor (a Ray worker process)
    -------------------------                   -----------------------------------
    writer thread: post(batch) ─────────────►   ThreadInbox ─► EngineLoop on a thread
    reader thread: poll(timeout) ◄── messages   _Outbox (the loop's sink): ("added" |
                                                "reset" | "out" | "step" | "snap" |
                                                "failed", payload), as engine_process.py

The writer waits for each post before the next, so the inbox sees the front end's order.
With tensor_parallel_size T > 1 this actor is rank 0 (cluster/tensor_parallel.py starts
ranks 1..T-1 as actors in the replica's placement group).

Data flow: cluster/launch.py creates the actor -> ReplicaHandle drives it -> AsyncEngine.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from typing import Any

from gearshift.config import EngineConfig
from gearshift.frontend.engine_process import _portable

log = logging.getLogger("gearshift.cluster")


class _Outbox:
    """The engine loop's sink: messages kept until the front end polls them."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._ready = threading.Condition()

    def put(self, kind: str, payload: Any) -> None:
        with self._ready:
            self._items.append((kind, payload))
            self._ready.notify_all()

    def take(self, timeout: float) -> list[tuple]:
        with self._ready:
            if not self._items:
                self._ready.wait(timeout)
            items = list(self._items)
            self._items.clear()
            return items

    # EngineLoop's sink calls
    def added(self, key: int, exc: BaseException | None) -> None:
        self.put("added", (key, _portable(exc)))

    def reset_done(self, key: int, freed: int) -> None:
        self.put("reset", (key, freed))

    def outputs(self, outputs: list) -> None:
        self.put("out", outputs)

    def step_done(self, outputs: list, snapshot) -> None:
        self.put("step", (outputs, snapshot))

    def set_snapshot(self, snapshot) -> None:
        self.put("snap", snapshot)

    def failed(self, exc: BaseException) -> None:
        log.error("engine failed", exc_info=exc)
        self.put("failed", _portable(exc))


class ReplicaActor:
    """The body of a replica's Ray actor (wrapped by ray.remote in cluster/launch.py)."""

    def __init__(self, config: EngineConfig, index: int, placement_group: Any = None,
                 kv_events: str | None = None, log_level: int = logging.WARNING) -> None:
        from gearshift import logs
        from gearshift.frontend.engine_loop import EngineLoop, ThreadInbox

        logs.configure_default()
        logging.getLogger("gearshift").setLevel(log_level)
        self.index = index
        if config.tensor_parallel_size > 1:
            from gearshift.cluster.tensor_parallel import start_leader

            self.engine = start_leader(config, placement_group)
        else:
            from gearshift.engine.engine import Engine

            self.engine = Engine(config)
        self.publisher = None
        if kv_events is not None:
            from gearshift.frontend.kv_events import attach_publisher

            self.publisher = attach_publisher(self.engine, kv_events, replica=index)
        self._outbox = _Outbox()
        self._inbox = ThreadInbox()
        self._loop = EngineLoop(self.engine, self._outbox)
        self._loop.publish()
        self._thread = threading.Thread(target=self._loop.run, args=(self._inbox,),
                                        name="gearshift-engine", daemon=True)
        self._thread.start()

    def info(self) -> dict:
        import ray

        engine = self.engine
        return {"model_name": engine.model_name, "max_model_len": engine.max_model_len,
                "vocab_size": engine.vocab_size, "eos_token_ids": list(engine.eos_token_ids),
                "pid": os.getpid(), "node_ip": ray.util.get_node_ip_address(),
                "kv_slots_total": engine.memory_stats().get("kv_slots_total", 0)}

    def rank_pids(self) -> list[int]:
        """The processes of tensor-parallel ranks 1..T-1 (none at T = 1)."""
        return list(getattr(self.engine, "rank_pids", []))

    def post(self, items: list[tuple]) -> None:
        for item in items:
            self._inbox.put(item)

    def poll(self, timeout: float) -> list[tuple]:
        """The loop's messages since the last poll; waits up to `timeout` s for one."""
        return self._outbox.take(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        self._inbox.stop()
        self._thread.join(timeout)
        trace = getattr(getattr(self.engine, "step_stats", None), "trace", None)
        if trace is not None:  # --step-trace: the last lines
            trace.flush()
        if self.publisher is not None:
            self.publisher.close()
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown(timeout)
