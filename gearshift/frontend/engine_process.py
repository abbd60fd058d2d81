"""The engine in a process of its own: the server's event loop, detokenising and streaming
run in the server's process and never hold the GIL the step loop needs. On a thread beside
them, every GIL hand-back inside a step (each torch call releases it) waits for whatever
the other threads are doing, and a VERIFY step, which is synchronous, pays for all of it.
vLLM and SGLang split the same way.

    server process                                engine process (spawned)
    --------------                                ------------------------
    AsyncEngine._post -> EngineProcess.post -> writer thread --pipe--> EngineLoop over
    reader thread <--pipe-- ("step", outputs +         an Engine built from the config;
      snapshot) -> AsyncEngine.step_done / outputs /   ("out" | "added" | "reset" |
      added / reset_done / set_snapshot / failed        "snap" | "failed") as its sink

The server's process keeps its own tokenizer (detokenising, chat templates) and grammar
compiler (it checks requests' constraints; the engine compiles them again from the
request). Tensor parallelism keeps the engine on a thread (its ranks are processes already).

Data flow: `gearshift serve` -> EngineProcess(config) -> AsyncEngine(it) -> build_app.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import queue
import select
import signal
import threading
from typing import Any

from gearshift.config import EngineConfig

log = logging.getLogger("gearshift.engine")


class EngineProcess:
    """The server's handle on an Engine in a spawned process; AsyncEngine drives it."""

    remote = True  # AsyncEngine: post to it, do not step it

    def __init__(self, config: EngineConfig, kv_events: str | None = None) -> None:
        from gearshift.models.loader import resolve_model_config
        from gearshift.structured.compiler import GrammarCompiler
        from gearshift.tokenizer import load_engine_tokenizer

        ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        child_in, self._send = ctx.Pipe(duplex=False)
        self._recv, child_out = ctx.Pipe(duplex=False)
        # not a daemon: a tensor-parallel or draft process of its own must stay possible
        self.process = ctx.Process(target=_main, name="gearshift-engine",
                                   args=(config, child_in, child_out,
                                         logging.getLogger("gearshift").level, kv_events))
        self.process.start()
        child_in.close()
        child_out.close()
        # post() never blocks the event loop: a large prompt fills the pipe until the engine
        # reads it between two steps, so a thread of ours writes
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write, name="gearshift-engine-writer",
                                        daemon=True)
        self._writer.start()
        self._reader: threading.Thread | None = None
        self._closing = False
        self.first_snapshot = None
        try:
            info = self._await_ready()
        except BaseException:  # its own failure, or Ctrl-C here: no engine left loading
            if self.process.is_alive():
                self.process.kill()
            self.process.join(5)
            self._outbox.put(None)
            raise
        self.model_name: str = info["model_name"]
        self.max_model_len: int = info["max_model_len"]
        self.vocab_size: int = info["vocab_size"]
        _, path = resolve_model_config(config.model)
        self.tokenizer = load_engine_tokenizer(config, path)
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size,
                                        tuple(info["eos_token_ids"]))

    def _await_ready(self) -> dict:
        while True:
            try:
                kind, payload = self._recv.recv()
            except (EOFError, OSError):
                self.process.join(5)
                raise RuntimeError("the engine process exited while starting (exit code "
                                   f"{self.process.exitcode}); its log is above") from None
            if kind == "snap":
                self.first_snapshot = payload
            elif kind == "ready":
                return payload
            elif kind == "failed":
                self.process.join(5)
                raise payload

    # ---------------------------------------------------------------- AsyncEngine's side
    def start(self, sink: Any) -> None:
        """Read the engine's messages into `sink` (AsyncEngine) on a thread of ours."""
        if self.first_snapshot is not None:
            sink.set_snapshot(self.first_snapshot)
        self._reader = threading.Thread(target=self._read, args=(sink,),
                                        name="gearshift-engine-reader", daemon=True)
        self._reader.start()

    def post(self, item: tuple) -> None:
        self._outbox.put(item)

    def _write(self) -> None:
        while (item := self._outbox.get()) is not None:
            try:
                self._send.send(item)
            except (OSError, ValueError):  # the process is gone: the reader reports it
                pass
        self._send.close()

    def is_alive(self) -> bool:
        return self.process.is_alive() and self._reader is not None and self._reader.is_alive()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop, wait for the process (then terminate it)."""
        self._closing = True
        self.post(("stop",))
        self._outbox.put(None)  # the writer's end
        self.process.join(timeout)
        if self.process.is_alive():  # stuck in a step: it ignores SIGTERM
            self.process.kill()
            self.process.join(5)
        for thread in (self._writer, self._reader):
            if thread is not None:
                thread.join(timeout)

    def _read(self, sink: Any) -> None:
        from gearshift.frontend.async_engine import EngineDeadError

        handlers = {"step": lambda p: sink.step_done(*p), "out": sink.outputs,
                    "snap": sink.set_snapshot,
                    "added": lambda p: sink.added(*p), "reset": lambda p: sink.reset_done(*p)}
        while True:
            try:
                kind, payload = self._recv.recv()
            except (EOFError, OSError):
                if not self._closing:
                    self.process.join(5)
                    sink.failed(EngineDeadError(
                        f"the engine process exited (exit code {self.process.exitcode})"))
                return
            if kind == "failed":
                sink.failed(payload)
                return
            if kind == "stopped":
                return
            handlers[kind](payload)


# -------------------------------------------------------------------- the engine process
class _PipeInbox:
    """EngineLoop's inbox in the engine process: the server's pipe."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.stopped = False
        self._poll = select.poll()
        self._poll.register(conn.fileno(), select.POLLIN)

    def take(self) -> list[tuple]:
        items = []
        while not self.stopped and self._poll.poll(0):  # one syscall: taken every step
            self._recv_into(items)
        return items

    def wait(self, timeout: float) -> None:
        if not self.stopped:
            self._poll.poll(timeout * 1e3)  # take() reads what arrived

    def _recv_into(self, items: list) -> None:
        try:
            item = self.conn.recv()
        except (EOFError, OSError):  # the server's process is gone
            self.stopped = True
            return
        if item[0] == "stop":
            self.stopped = True
        else:
            items.append(item)


