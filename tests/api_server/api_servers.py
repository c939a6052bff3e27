"""Fixtures and client helpers for the API server tests: a real server on 127.0.0.1 in front of the
simulated model, with its sandboxes in a temporary state root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hermes_core.api_server import ApiServer, ApiServerSettings
from hermes_core.config import Endpoint
from procs import processes_with, wait_until

KEY = "test-key-0123456789abcdef"
ALLOWED = "https://chat.example.com"
TOOL_PROMPT = "Please run this [sim:command=echo served-by-hermes]"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def sandbox_root(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        root = tmp_path_factory.mktemp("sandboxes")
        patch.setenv("HERMES_SANDBOX_STATE_ROOT", str(root))
        yield root


def settings(sim_server: Any, **overrides: Any) -> ApiServerSettings:
    endpoint = Endpoint.resolve(sim_server.base_url, "upstream-key", "hermes-sim", max_retries=0, backoff_base_s=0.01)
    return ApiServerSettings(**{"key": KEY, "endpoint": endpoint, "port": 0, **overrides})


@pytest.fixture()
def start_server(sim_server: Any, sandbox_root: Path) -> Any:
    started: list[ApiServer] = []

    def start(**overrides: Any) -> ApiServer:
        started.append(ApiServer(settings(sim_server, **overrides)).start())
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def server(sim_server: Any, sandbox_root: Path) -> Any:
    with ApiServer(settings(sim_server, cors_origins=(ALLOWED,), max_body_bytes=64 * 1024)) as srv:
        yield srv


@pytest.fixture()
def client(server: ApiServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=60)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def post(server: ApiServer, text: str, headers: dict[str, str] | None = None, client: httpx.Client | None = None,
         **body: Any) -> httpx.Response:
    """A chat completion; no response may carry the session key back (finding 7)."""
    response = (client or httpx).post(f"{server.base_url}/chat/completions", timeout=60,
                                      json={"model": "hermes-agent", "messages": user(text), **body},
                                      headers={**AUTH, **(headers or {})})
    assert "x-hermes-session-key" not in response.headers, response.headers
    return response


def session(session_id: str, key: str | None = None) -> dict[str, str]:
    return {"X-Hermes-Session-Id": session_id, **({"X-Hermes-Session-Key": key} if key else {})}


def answer(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def sleeping(tag: str) -> list[str]:
    """The sleep commands themselves (not the shells that started them)."""
    return [found for found in processes_with(f"sleep {tag}") if found.startswith("sleep")]


def hang_up_during(server: ApiServer, text: str, headers: dict[str, str], tag: str) -> None:
    """Stream a turn, wait until its command `sleep <tag>` runs, and hang up."""
    body = {"model": "hermes-agent", "stream": True, "messages": user(text)}
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body, headers={**AUTH, **headers},
                      timeout=30) as response:
        assert "x-hermes-session-key" not in response.headers
        lines = response.iter_lines()  # held: a dropped iterator would close the connection at once
        assert any(line == "event: hermes.tool.progress" for line in lines)
        assert wait_until(lambda: sleeping(tag), 15), "the command never started"
