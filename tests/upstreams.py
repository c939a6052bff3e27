"""Misbehaving model endpoints on 127.0.0.1, for the fail-fast tests: one that refuses every API key
(401, as OpenAI words it) and one that accepts chat completions and never answers. Each counts the
requests that reached it."""

from __future__ import annotations

import asyncio
from typing import Iterator

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