class _PipeSink:
    """EngineLoop's sink in the engine process: messages to the server's reader thread."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def _send(self, kind: str, payload: Any) -> None:
        try:
            self.conn.send((kind, payload))
        except (OSError, ValueError):  # the server's process is gone; the inbox notices
            pass

    def added(self, key: int, exc: BaseException | None) -> None:
        self._send("added", (key, _portable(exc)))

    def reset_done(self, key: int, freed: int) -> None:
        self._send("reset", (key, freed))

    def outputs(self, outputs: list) -> None:
        self._send("out", outputs)

    def step_done(self, outputs: list, snapshot) -> None:
        self._send("step", (outputs, snapshot))  # one message a step

    def set_snapshot(self, snapshot) -> None:
        self._send("snap", snapshot)

    def failed(self, exc: BaseException) -> None:
        log.error("engine failed", exc_info=exc)
        self._send("failed", _portable(exc))


def _portable(exc: BaseException | None) -> BaseException | None:
    """`exc`, or a RuntimeError with its text where it does not survive pickling."""
    if exc is None:
        return None
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _main(config: EngineConfig, inbox_conn, out_conn, log_level: int,
          kv_events: str | None = None) -> None:
    # Ctrl-C and a supervisor's SIGTERM reach the whole process group: the server's process
    # stops us in order after its last response (or we see its pipe close)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from gearshift import logs
    from gearshift.engine.engine import Engine
    from gearshift.frontend.engine_loop import EngineLoop

    logs.configure_default()
    logging.getLogger("gearshift").setLevel(log_level)
    sink = _PipeSink(out_conn)
    try:
        engine = Engine(config)
        if kv_events is not None:  # the prefix cache's blocks over ZMQ (frontend/kv_events.py)
            from gearshift.frontend.kv_events import attach_publisher

            attach_publisher(engine, kv_events)
    except BaseException as exc:  # noqa: BLE001 - the server's process raises it
        sink._send("failed", _portable(exc))
        return
    loop = EngineLoop(engine, sink)
    loop.publish()
    sink._send("ready", {"model_name": engine.model_name, "max_model_len": engine.max_model_len,
                         "vocab_size": engine.vocab_size,
                         "eos_token_ids": list(engine.eos_token_ids)})
    inbox = _PipeInbox(inbox_conn)
    loop.run(inbox)
    if engine.step_stats.trace is not None:
        engine.step_stats.trace.flush()  # a spawned process runs no atexit
    sink._send("stopped", None)
