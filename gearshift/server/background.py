"""A uvicorn server in a background thread on a free loopback port: for tests, the soak
script and notebooks. The app's lifespan (engine thread start/stop) runs as in `serve`.

Data flow: BackgroundServer(app) -> uvicorn.Server in a thread -> base_url for clients.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from types import TracebackType

import uvicorn

from gearshift.server.guard import server_config


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """ConfigError naming the port when uvicorn could not bind it: bound the way uvicorn
    binds (its address family, SO_REUSEADDR), then released."""
    from gearshift.config import ConfigError

    if not 0 < port < 65536:
        raise ConfigError(f"port {port} is not a TCP port (1..65535)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            reason = "is already in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror})"
            raise ConfigError(f"port {port} on {host} {reason}: pick another with --port") from None


class BackgroundServer:
    """`with BackgroundServer(app) as srv: httpx.get(srv.base_url + "/health")`."""

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None,
                 log_level: str = "warning", **limits) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.server = uvicorn.Server(server_config(app, host, self.port, log_level=log_level,
                                                   **limits))
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("uvicorn exited during start-up (see its log)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"uvicorn did not start within {timeout} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
