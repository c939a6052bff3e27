"""The pieces of the chat-frontend test, each a real process on a free 127.0.0.1 port: the simulated
model, `hermes-foundry serve` in front of it, Open WebUI (its own venv, offline) pointed at that
server, and headless Chromium (the browser tools' CDP connection) with a tab that can reach Open
WebUI's port and nothing else."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from hermes_core.tools.backends import AddressRefused
from hermes_core.tools.browser.chromium import Chromium
from hermes_core.tools.browser.page import Page

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "frontend-test-key-0123456789"
CHROMIUM = "/usr/bin/chromium"
MODEL_ID = "hermes-agent"
OPEN_WEBUI_START_S = 600.0  # its first start imports a large stack on 2 shared cores
SERVER_LINE = re.compile(r"Hermes API server on (http://127\.0\.0\.1:\d+/v1)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll until `predicate` returns something truthy; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group the test started, then SIGKILL if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def hermes_serve(upstream_url: str, workdir: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """`hermes-foundry serve` on a free port in front of `upstream_url`; yields its /v1 base URL.
    Its output (including the access log, one line per request) goes to workdir/serve.log."""
    log_path = workdir / "serve.log"
    server_env = {**os.environ, **(env or {}), "API_SERVER_KEY": API_KEY,
                  "HERMES_SANDBOX_STATE_ROOT": str(workdir / "sandboxes"),
                  "HERMES_ENV_FILE": str(workdir / "serve.env")}  # not the machine's ~/.hermes/.env
    (workdir / "serve.env").write_text("")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("hermes-foundry")), "serve", "--port", "0", "--base_url", upstream_url,
             "--api_key", "upstream-key", "--model", "hermes-sim"],
            stdout=log, stderr=subprocess.STDOUT, env=server_env, start_new_session=True)
    try:
        def started() -> str | None:
            if process.poll() is not None:
                raise AssertionError(f"hermes-foundry serve exited: {log_path.read_text()[-2000:]}")
            found = SERVER_LINE.search(log_path.read_text())
            return found.group(1) if found else None

        base_url = wait_for(started, 60, "hermes-foundry serve to listen")
        wait_for(lambda: _ok(base_url.removesuffix("/v1") + "/health"), 30, "hermes-foundry serve's /health")
        yield base_url
    finally:
        stop(process)


def open_webui_env(data_dir: Path, port: int, openai_url: str) -> dict[str, str]:
    """Open WebUI offline and single-user: no login (WEBUI_AUTH=False makes a default admin), no
    telemetry or version checks, no model downloads (no local embedding model is loaded), the
    Ollama connection off and ours as its only OpenAI connection. Title, tags and follow-up
    generation stay at their defaults (on): they are what a user's frontend sends."""
    return {
        "DATA_DIR": str(data_dir), "WEBUI_SECRET_KEY": "frontend-test-secret-" + "0" * 32, "WEBUI_AUTH": "False",
        "CORS_ALLOW_ORIGIN": f"http://127.0.0.1:{port}",
        "OFFLINE_MODE": "True", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "ENABLE_VERSION_UPDATE_CHECK": "False", "SCARF_NO_ANALYTICS": "true", "DO_NOT_TRACK": "true",
        "ANONYMIZED_TELEMETRY": "False", "ENABLE_OTEL": "False",
        "RAG_EMBEDDING_ENGINE": "openai", "RAG_EMBEDDING_MODEL_AUTO_UPDATE": "False",
        "RAG_RERANKING_MODEL_AUTO_UPDATE": "False", "WHISPER_MODEL_AUTO_UPDATE": "False",
        "ENABLE_OLLAMA_API": "False", "ENABLE_OPENAI_API": "True",
        "OPENAI_API_BASE_URL": openai_url, "OPENAI_API_KEY": API_KEY,
        "HOME": str(data_dir), "TMPDIR": str(data_dir),
    }


@contextlib.contextmanager
def open_webui(executable: str, openai_url: str, workdir: Path) -> Iterator[str]:
    """`open-webui serve` on a free 127.0.0.1 port with its data in workdir; yields its URL."""
    data_dir, port = workdir / "open-webui", free_port()
    data_dir.mkdir()
    log_path = workdir / "open-webui.log"
    # A clean environment: the caller's proxies, keys or OPENAI_* settings must not reach it.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
           **open_webui_env(data_dir, port, openai_url)}
    with open(log_path, "wb") as log:
        process = subprocess.Popen([executable, "serve", "--host", "127.0.0.1", "--port", str(port)], cwd=data_dir,
                                   stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"open-webui exited ({process.returncode}): {log_path.read_text()[-3000:]}")
            return _ok(f"{url}/health")

        wait_for(healthy, OPEN_WEBUI_START_S, "Open WebUI's /health", interval=1.0)
        yield url
    finally:
        stop(process)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def browser_tab(url: str, width: int = 1280, height: int = 900) -> Iterator[Page]:
    """A Chromium tab whose connections may reach `url`'s 127.0.0.1 port only (the browser tools'
    guard proxy refuses everything else, so the frontend cannot fetch anything from outside)."""
    port = int(url.rsplit(":", 1)[1])

    def only_open_webui(host: str, wanted: int) -> list[str]:
        if host in ("127.0.0.1", "localhost") and wanted == port:
            return ["127.0.0.1"]
        raise AddressRefused(f"{host}:{wanted}: only Open WebUI is reachable in this test")

    browser = Chromium(CHROMIUM).start()
    try:
        page = Page.open(browser, only_open_webui, max_chars=200_000)
        try:
            browser.run(browser.send("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, page.session))
            page.navigate(url)
            yield page
        finally:
            page.close()
    finally:
        browser.close()


def press_enter(page: Page) -> None:
    """Enter as a keyboard sends it. Not `Page.press`: that waits for a page load after a navigation
    starts, and Open WebUI's move to the new chat's URL (/c/<id>) is in-page routing with no load."""
    for kind in ("keyDown", "keyUp"):
        page.browser.run(page.browser.send("Input.dispatchKeyEvent", {
            "type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13,
            **({"text": "\r"} if kind == "keyDown" else {})}, page.session))


def screenshot_png(page: Page) -> bytes:
    data_url, _ = page.screenshot()
    return base64.b64decode(data_url.split(",", 1)[1])
