"""Connection guard: a flood of idle connections must not make the server unreachable, and a
flood of identical errors must not fill the log.

    connection made  -> at the cap? evict the oldest connection that has not started a
                        request (a refusal costs an accept and a close, nothing more)
                     -> idle: no request started within `header_timeout` s closes it (a
                        sweep each second)
    request started  -> the connection is no longer evictable until its response completes
    errors           -> RateLimitFilter: the first of a kind is logged, then one line per
                        interval with the count of those suppressed

uvicorn's h11 protocol closes idle keep-alive connections, but a connection that never
finishes its first request's headers is kept forever: thousands of them exhaust the file
descriptors, and every failed accept then logs a traceback.

Data flow: serve / BackgroundServer -> server_config(app, ...) -> uvicorn with GuardedH11
(per connection) and the filter on the loggers that repeat.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_MAX_CONNECTIONS = 4096  # open connections (well under the raised file limit)
DEFAULT_HEADER_TIMEOUT = 10.0  # seconds for a connection to send a complete request head


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a connection cap (evicting idle connections first) and a
    header timeout. Limits come from the subclass `guarded_protocol` makes."""

    max_connections = DEFAULT_MAX_CONNECTIONS
    header_timeout = DEFAULT_HEADER_TIMEOUT
    evicted = 0  # connections closed to make room, or for not sending a request in time

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        idle = _Idle.of(self.server_state, self.loop, self.header_timeout)
        if len(self.connections) >= self.max_connections:
            if not idle.evict_oldest():  # every connection is busy with a request: refuse
                self.transport, self._refused = transport, True
                type(self).evicted += 1
                transport.abort()
                return
        super().connection_made(transport)
        idle.add(self)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self.server_state.gearshift_idle.discard(self)  # a request is in progress

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():  # keep-alive: idle again until the next request
            self.server_state.gearshift_idle.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_refused", False):  # refused before uvicorn set it up
            return
        self.server_state.gearshift_idle.discard(self)
        super().connection_lost(exc)

    def close_idle(self) -> None:
        type(self).evicted += 1
        if not self.transport.is_closing():
            self.transport.abort()


class _Idle:
    """Connections without a request in progress, oldest first, one table per server; a
    sweep each second closes those idle for longer than the header timeout (one timer per
    server, not one per connection: a flood's every connection costs little)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self.table: collections.OrderedDict = collections.OrderedDict()  # id -> (conn, since)
        self.loop, self.timeout = loop, timeout
        self._timer = None

    @classmethod
    def of(cls, state: Any, loop: asyncio.AbstractEventLoop, timeout: float) -> _Idle:
        idle = getattr(state, "gearshift_idle", None)
        if idle is None:
            idle = state.gearshift_idle = cls(loop, timeout)
        return idle

    def add(self, conn: GuardedH11) -> None:
        self.table.pop(id(conn), None)
        self.table[id(conn)] = (conn, self.loop.time())
        if self._timer is None:
            self._timer = self.loop.call_later(1.0, self._sweep)

    def discard(self, conn: GuardedH11) -> None:
        self.table.pop(id(conn), None)

    def evict_oldest(self) -> bool:
        if not self.table:
            return False
        _, (conn, _) = self.table.popitem(last=False)
        conn.close_idle()
        return True

    def _sweep(self) -> None:
        self._timer = None
        limit = self.loop.time() - self.timeout
        while self.table:
            key, (conn, since) = next(iter(self.table.items()))
            if since > limit:
                break
            del self.table[key]
            conn.close_idle()
        if self.table:
            self._timer = self.loop.call_later(1.0, self._sweep)


def guarded_protocol(max_connections: int, header_timeout: float) -> type[GuardedH11]:
    return type("GuardedH11", (GuardedH11,), {"max_connections": max_connections,
                                              "header_timeout": header_timeout})


class RateLimitFilter(logging.Filter):
    """Lets the first record of each (logger, message template) through, then at most one
    per `interval` seconds, which carries the count suppressed since; tracebacks of the
    repeated ones are dropped."""

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self._seen: dict[tuple[str, str], list[float]] = {}  # key -> [last emitted, suppressed]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = [now, 0]
            return True
        if now - seen[0] < self.interval:
            seen[1] += 1
            return False
        if seen[1]:
            record.msg = f"{record.msg} ({int(seen[1])} more like this in the last " \
                         f"{now - seen[0]:.0f} s)"
            record.exc_info = record.exc_text = None
        self._seen[key] = [now, 0]
        return True


REPEATING_LOGGERS = ("asyncio", "uvicorn.error", "gearshift.server")


def install_log_rate_limit(interval: float = 10.0) -> RateLimitFilter:
    flt = RateLimitFilter(interval)
    for name in REPEATING_LOGGERS:
        logging.getLogger(name).addFilter(flt)
    return flt


def raise_file_limit() -> int:
    """The soft limit on open files up to the hard one (each connection is a descriptor)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def server_config(app: Any, host: str, port: int, *, log_level: str = "warning",
                  max_connections: int = DEFAULT_MAX_CONNECTIONS,
                  header_timeout: float = DEFAULT_HEADER_TIMEOUT) -> uvicorn.Config:
    """The uvicorn configuration every Gearshift server uses."""
    limit = raise_file_limit()
    if limit != resource.RLIM_INFINITY:  # leave descriptors for the model's files and logs
        max_connections = min(max_connections, max(64, limit - 256))
    install_log_rate_limit()
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          timeout_graceful_shutdown=5, timeout_keep_alive=5,
                          http=guarded_protocol(max_connections, header_timeout))
