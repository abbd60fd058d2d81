"""The engine beside the event loop: its step loop (engine_loop.py) runs on a background
thread, or, given an EngineProcess (the server's default), in a process of its own; the
asyncio side submits requests and reads their tokens through queues.

Data flow:

    event loop (server)                         engine thread or process (owns Engine)
    -------------------                         --------------------------------------
    add_request() --("add", ...)--> inbox --->  EngineLoop: engine.add_request / abort_request
    abort()       --("abort", id)-> inbox       engine.step() -> list[StepOutput] --+
                                                                                    |
                                   output thread: OutputProcessor.process  <--------+
                                   (detokenise, stop strings: off the loop and off
                                   the engine's step loop)
    _deliver() <--- call_soon_threadsafe --------+
      -> RequestStream queue (one per request) -> handler
      stop hit -> ("abort", id, "stop") -> inbox

The Engine is not thread-safe: only the loop's thread touches it. The OutputProcessor is
shared by the output thread and the event loop (add, final) under one lock; the streams
live on the event loop only. AsyncEngine is the loop's sink (added, reset_done, step_done,
outputs, set_snapshot, failed): called on the engine thread, or on the process's reader thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from gearshift.frontend.engine_loop import EngineLoop, EngineSnapshot, ThreadInbox

__all__ = ["AsyncEngine", "EngineDeadError", "EngineSnapshot", "RequestFailedError",
           "RequestStream", "StreamFailure"]

logger = logging.getLogger("gearshift.async_engine")


class EngineDeadError(RuntimeError):
    """The engine thread stopped (an exception in step, or shutdown); no request can proceed."""


class RequestFailedError(RuntimeError):
    """Processing this one request failed in the engine; the others go on."""


@dataclass(slots=True)
class StreamFailure:
    """Queued instead of a delta when a request fails (engine died, detokeniser error)."""

    request_id: str
    error: BaseException


@dataclass(slots=True)
class _Abort:
    """The delta a stream ends with when it is aborted on the event-loop side."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    finished: bool = True
    finish_reason: str | None = "abort"
    stop_hit: bool = False


class RequestStream:
    """The deltas of one request, in order, ending with a finished delta (or a StreamFailure).

    Iterate it directly, or pass one shared queue to several `add_request` calls and read
    the queue: every item carries its `request_id` (the n choices of one HTTP request).
    """

    def __init__(self, request_id: str, num_prompt_tokens: int, queue: asyncio.Queue) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.queue = queue
        self.finished = False  # set on the event loop when the final item is queued
        self._consumed = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Any:
        if self._consumed:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, StreamFailure):
            self._consumed = True
            raise item.error
        self._consumed = bool(item.finished)
        return item

    def _put(self, item: Any, final: bool = False) -> None:
        if not self.finished:
            self.queue.put_nowait(item)
            self.finished = final or isinstance(item, StreamFailure)


