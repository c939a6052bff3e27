"""Headless Chromium (Debian's, no browser download) and a CDP connection to it, served by one
event loop thread, so tool threads can drive it with blocking calls."""

from __future__ import annotations

import asyncio
import atexit
import itertools
import json
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

from hermes_core.tools.browser.guard import BYPASS_LIST, GuardProxy, refuse_all

if TYPE_CHECKING:  # imported where a browser starts: every command imports this module (the tool registry)
    import aiohttp

T = TypeVar("T")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
         "--disable-dev-shm-usage", "--disable-features=BackForwardCache",  # back() then loads like any page
         "--remote-debugging-port=0", "about:blank"]
# WebRTC's UDP (STUN, TURN) would bypass the proxy: this keeps WebRTC to TCP through it. As a
# preference, since this Chromium ignores the --force-webrtc-ip-handling-policy switch.
PREFERENCES = {"webrtc": {"ip_handling_policy": "disable_non_proxied_udp"}}
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 60.0


class BrowserError(RuntimeError):
    """Chromium could not start, or a protocol call failed; the message is what the model reads."""


class Chromium:
    """One Chromium process with a fresh profile, and its CDP websocket. Blocking API: `run(coro)`
    executes on the connection's own event loop thread."""

    def __init__(self, executable: str) -> None:
        self.executable = executable
        self._profile = Path(tempfile.mkdtemp(prefix="hermes-chromium-"))
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._listeners: dict[str, list[Callable[[str, dict[str, Any]], None]]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hermes-chromium", daemon=True)
        self._process: subprocess.Popen | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._http: aiohttp.ClientSession | None = None
        self._guard = GuardProxy(refuse_all)

    def start(self) -> "Chromium":
        (self._profile / "Default").mkdir()
        (self._profile / "Default" / "Preferences").write_text(json.dumps(PREFERENCES))
        self._thread.start()
        # Every browser context gets its own checking proxy (page.py); this one, for the default
        # context and the browser's own requests, lets nothing out.
        proxy = self.run(self._guard.start())
        self._process = subprocess.Popen([self.executable, f"--user-data-dir={self._profile}",
                                          f"--proxy-server={proxy}", f"--proxy-bypass-list={BYPASS_LIST}", *FLAGS],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        port_file, deadline = self._profile / "DevToolsActivePort", time.monotonic() + START_TIMEOUT_S
        while not (port_file.is_file() and len(port_file.read_text().splitlines()) >= 2):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise BrowserError(f"{self.executable} did not start (exit code {self._process.poll()})")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        self.run(self._connect(f"ws://127.0.0.1:{port}{path}"))
        return self

    async def _connect(self, url: str) -> None:
        import aiohttp

        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(url, max_msg_size=0)
        self._loop.create_task(self._read())

    async def _read(self) -> None:
        from aiohttp import WSMsgType

        assert self._ws is not None
        async for message in self._ws:
            if message.type != WSMsgType.TEXT:
                break
            data = message.json()
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            else:
                for listener in self._listeners.get(data.get("sessionId", ""), []):
                    listener(data["method"], data.get("params") or {})
        for future in self._pending.values():  # the connection ended: nobody will answer
            if not future.done():
                future.set_exception(BrowserError("the browser connection closed"))

    async def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """One CDP command; its result, or BrowserError with the protocol's message."""
        if self._ws is None or self._ws.closed:
            raise BrowserError("the browser is not running")
        call_id = next(self._ids)
        future = self._pending[call_id] = self._loop.create_future()
        message: dict[str, Any] = {"id": call_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        await self._ws.send_json(message)
        reply = await asyncio.wait_for(future, CALL_TIMEOUT_S)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message', reply['error'])}")
        return reply.get("result") or {}

    def listen(self, session: str, listener: Callable[[str, dict[str, Any]], None]) -> None:
        """Call `listener(method, params)` for each event of a target session (on the loop thread)."""
        self._listeners.setdefault(session, []).append(listener)

    def forget(self, session: str) -> None:
        self._listeners.pop(session, None)

    def run(self, coroutine: Awaitable[T], timeout: float = CALL_TIMEOUT_S * 2) -> T:
        """Block until `coroutine` finished on the connection's loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)  # type: ignore[arg-type]

    def close(self) -> None:
        if self._thread.is_alive():
            async def disconnect() -> None:
                if self._ws is not None:
                    await self._ws.close()
                if self._http is not None:
                    await self._http.close()
                await self._guard.close()
            try:
                self.run(disconnect(), timeout=5)
            except Exception:  # closing anyway
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self._profile, ignore_errors=True)


_shared: dict[str, Chromium] = {}
_shared_lock = threading.Lock()


def shared_browser(executable: str) -> Chromium:
    """One Chromium per executable per process, started on first use and stopped at exit; samples
    get their own browser contexts in it (cookies, storage and history are not shared)."""
    with _shared_lock:
        browser = _shared.get(executable)
        if browser is None or browser._process is None or browser._process.poll() is not None:
            browser = _shared[executable] = Chromium(executable).start()
            atexit.register(browser.close)
        return browser
