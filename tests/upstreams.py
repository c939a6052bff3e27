"""Misbehaving model endpoints on 127.0.0.1: one that refuses every API key (401, as OpenAI words it),
one that accepts chat completions and never answers (the fail-fast tests), and an attacker that
sends the tool calls a test chooses. Each counts the requests that reached it."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Callable, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hermes_core.asgi_thread import ThreadedServer, uvicorn_config

WRONG_KEY = {"error": {"message": "Incorrect API key provided: wr***ey. You can find your API key at "
                                  "https://platform.openai.com/account/api-keys.",
                       "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}


class Upstream:
    """A running test endpoint: its base URL (ending in /v1) and the paths of the requests it got."""

    def __init__(self, server: ThreadedServer, hits: list[str]):
        self.server = server
        self.hits = hits
        self.base_url = server.url("/v1")


def _serve(app: Starlette, hits: list[str], name: str, release: asyncio.Event | None = None) -> Upstream:
    async def before_shutdown() -> None:
        if release is not None:
            release.set()  # the hung requests end, so the server stops at once

    return Upstream(ThreadedServer(uvicorn_config(app), name=name, before_shutdown=before_shutdown).start(), hits)


def wrong_key_app(hits: list[str]) -> Starlette:
    """Every request is refused with 401, whatever its path."""
    async def refuse(request: Request) -> Response:
        hits.append(request.url.path)
        return JSONResponse(WRONG_KEY, status_code=401)

    return Starlette(routes=[Route("/{path:path}", refuse, methods=["GET", "POST"])])


def hung_app(hits: list[str], release: asyncio.Event) -> Starlette:
    """Lists the model like any server, then accepts each chat completion and never answers it."""
    async def models(request: Request) -> Response:
        hits.append(request.url.path)
        return JSONResponse({"object": "list", "data": [{"id": "stuck-model", "object": "model"}]})

    async def hang(request: Request) -> Response:
        hits.append(request.url.path)
        await release.wait()
        return JSONResponse({"error": {"message": "shutting down"}}, status_code=503)

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", hang, methods=["POST"])])


def attacker_app(hits: list[str], calls: dict[str, tuple[str, dict] | list[tuple[str, dict]]]) -> Starlette:
    """A model that answers a conversation whose first user message names `[attack=NAME]` with the
    tool call calls[NAME] (tool name, arguments), or with each call of a list of them in turn, and once
    the tools answered, with a final answer."""
    def reply(message: dict, finish: str) -> JSONResponse:
        return JSONResponse({"id": "chatcmpl-attack", "object": "chat.completion", "created": 0, "model": "attacker",
                             "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    async def models(request: Request) -> Response:
        hits.append(request.url.path)
        return JSONResponse({"object": "list", "data": [{"id": "attacker", "object": "model"}]})

    async def complete(request: Request) -> Response:
        hits.append(request.url.path)
        messages = (await request.json())["messages"]
        first = next(message["content"] for message in messages if message["role"] == "user")
        name = re.search(r"\[attack=([\w-]+)\]", first if isinstance(first, str) else json.dumps(first))
        steps = calls[name.group(1)] if name else []
        steps = steps if isinstance(steps, list) else [steps]
        answered = sum(message["role"] == "tool" for message in messages)
        if answered >= len(steps):
            return reply({"role": "assistant", "content": "Done.", "reasoning_content": "It ran."}, "stop")
        tool, arguments = steps[answered]
        call = {"id": f"call_{name.group(1)}_{answered}", "type": "function",
                "function": {"name": tool, "arguments": json.dumps(arguments)}}
        return reply({"role": "assistant", "content": "", "reasoning_content": "Run it.", "tool_calls": [call]},
                     "tool_calls")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", complete, methods=["POST"])])


def attacker(calls: dict[str, tuple[str, dict] | list[tuple[str, dict]]]) -> Callable[[], Iterator[Upstream]]:
    """A fixture serving attacker_app(calls)."""
    @pytest.fixture()
    def fixture() -> Iterator[Upstream]:
        hits: list[str] = []
        upstream = _serve(attacker_app(hits, calls), hits, "attacker")
        yield upstream
        upstream.server.stop()

    return fixture


@pytest.fixture()
def wrong_key_upstream() -> Iterator[Upstream]:
    hits: list[str] = []
    upstream = _serve(wrong_key_app(hits), hits, "wrong-key")
    yield upstream
    upstream.server.stop()


@pytest.fixture()
def hung_upstream() -> Iterator[Upstream]:
    hits: list[str] = []
    release = asyncio.Event()
    upstream = _serve(hung_app(hits, release), hits, "hung", release)
    yield upstream
    upstream.server.stop()
