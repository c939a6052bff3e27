"""Model calls go through HTTP(S)_PROXY unless NO_PROXY exempts the endpoint, with the proxy looked
up once per process rather than per request (aiohttp's trust_env did it in two threads per call).
The proxy is a real HTTP server on 127.0.0.1; the endpoint's host is never resolved."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from hermes_core.config import Endpoint
from hermes_core.endpoints.model_client import ModelClient, env_proxy

COMPLETION = {"choices": [{"message": {"role": "assistant", "content": "via proxy"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 2}, "model": "m"}


class Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers["Content-Length"]))
        Recorder.seen.append((self.path, self.headers.get("Authorization", ""),
                              self.headers.get("Proxy-Authorization", "")))
        body = json.dumps(COMPLETION).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    """A local HTTP server that answers every POST with a completion and records its request line."""
    Recorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _complete(endpoint: Endpoint, times: int) -> list[str]:
    async def run() -> list[str]:
        client = ModelClient(endpoint)
        try:
            return [(await client.complete({"messages": [{"role": "user", "content": "hi"}]})).message["content"]
                    for _ in range(times)]
        finally:
            await client.aclose()

    return asyncio.run(run())


@pytest.fixture(autouse=True)
def fresh_lookup(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    env_proxy.cache_clear()
    yield
    env_proxy.cache_clear()


def test_calls_go_through_the_proxy_the_environment_names(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://user:secret@{server}")
    assert _complete(Endpoint("http://model.invalid/v1", "sk-key", "m"), 3) == ["via proxy"] * 3
    assert [path for path, _, _ in Recorder.seen] == ["http://model.invalid/v1/chat/completions"] * 3
    assert {auth for _, auth, _ in Recorder.seen} == {"Bearer sk-key"}
    assert {proxy_auth for _, _, proxy_auth in Recorder.seen} == {"Basic dXNlcjpzZWNyZXQ="}  # user:secret
    assert env_proxy.cache_info().misses == 1  # looked up once for the three calls


def test_no_proxy_sends_the_endpoint_straight_there(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there: using it would fail
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert _complete(Endpoint(f"http://{server}/v1", "k", "m"), 1) == ["via proxy"]
    assert [path for path, _, _ in Recorder.seen] == ["/v1/chat/completions"]  # direct: a path, not a URL
