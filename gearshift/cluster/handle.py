"""The front end's handle on one replica's Ray actor, shaped like EngineProcess so that an
unchanged AsyncEngine drives it (post, start(sink), is_alive, shutdown; remote = True).

    AsyncEngine._post -> post() -> writer thread: actor.post(batch), one call at a time
    reader thread: actor.poll(POLL_S) -> sink.step_done / outputs / added / reset_done /
                   set_snapshot / failed (the same messages as engine_process.py's pipe)

When the actor dies (its process killed, its node lost) the pending poll raises; the
reader tells the sink, which fails that replica's requests with EngineDeadError naming the
replica; Ray restarts the actor and cluster/replicas.py gives it a fresh handle.

Data flow: cluster/launch.py -> ReplicaHandle(actor, info) -> AsyncEngine -> ReplicaSet.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

log = logging.getLogger("gearshift.cluster")

POLL_S = 0.5  # a poll's longest wait; any message answers it at once


class ReplicaHandle:
    remote = True  # AsyncEngine: post to it, do not step it

    def __init__(self, actor: Any, info: dict, index: int, tokenizer: Any, grammars: Any) -> None:
        self.actor, self.index = actor, index
        self.model_name: str = info["model_name"]
        self.max_model_len: int = info["max_model_len"]
        self.vocab_size: int = info["vocab_size"]
        self.pid: int = info["pid"]
        self.tokenizer = tokenizer
        self.grammars = grammars
        self.dead = False  # set by the reader when the actor or its engine is gone
        self.engine_failed = False  # the engine raised; the actor itself lives on
        self._closing = False
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write, daemon=True,
                                        name=f"gearshift-replica{index}-writer")
        self._reader: threading.Thread | None = None
        self._writer.start()

    def start(self, sink: Any) -> None:
        self._reader = threading.Thread(target=self._read, args=(sink,), daemon=True,
                                        name=f"gearshift-replica{self.index}-reader")
        self._reader.start()

    def post(self, item: tuple) -> None:
        self._outbox.put(item)

    def is_alive(self) -> bool:
        return not self.dead and self._reader is not None and self._reader.is_alive()

    def shutdown(self, timeout: float = 10.0) -> None:
        import ray

        self._closing = True
        self._outbox.put(None)
        self._writer.join(timeout)
        if not self.dead:  # a restarted actor is another engine: leave it running
            try:
                ray.get(self.actor.stop.remote(timeout), timeout=timeout + 5)
            except Exception:  # noqa: BLE001 - gone already, or stuck: Ray kills it with us
                pass
        if self._reader is not None:
            self._reader.join(timeout)

    def _write(self) -> None:
        import ray

        while True:
            item = self._outbox.get()
            if item is None:
                return
            batch = [item]
            while True:  # what queued meanwhile goes in the same call
                try:
                    nxt = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._outbox.put(None)
                    break
                batch.append(nxt)
            try:
                ray.get(self.actor.post.remote(batch))
            except Exception:  # noqa: BLE001 - the actor is gone: the reader reports it
                pass

    def _read(self, sink: Any) -> None:
        import ray

        from gearshift.frontend.async_engine import EngineDeadError

        handlers = {"step": lambda p: sink.step_done(*p), "out": sink.outputs,
                    "snap": sink.set_snapshot,
                    "added": lambda p: sink.added(*p), "reset": lambda p: sink.reset_done(*p)}
        while not self._closing:
            try:
                messages = ray.get(self.actor.poll.remote(POLL_S))
            except Exception as exc:  # noqa: BLE001 - RayActorError and kin: the actor died
                if self._closing:
                    return
                self.dead = True
                log.error("replica %d (pid %d) died: %s", self.index, self.pid,
                          type(exc).__name__)
                sink.failed(EngineDeadError(
                    f"replica {self.index} died ({type(exc).__name__}); its requests are "
                    f"lost, the other replicas serve on"))
                return
            for kind, payload in messages:
                if kind == "failed":
                    self.dead = self.engine_failed = True
                    sink.failed(payload)
                    return
                handlers[kind](payload)
