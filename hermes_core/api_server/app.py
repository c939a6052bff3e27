"""The OpenAI-compatible HTTP API (SPEC §11): every chat completion runs the full agent, tools included.

`/health` needs no key (load balancers and probes have none) and says nothing but "ok";
`/v1/models` and `/v1/chat/completions` need `Authorization: Bearer <API_SERVER_KEY>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hermes_core.agent.loop import AIAgent
from hermes_core.sandbox import get_backend
from hermes_core.api_server.settings import ApiServerSettings
from hermes_core.api_server.streaming import Completion, error_body, run_error, stream_run
from hermes_core.api_server.validation import RequestError, invalid, validate_messages, wrong_type

PROGRESS_HEADER = "x-hermes-progress"  # "inline": progress lines in delta.content for this request
SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"), (b"cache-control", b"no-store")]
_SYSTEM_ROLES = ("system", "developer")  # "developer" is the newer OpenAI name for system
_OPTIONS = {"temperature": ((int, float), "a number"), "max_tokens": (int, "an integer"),
            "max_completion_tokens": (int, "an integer"), "reasoning_effort": (str, "a string")}


class BodyTooLarge(Exception):
    pass


def error_response(status: int, message: str, kind: str, code: str, headers: dict[str, str] | None = None,
                   param: str | None = None) -> Response:
    return JSONResponse(error_body(message, kind, code, param), status_code=status, headers=headers)


class SecurityHeaders:
    """Adds the security headers to every response, errors and CORS refusals included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(name, value) for name, value in SECURITY_HEADERS if name not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class RunPool:
    """The running agent conversations: a hard cap (over it: 429, never a queue that hides load) and
    cancellation of whatever still runs when the server stops."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.tasks: set[asyncio.Task] = set()
        self.closing = False

    def start(self, make: Callable[[], Coroutine[Any, Any, dict[str, Any]]]) -> asyncio.Task | None:
        if len(self.tasks) >= self.limit:
            return None
        task = asyncio.ensure_future(make())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel every run; called when server shutdown begins, so that streams still end with an
        error event and [DONE] rather than being cut off."""
        self.closing = True
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:  # waiting lets each agent's finally close its sandbox
            await asyncio.wait(list(self.tasks), timeout=timeout)


@dataclass
class ChatRequest:
    user_message: str
    system: str | None
    history: list[dict[str, Any]]
    stream: bool
    options: dict[str, Any]


def _text(content: str | list[dict[str, Any]], where: str) -> str:
    """The text of validated content; the agent's own turns take text only (images stay history)."""
    if isinstance(content, str):
        return content
    for index, part in enumerate(content):
        if part["type"] != "text":
            raise invalid(f"{where}.content[{index}].type", f"content part {part['type']!r} is not supported "
                          "in this message (text only)")
    return "\n".join(part["text"] for part in content)


def parse_chat_request(body: Any) -> ChatRequest:
    """System messages → the ephemeral system prompt; the last (user) message → the user message;
    everything else, as given → the conversation history."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    messages = validate_messages(body.get("messages"))
    if messages[-1]["role"] != "user":
        raise invalid(f"messages[{len(messages) - 1}].role", "the last message must have role 'user': it is what "
                      "the agent answers")
    systems = [_text(m.get("content"), f"messages[{i}]") for i, m in enumerate(messages) if m["role"] in _SYSTEM_ROLES]
    options = {}
    for name, (kind, expected) in _OPTIONS.items():
        if body.get(name) is not None:
            if not isinstance(body[name], kind) or isinstance(body[name], bool):
                raise wrong_type(body[name], name, expected)
            options["max_tokens" if name == "max_completion_tokens" else name] = body[name]
    return ChatRequest(
        user_message=_text(messages[-1].get("content"), f"messages[{len(messages) - 1}]"),
        system="\n\n".join(s for s in systems if s) or None,
        history=[m for m in messages[:-1] if m["role"] not in _SYSTEM_ROLES],
        stream=bool(body.get("stream")),
        options=options,
    )


async def read_json(request: Request, limit: int) -> Any:
    """The JSON body, refused (BodyTooLarge) as soon as it is known to exceed `limit` bytes:
    from Content-Length before reading anything, else while counting the streamed bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks) or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from exc


