"""Fixtures for the API server tests: a real server on 127.0.0.1 in front of the simulated model,
with its sandboxes in a temporary state root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from hermes_core.api_server import ApiServer, ApiServerSettings
from hermes_core.config import Endpoint

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
