"""Run an ASGI app with uvicorn on a socket we bind ourselves: in a background thread (tests, embedded
servers) or in the foreground (CLI). Binding first means port 0 works and the real port is known
before uvicorn starts."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import uvicorn


def bind_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening socket on (host, port); port 0 picks any free port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def http_url(host: str, port: int, path: str = "") -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{path}"


def uvicorn_config(
    app: Any, log_level: str = "warning", lifespan: Literal["on", "off", "auto"] = "off", **options: Any
) -> uvicorn.Config:
    # A short graceful shutdown: open streams must not hold a stopping server for minutes.
    defaults: dict[str, Any] = {"access_log": False, "timeout_graceful_shutdown": 2, "backlog": 2048}
    return uvicorn.Config(app, lifespan=lifespan, log_level=log_level, **{**defaults, **options})


Hook = Callable[[], Awaitable[None]]


class HookedServer(uvicorn.Server):
    """uvicorn.Server that awaits `before_shutdown` when shutdown begins, before uvicorn drains open
    connections: an app can then end its long responses cleanly instead of having them cut when the
    graceful-shutdown timeout runs out."""

    def __init__(self, config: uvicorn.Config, before_shutdown: Hook | None = None) -> None:
        super().__init__(config)
        self.before_shutdown = before_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.before_shutdown is not None:
            await self.before_shutdown()
        await super().shutdown(sockets)


def serve_on_socket(config: uvicorn.Config, sock: socket.socket, before_shutdown: Hook | None = None) -> None:
    """Serve in the foreground until SIGINT/SIGTERM; the socket is closed afterwards."""
    try:
        HookedServer(config, before_shutdown).run(sockets=[sock])
    finally:
        sock.close()


class ThreadedServer:
    """uvicorn serving `config.app` in a daemon thread; `start()` returns once it accepts connections."""

    def __init__(self, config: uvicorn.Config, host: str = "127.0.0.1", port: int = 0, name: str = "asgi",
                 before_shutdown: Hook | None = None) -> None:
        self.config = config
        self.before_shutdown = before_shutdown
        self.host = host
        self.port = port
        self.name = name
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    def url(self, path: str = "") -> str:
        return http_url(self.host, self.port, path)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 10.0) -> ThreadedServer:
        if self._thread is not None:
            return self
        self._sock = bind_socket(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        self._server = HookedServer(self.config, self.before_shutdown)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name=f"{self.name}:{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} server failed to start on {self.host}:{self.port}")
            time.sleep(0.005)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True  # stuck streams: stop waiting for them
                self._thread.join(timeout)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