async def _run_unless_disconnected(request: Request, task: asyncio.Task) -> dict[str, Any] | None:
    """Wait for the run; a client that hangs up cancels it (None). Non-streamed responses get no
    disconnect signal from Starlette, so we listen for `http.disconnect` ourselves."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    return None if task.cancelled() else task.result()


def create_app(settings: ApiServerSettings) -> Starlette:
    runs = RunPool(settings.max_concurrent_runs)
    key = settings.key.encode()
    sandboxes = get_backend(settings.sandbox_backend)  # one for all requests: sessions reuse its slots

    def authorized(request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)

    def unauthorized() -> Response:
        return error_response(401, "missing or invalid API key: send 'Authorization: Bearer <API_SERVER_KEY>'",
                              "invalid_request_error", "invalid_api_key", {"WWW-Authenticate": "Bearer"})

    def agent_for(chat: ChatRequest, progress: Callable[[dict[str, str]], None] | None) -> AIAgent:
        endpoint = settings.endpoint
        return AIAgent(
            endpoint.model, endpoint.base_url, endpoint.api_key, quiet_mode=True,
            enabled_toolsets=list(settings.toolsets) if settings.toolsets else None,
            max_iterations=settings.max_iterations, ephemeral_system_prompt=chat.system,
            max_retries=endpoint.max_retries, backoff_base_s=endpoint.backoff_base_s,
            sandbox_backend=sandboxes, tool_progress=progress, tool_call_mode=settings.tool_call_mode, **chat.options,
        )

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        model = {"id": settings.model_name, "object": "model", "created": 0, "owned_by": "hermes-foundry"}
        return JSONResponse({"object": "list", "data": [model]})

    async def chat_completions(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        try:
            chat = parse_chat_request(await read_json(request, settings.max_body_bytes))
        except BodyTooLarge:
            return error_response(413, f"the request body exceeds {settings.max_body_bytes} bytes",
                                  "invalid_request_error", "request_too_large", {"Connection": "close"})
        except RequestError as exc:
            return error_response(400, str(exc), "invalid_request_error", exc.code, param=exc.param)
        if runs.closing:
            return error_response(503, "the server is shutting down", "server_error", "shutting_down")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        # Thread-safe on purpose: a tool runner may report from a worker thread.
        agent = agent_for(chat, (lambda event: loop.call_soon_threadsafe(queue.put_nowait, dict(event)))
                          if chat.stream else None)
        completion = Completion(settings.model_name)
        task = runs.start(lambda: agent.arun_conversation(
            chat.user_message, conversation_history=chat.history, task_id=completion.task_id))
        if task is None:
            return error_response(429, f"{settings.max_concurrent_runs} agent runs are already in progress; retry "
                                  "shortly", "rate_limit_error", "too_many_runs", {"Retry-After": "1"})
        if chat.stream:
            task.add_done_callback(lambda _: queue.put_nowait(None))  # after every progress event
            inline = settings.inline_progress or request.headers.get(PROGRESS_HEADER, "").lower() == "inline"
            return StreamingResponse(stream_run(task, queue, completion, inline, settings.keepalive_s),
                                     media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})
        try:
            result = await _run_unless_disconnected(request, task)
        except Exception as exc:  # an agent bug, not a model failure: still an OpenAI-style answer
            return error_response(500, f"internal error: {exc}", "server_error", "internal_error")
        if result is None:  # cancelled: by a shutdown, or the client is gone and will not read this
            return error_response(503, "the agent run was cancelled: the server is shutting down", "server_error",
                                  "shutting_down") if runs.closing else Response(status_code=499)
        if result["failed"]:
            return JSONResponse(run_error(result), status_code=502)
        return JSONResponse(completion.response(result))

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        runs.closing = False  # a stopped ApiServer may be started again
        yield
        await runs.shutdown()
        sandboxes.close()

    cors = Middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_credentials=False,
                      allow_methods=["GET", "POST", "OPTIONS"], expose_headers=["Retry-After"], max_age=600,
                      allow_headers=["Authorization", "Content-Type", "X-Hermes-Progress"])
    app = Starlette(
        routes=[Route("/health", health, methods=["GET"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/v1/chat/completions", chat_completions, methods=["POST"])],
        middleware=[Middleware(SecurityHeaders), cors],  # outermost first: refusals get the headers too
        lifespan=lifespan,
    )
    app.state.runs = runs  # for observers (tests, metrics): how many agent runs are active
    return app
