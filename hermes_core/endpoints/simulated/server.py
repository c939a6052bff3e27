"""OpenAI-compatible HTTP front end for the deterministic policy, plus an in-process runner.

The server only shapes the policy's `Reply` into `chat.completion` objects or SSE chunk streams;
all decisions live in `policy.respond`. Latency is an `asyncio.sleep`, so hundreds of concurrent
requests overlap instead of queueing.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import hashlib
import json
import math
import os
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from hermes_core.asgi_thread import ThreadedServer, bind_socket, http_url, serve_on_socket, uvicorn_config
from hermes_core.endpoints.simulated.policy import (
    MODEL_ID,
    Reply,
    SimulatedHTTPError,
    conversation_key,
    extra_latency,
)
from hermes_core.endpoints.simulated.constrained_replies import respond
from hermes_core.endpoints.simulated.media import image_generation, vision_reply

OWNER = "hermes-foundry-simulated"
FINGERPRINT = "hermes-sim-simulated"
_MAX_TRACKED = 100_000  # attempt counters kept (LRU), so a long-running server stays bounded
RECENT_BODIES = 512  # request bodies kept for tests (RequestLog.recent)
_ERROR_TYPES = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "permission_denied"),
    404: ("not_found_error", "not_found"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


def error_response(status: int, message: str, retry_after: float | None = None) -> JSONResponse:
    """An OpenAI-style error body; 429s always carry Retry-After so clients can back off."""
    kind, code = _ERROR_TYPES.get(status, ("server_error" if status >= 500 else "invalid_request_error", "simulated"))
    headers = {}
    if retry_after is not None or status == 429:
        headers["Retry-After"] = f"{retry_after if retry_after is not None else 0.05:g}"
    body = {"error": {"message": message, "type": kind, "code": code, "param": None}}
    return JSONResponse(body, status_code=status, headers=headers)


def _model_object() -> dict[str, Any]:
    return {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": OWNER}


def _message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.reasoning is not None:
        message[reply.reasoning_field] = reply.reasoning_value()
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return message


def _pieces(text: str, count: int = 4) -> list[str]:
    """Split text in a few fragments, as a real model streams tokens."""
    if not text:
        return []
    size = max(1, math.ceil(len(text) / count))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _stream_deltas(reply: Reply) -> list[dict[str, Any]]:
    """The delta sequence for a reply: role, reasoning, content, then tool-call fragments."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if reply.reasoning_field == "reasoning_details" and reply.reasoning is not None:
        # One whole block: list-valued deltas get concatenated as items, not as text, by most clients.
        deltas.append({reply.reasoning_field: reply.reasoning_value()})
    else:
        deltas.extend({reply.reasoning_field: piece} for piece in _pieces(reply.reasoning or ""))
    deltas.extend({"content": piece} for piece in _pieces(reply.content or ""))
    for index, call in enumerate(reply.tool_calls):
        fragments = _pieces(call["function"]["arguments"], 3) or [""]
        head = {"name": call["function"]["name"], "arguments": fragments[0]}
        deltas.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function", "function": head}]})
        deltas.extend({"tool_calls": [{"index": index, "function": {"arguments": f}}]} for f in fragments[1:])
    return deltas


