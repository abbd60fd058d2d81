"""The step loop around an Engine: apply what the inbox holds (adds, aborts, a prefix-cache
reset), step while requests are unfinished, and hand each step's outputs and a snapshot of
the engine's counters to a sink. AsyncEngine runs it on a thread beside the event loop
(in-process engines, tests); engine_process.py runs it in a process of its own (the server).

Inbox items (tuples):  ("add", request_id, prompt_token_ids, params, key)
                       ("abort", request_id, reason)
                       ("reset_prefix_cache", key)
Sink calls:            added(key, exc | None), reset_done(key, slots freed),
                       step_done(outputs, EngineSnapshot) after each step,
                       outputs(list[StepOutput]) a step hands out before it ends,
                       set_snapshot(EngineSnapshot) between steps, failed(exc)

`key` is the caller's handle on the answer (an id AsyncEngine maps to its future).
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any

# Engine.stats() walks every counter (~0.1 ms); a metrics scrape needs it no fresher than
# this, and a step that finishes a request or leaves the engine idle refreshes it at once
STATS_EVERY_S = 0.05


@dataclass(slots=True)
class EngineSnapshot:
    """Counters read on the engine's side after each step; safe to read from any thread."""

    num_running: int = 0
    num_waiting: int = 0
    memory: dict = field(default_factory=dict)  # kv_slots_total / kv_slots_free / kv_slots_cached
    stats: dict = field(default_factory=dict)  # Engine.stats()
    time: float = 0.0
    adds_taken: int = 0  # adds the engine's side had taken from the inbox at this snapshot


class ThreadInbox:
    """The inbox of an engine loop on a thread: a deque the event loop appends to."""

    def __init__(self) -> None:
        self._items: collections.deque[tuple] = collections.deque()
        self._wake = threading.Event()
        self.stopped = False

    def put(self, item: tuple) -> None:
        self._items.append(item)
        self._wake.set()

    def stop(self) -> None:
        self.stopped = True
        self._wake.set()

    def take(self) -> list[tuple]:
        self._wake.clear()
        items = []
        while self._items:
            items.append(self._items.popleft())
        return items

    def wait(self, timeout: float) -> None:
        self._wake.wait(timeout)


class EngineLoop:
    def __init__(self, engine: Any, sink: Any) -> None:
        self.engine, self.sink = engine, sink
        self.adds_taken = 0
        self._stats: dict = {}
        self._stats_at = float("-inf")

    def run(self, inbox: Any) -> None:
        """Until the inbox stops; an exception in the engine goes to sink.failed. The caller
        publishes the first snapshot (before any request reaches the loop)."""
        engine = self.engine
        try:
            while not inbox.stopped:
                if self._apply(inbox.take()):
                    self.publish()
                if inbox.stopped:
                    break
                if engine.has_unfinished_requests():
                    started = time.perf_counter()
                    outputs = engine.step(emit=self.sink.outputs)
                    self.sink.step_done(outputs, self.snapshot(
                        fresh=any(o.finished for o in outputs)
                        or not engine.has_unfinished_requests()))
                    if not outputs and time.perf_counter() - started < 1e-3:
                        # Nothing could run (e.g. every request waits for KV slots): do not
                        # spin; a new request or an abort wakes us at once.
                        inbox.wait(1e-3)
                else:
                    inbox.wait(1.0)
        except BaseException as exc:  # noqa: BLE001 - reported to every waiting client
            self.sink.failed(exc)

    def _apply(self, items: list[tuple]) -> bool:
        engine = self.engine
        for item in items:
            if item[0] == "add":
                self.adds_taken += 1
                _, request_id, prompt_token_ids, params, key = item
                exc: BaseException | None = None
                try:
                    engine.add_request(request_id, prompt_token_ids, params)
                except Exception as e:  # PromptError and friends go back to the caller
                    exc = e
                self.sink.added(key, exc)
            elif item[0] == "reset_prefix_cache":
                freed = engine.reset_prefix_cache()
                self.publish()  # first: whoever hears of the reset sees the slots freed
                self.sink.reset_done(item[1], freed)
            else:
                _, request_id, reason = item
                engine.abort_request(request_id, reason)
        return bool(items)

    def publish(self) -> None:
        """A fresh snapshot to the sink (start-up, requests added or aborted)."""
        self.sink.set_snapshot(self.snapshot(fresh=True))

    def snapshot(self, fresh: bool) -> EngineSnapshot:
        """The engine's counters now; its stats at most STATS_EVERY_S old unless `fresh`."""
        engine = self.engine
        now = time.monotonic()
        if fresh or now - self._stats_at >= STATS_EVERY_S:
            self._stats, self._stats_at = dict(engine.stats()), now
        return EngineSnapshot(
            num_running=engine.num_running(), num_waiting=engine.num_waiting(),
            memory=dict(engine.memory_stats()), stats=self._stats, time=now,
            adds_taken=self.adds_taken)