class AsyncEngine:
    """Owns one Engine and the thread that steps it; all public methods run on the event loop
    except the snapshot properties, which any thread may read."""

    def __init__(self, engine: Any, output_processor: Any | None = None) -> None:
        if output_processor is None:
            from gearshift.frontend.output_processor import OutputProcessor

            output_processor = OutputProcessor(engine.tokenizer)
        self.engine = engine
        self.processor = output_processor
        self.tokenizer = engine.tokenizer
        self.model_name: str = engine.model_name
        self.max_model_len: int = engine.max_model_len
        self.vocab_size: int = engine.vocab_size
        # structured output's compiler: thread-safe, so the server's pool compiles with it
        self.grammars = getattr(engine, "grammars", None)
        self.snapshot = EngineSnapshot()
        self.error: BaseException | None = None
        # called on the event loop once the engine thread has died (the server exits)
        self.on_death: Any = None
        # an EngineProcess steps in its own process; an in-process Engine on our thread
        self._remote = bool(getattr(engine, "remote", False))
        self._inbox = ThreadInbox()
        self._thread: threading.Thread | None = None
        self._started = False
        # the event loop's pending answers (adds, prefix-cache resets) by key: the loop's
        # side sees only the key (it may be another process)
        self._futures: dict[int, tuple[asyncio.Future, bool]] = {}
        self._keys = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outputs: queue.SimpleQueue = queue.SimpleQueue()  # step outputs to detokenise
        self._output_thread: threading.Thread | None = None
        self._proc_lock = threading.Lock()  # the OutputProcessor: output thread + event loop
        self._streams: dict[str, RequestStream] = {}
        # adds posted (event loop) / dropped unprocessed (event loop); with the snapshot's
        # count of adds the engine took, num_waiting never counts a request twice or not at
        # all, whichever side runs first
        self._adds_posted = 0
        self._adds_dropped = 0

    # ------------------------------------------------------------ lifecycle (event loop)

    def start(self) -> None:
        """Start the engine's loop (our thread, or the process's reader); call from the event
        loop that will consume the streams."""
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._output_thread = threading.Thread(target=self._process_outputs,
                                               name="gearshift-output", daemon=True)
        self._output_thread.start()
        if self._remote:
            self.engine.start(self)
            return
        loop = EngineLoop(self.engine, self)
        loop.publish()  # before any request: /metrics and num_waiting read it
        self._thread = threading.Thread(target=loop.run, args=(self._inbox,),
                                        name="gearshift-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        if self._remote:
            self.engine.shutdown(timeout)
        self._inbox.stop()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._output_thread is not None:
            self._outputs.put(None)
            self._output_thread.join(timeout)
            self._output_thread = None
        self._fail_all(EngineDeadError("the engine is shutting down"))

    @property
    def is_alive(self) -> bool:
        if self.error is not None or not self._started:
            return False
        if self._remote:
            return self.engine.is_alive()
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------ requests (event loop)

    @property
    def num_waiting(self) -> int:
        """Requests queued in the engine plus those not yet handed to it."""
        snap = self.snapshot
        return snap.num_waiting + self._adds_posted - self._adds_dropped - snap.adds_taken

    @property
    def num_running(self) -> int:
        return self.snapshot.num_running

    @property
    def num_live_streams(self) -> int:
        return len(self._streams)

    async def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: Any,
        queue: asyncio.Queue | None = None,
    ) -> RequestStream:
        """Queue a request; returns once the engine accepted it (raises its PromptError).

        Its deltas go to `queue` (shared by several requests) or to a fresh one.
        """
        if not self.is_alive:
            raise EngineDeadError(f"the engine is not running: {self.error!r}")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        assert self._loop is not None
        stream = RequestStream(request_id, len(prompt_token_ids), queue or asyncio.Queue())
        key, accepted = self._future(is_add=True)
        with self._proc_lock:
            self.processor.add(request_id, prompt_token_ids, params, seed=params.seed)
        self._streams[request_id] = stream
        self._adds_posted += 1
        self._post(("add", request_id, prompt_token_ids, params, key))
        try:
            await accepted
        except BaseException:
            self._futures.pop(key, None)
            # Rejected by the engine, or the caller was cancelled while waiting: forget it.
            # (An abort posted after the add is applied after it: the inbox is FIFO.)
            self._forget(request_id)
            self._post(("abort", request_id, "abort"))
            raise
        return stream

    async def reset_prefix_cache(self) -> int:
        """Drop the cached prefixes no running request holds (on the engine thread, between
        steps); -> KV slots freed."""
        if not self.is_alive:
            raise EngineDeadError(f"the engine is not running: {self.error!r}")
        key, done = self._future(is_add=False)
        self._post(("reset_prefix_cache", key))
        try:
            return await done
        finally:
            self._futures.pop(key, None)

    def abort(self, request_id: str) -> None:
        """Abort a request now (client gone); its stream ends with finish_reason 'abort'."""
        stream = self._streams.get(request_id)
        if stream is None:
            return
        self._forget(request_id)
        self._post(("abort", request_id, "abort"))
        stream._put(_Abort(request_id), final=True)

    # ------------------------------------------------------------ event-loop internals

    def _post(self, item: tuple) -> None:
        if self._remote:
            self.engine.post(item)
        else:
            self._inbox.put(item)

    def _future(self, is_add: bool) -> tuple[int, asyncio.Future]:
        assert self._loop is not None
        key, fut = next(self._keys), self._loop.create_future()
        self._futures[key] = (fut, is_add)
        return key, fut

    def _settle(self, key: int, exc: BaseException | None, value: Any = None) -> None:
        fut = self._futures.pop(key, (None, False))[0]
        if fut is None or fut.done():
            return
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)

    def _forget(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            with self._proc_lock:
                try:
                    self.processor.final(request_id)
                except KeyError:
                    pass

    def _deliver(self, deltas: list) -> None:
        """The output thread's deltas (or the exception processing one raised) into their
        streams."""
        for request_id, delta in deltas:
            stream = self._streams.get(request_id)
            if stream is None:  # aborted or stopped on this side already
                continue
            if isinstance(delta, BaseException):  # a detokeniser bug must not kill the server
                self._forget(request_id)
                self._post(("abort", request_id, "abort"))
                stream._put(StreamFailure(request_id, delta))
                continue
            if delta.error is not None:  # the engine failed this request alone
                self._forget(request_id)
                stream._put(StreamFailure(request_id, RequestFailedError(delta.error)))
                continue
            if delta.finished:
                if delta.stop_hit:
                    self._post(("abort", request_id, "stop"))
                self._forget(request_id)
            stream._put(delta, final=delta.finished)

    # ------------------------------------------------------------ output thread

    def _process_outputs(self) -> None:
        while (outputs := self._outputs.get()) is not None:
            deltas = []
            for out in outputs:
                with self._proc_lock:
                    if out.request_id not in self.processor:  # finished on the loop's side
                        continue
                    try:
                        deltas.append((out.request_id, self.processor.process(out)))
                    except Exception as exc:  # noqa: BLE001 - reported to that request only
                        logger.exception("output processing failed for %s", out.request_id)
                        deltas.append((out.request_id, exc))
            if deltas:
                self._call_loop(self._deliver, deltas)

    def _on_engine_error(self, exc: BaseException) -> None:
        self.error = exc
        self._fail_all(EngineDeadError(f"the engine failed: {type(exc).__name__}: {exc}"))
        if self.on_death is not None:
            self.on_death(exc)

    def _fail_all(self, err: EngineDeadError) -> None:
        """End every stream and every pending add with `err` (the engine is gone)."""
        for fut, is_add in self._futures.values():
            if is_add:
                self._adds_dropped += 1
            if not fut.done():
                fut.set_exception(err)
        self._futures.clear()
        for stream in list(self._streams.values()):
            stream._put(StreamFailure(stream.request_id, err))
        self._streams.clear()

    # ------------------------------------------------------------ the loop's sink
    # (engine thread, or the engine process's reader thread)

    def added(self, key: int, exc: BaseException | None) -> None:
        self._call_loop(self._settle, key, exc)

    def reset_done(self, key: int, freed: int) -> None:
        self._call_loop(self._settle, key, None, freed)

    def outputs(self, outputs: list) -> None:
        self._outputs.put(outputs)

    def step_done(self, outputs: list, snapshot: EngineSnapshot) -> None:
        self.snapshot = snapshot  # first: a client that sees the outputs sees this too
        if outputs:
            self._outputs.put(outputs)

    def set_snapshot(self, snapshot: EngineSnapshot) -> None:
        self.snapshot = snapshot

    def failed(self, exc: BaseException) -> None:
        if not isinstance(exc, EngineDeadError):
            logger.error("engine failed", exc_info=exc)
        self._call_loop(self._on_engine_error, exc)

    def _call_loop(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # loop closed between the check and the call
                pass


def _resolve(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)