async def _sse(reply: Reply, completion_id: str, created: int, include_usage: bool) -> AsyncIterator[bytes]:
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": MODEL_ID,
            "system_fingerprint": FINGERPRINT}

    def event(payload: dict[str, Any]) -> bytes:
        return f"data: {json.dumps({**base, **payload}, ensure_ascii=False)}\n\n".encode()

    for delta in _stream_deltas(reply):
        yield event({"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]})
    yield event({"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reply.finish_reason}]})
    if include_usage:
        yield event({"choices": [], "usage": reply.usage})
    yield b"data: [DONE]\n\n"


class RequestLog:
    """What the endpoint received, so tests and benchmarks can count what a run paid for.

    A conversation's first call (no assistant message yet) is a sample start, counted per prompt.
    """

    def __init__(self) -> None:
        self.requests = 0
        self.sample_starts: Counter[str] = Counter()
        self.arrivals: list[float] = []  # epoch seconds of each request, in arrival order
        self.in_flight = self.max_in_flight = 0  # chat completions being answered now / at most at once
        # The last bodies received, without their tool schemas (large, and asserted elsewhere), so tests can
        # assert what a run sent (reasoning, provider routing, prefill); bounded for long-running servers.
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_BODIES)
        self.tool_descriptions: dict[str, str] = {}  # per tool name, the description last offered (bounded by tools)

    def note(self, body: dict[str, Any]) -> None:
        self.requests += 1
        self.arrivals.append(time.time())
        self.recent.append({key: value for key, value in body.items() if key != "tools"})
        for tool in body.get("tools") if isinstance(body.get("tools"), list) else ():
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                self.tool_descriptions[function["name"]] = str(function.get("description"))
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        roles = [m.get("role") for m in messages if isinstance(m, dict)]
        if "assistant" not in roles and "user" in roles:
            first_user = next(m for m in messages if isinstance(m, dict) and m.get("role") == "user")
            self.sample_starts[str(first_user.get("content"))] += 1

    def bodies_mentioning(self, text: str) -> list[dict[str, Any]]:
        """The recent request bodies (tools left out) with a user message containing `text`, oldest first."""
        return [body for body in list(self.recent)
                if any(isinstance(m, dict) and m.get("role") == "user" and text in str(m.get("content"))
                       for m in body.get("messages") or ())]

    def as_json(self, since: float = 0.0) -> dict[str, Any]:
        """Counts, and when the first request at or after `since` (epoch seconds) and the last one arrived."""
        later = bisect.bisect_left(self.arrivals, since)
        return {"requests": self.requests, "sample_starts": dict(self.sample_starts),
                "first_at": self.arrivals[later] if later < len(self.arrivals) else None,
                "last_at": self.arrivals[-1] if self.arrivals else None, "max_in_flight": self.max_in_flight}


async def _json_object(request: Request) -> dict[str, Any] | Response:
    """The request body as a JSON object, or the 400 response saying why not."""
    try:
        body = json.loads(await request.body() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return error_response(400, f"Request body is not valid JSON: {exc}")
    return body if isinstance(body, dict) else error_response(400, "Request body must be a JSON object")


def create_app(latency: float = 0.0, log: RequestLog | None = None) -> Starlette:
    """The ASGI app; `latency` seconds are added to every chat completion."""
    attempts: OrderedDict[str, int] = OrderedDict()
    log = log if log is not None else RequestLog()

    def next_attempt(key: str) -> int:
        # Counted before any await, so concurrent identical requests get distinct attempt numbers.
        count = attempts.pop(key, 0) + 1
        attempts[key] = count
        if len(attempts) > _MAX_TRACKED:
            attempts.popitem(last=False)
        return count

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok", "simulated": True})

    async def stats(request: Request) -> Response:
        return JSONResponse(log.as_json(float(request.query_params.get("since") or 0)))

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [_model_object()]})

    async def model(request: Request) -> Response:
        # Any model name is served by the same simulated policy.
        return JSONResponse({**_model_object(), "id": request.path_params["model"]})

    async def chat_completions(request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        log.note(body)
        key = conversation_key(body)
        attempt = next_attempt(key)
        delay = latency + extra_latency(body)
        log.in_flight += 1
        log.max_in_flight = max(log.max_in_flight, log.in_flight)
        try:
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            log.in_flight -= 1
        try:
            reply = vision_reply(body) or respond(body, attempt)
        except SimulatedHTTPError as exc:
            return error_response(exc.status, exc.message, exc.retry_after)
        completion_id = "chatcmpl-" + hashlib.sha256(key.encode()).hexdigest()[:24]
        created = int(time.time())
        if body.get("stream"):
            options = body.get("stream_options") or {}
            include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
            return StreamingResponse(
                _sse(reply, completion_id, created, include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        choice = {"index": 0, "message": _message(reply), "logprobs": None, "finish_reason": reply.finish_reason}
        return JSONResponse({
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": MODEL_ID,
            "system_fingerprint": FINGERPRINT,
            "choices": [choice],
            "usage": reply.usage,
        })

    async def images_generations(request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        if not isinstance(body.get("prompt"), str) or not body["prompt"].strip():
            return error_response(400, "'prompt' must be a non-empty string")
        return JSONResponse(image_generation(body))

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(exc.status_code, str(exc.detail))

    routes = []
    for prefix in ("/v1", ""):  # also serve clients whose base_url omits /v1
        routes += [
            Route(f"{prefix}/models", models, methods=["GET"]),
            Route(f"{prefix}/models/{{model:path}}", model, methods=["GET"]),
            Route(f"{prefix}/chat/completions", chat_completions, methods=["POST"]),
            Route(f"{prefix}/images/generations", images_generations, methods=["POST"]),
        ]
    routes.append(Route("/health", health, methods=["GET"]))
    routes.append(Route("/sim/requests", stats, methods=["GET"]))
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


def _config(latency: float, log_level: str, log: RequestLog | None = None) -> uvicorn.Config:
    return uvicorn_config(create_app(latency, log), log_level)


class SimulatedModelServer:
    """Runs the simulated model in a background thread; use as a context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, latency: float = 0.0) -> None:
        self.host = host
        self.port = port
        self.latency = latency
        self.log = RequestLog()
        self._runner: ThreadedServer | None = None

    @property
    def base_url(self) -> str:
        return http_url(self.host, self.port, "/v1")

    def start(self, timeout: float = 5.0) -> SimulatedModelServer:
        if self._runner is not None:
            return self
        runner = ThreadedServer(_config(self.latency, "warning", self.log), self.host, self.port, "hermes-sim")
        try:
            runner.start(timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"simulated model server failed to start on {self.host}:{runner.port}") from exc
        self._runner, self.port = runner, runner.port
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._runner is not None:
            self._runner.stop(timeout)
        self._runner = None

    def __enter__(self) -> SimulatedModelServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve(host: str = "127.0.0.1", port: int = 0, latency: float = 0.0, port_file: str | None = None) -> None:
    """Serve in the foreground until SIGINT/SIGTERM; the bound port goes to `port_file` if given."""
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    if port_file:
        # Write then rename, so a poller never reads a half-written port.
        target = Path(port_file)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{bound}\n")
        tmp.replace(target)
    print(f"hermes-sim (simulated model) listening on {http_url(host, bound, '/v1')}", flush=True)
    # The server shares the cores with the run it serves: what start-up made is frozen out of
    # collections, and young ones run every 10k allocations instead of 700 (256 sessions × 2,000
    # samples: 0.34 -> 0.05 CPU-s of collections, of ~3.5 for the whole server).
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    serve_on_socket(_config(latency, "warning"), sock)
