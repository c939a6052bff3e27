"""The OpenAI-compatible HTTP API (SPEC §11): every chat completion runs the full agent, tools included.

`/health` needs no key (load balancers and probes have none) and says nothing but "ok"; every `/v1/`
route but `/v1/health` needs `Authorization: Bearer <API_SERVER_KEY>`. Sessions: `sessions.py`;
`/v1/capabilities`, `/v1/toolsets` and housekeeping requests: `discovery.py`.
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
from hermes_core.api_server.discovery import capabilities, is_housekeeping, toolsets
from hermes_core.api_server.sessions import (SESSION_ID_HEADER, SESSION_KEY_HEADER, Session, SessionRefused,
                                             SessionSandboxes, SessionStore, header_value)
from hermes_core.api_server.settings import AUTO, ApiServerSettings
from hermes_core.api_server.streaming import (Completion, error_body, hermes_status, run_error, stream_run,
                                              strip_inline_progress)
from hermes_core.api_server.validation import RequestError, invalid, validate_messages, wrong_type
from hermes_core.api_server.workers import PARALLEL_TOOLS_PER_RUN, Workers

PROGRESS_HEADER = "x-hermes-progress"  # "inline" / "events": this request's progress with / without content lines
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


def refusal(exc: SessionRefused) -> Response:
    busy = exc.status == 429
    return error_response(exc.status, str(exc), "rate_limit_error" if busy else "invalid_request_error", exc.code,
                          {"Retry-After": "1"} if busy else None, exc.param)


def status_headers(result: dict[str, Any]) -> dict[str, str]:
    """The original's completion-status headers: set only when the run did not simply complete."""
    if result.get("completed") and not result.get("failed"):
        return {}
    headers = {"X-Hermes-Completed": "false", "X-Hermes-Partial": "true" if result.get("partial") else "false"}
    if result.get("error"):  # a header value: one line of printable ASCII, bounded as the original bounds it
        text = " ".join(str(result["error"]).split()).encode("ascii", "replace").decode()
        headers["X-Hermes-Error"] = text[:200]
    return headers


def inline_progress(request: Request, setting: bool | str) -> bool:
    """Progress as content lines too? The request's X-Hermes-Progress wins, then the setting; `auto`
    inlines unless the client sent a Hermes session header (a Hermes-aware client reads the named events)."""
    asked = request.headers.get(PROGRESS_HEADER, "").strip().lower()
    if asked in ("inline", "events"):
        return asked == "inline"
    if setting != AUTO:
        return bool(setting)
    return not (request.headers.get(SESSION_ID_HEADER) or request.headers.get(SESSION_KEY_HEADER))


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


def _own_turn(message: dict[str, Any]) -> dict[str, Any]:
    """A history message, an assistant's text without the inline progress lines we streamed into it."""
    if message["role"] == "assistant" and isinstance(message.get("content"), str):
        return {**message, "content": strip_inline_progress(message["content"])}
    return message


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
        history=[_own_turn(m) for m in messages[:-1] if m["role"] not in _SYSTEM_ROLES],
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
    chores = RunPool(settings.max_concurrent_runs)  # housekeeping answers: own slots, so they never crowd out chats
    sessions = SessionStore(settings.max_sessions, settings.session_idle_s, settings.max_session_history_bytes)
    key = settings.key.encode()
    sandboxes = get_backend(settings.sandbox_backend)  # one for all requests: sessions reuse its slots

    def authorized(request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)

    def unauthorized() -> Response:
        return error_response(401, "missing or invalid API key: send 'Authorization: Bearer <API_SERVER_KEY>'",
                              "invalid_request_error", "invalid_api_key", {"WWW-Authenticate": "Bearer"})

    def agent_for(chat: ChatRequest, progress: Callable[[dict[str, str]], None] | None,
                  backend: SessionSandboxes | None, housekeeping: bool) -> AIAgent:
        endpoint = settings.endpoint
        toolset_list = [] if housekeeping else list(settings.toolsets) if settings.toolsets else None
        return AIAgent(
            endpoint.model, endpoint.base_url, endpoint.api_key, quiet_mode=True, enabled_toolsets=toolset_list,
            max_iterations=1 if housekeeping else settings.max_iterations, ephemeral_system_prompt=chat.system,
            max_retries=endpoint.max_retries, backoff_base_s=endpoint.backoff_base_s,
            sandbox_backend=backend or sandboxes, tool_progress=progress, tool_call_mode=settings.tool_call_mode,
            # Opened at the first tool call: many chat replies need none, and on docker a prepared
            # sandbox would be a container started and removed for nothing.
            prepare_sandbox=False, max_parallel_tools=PARALLEL_TOOLS_PER_RUN, **chat.options,
        )

    def start_run(chat: ChatRequest, session: Session | None, housekeeping: bool, task_id: str,
                  progress: Callable[[dict[str, str]], None] | None) -> asyncio.Task | None:
        """The agent run on its pool (None: no free slot); a session stays busy until the run ends and
        takes the run's conversation as its history when the run finished."""
        task = None
        try:
            agent = agent_for(chat, progress, session and SessionSandboxes(session, sandboxes), housekeeping)
            task = (chores if housekeeping else runs).start(lambda: agent.arun_conversation(
                chat.user_message, conversation_history=session.history if session else chat.history,
                task_id=session.task_id if session else task_id))
        finally:
            if session is not None and task is None:
                sessions.release(session, None)
        if session is not None:
            def end_turn(done: asyncio.Task) -> None:
                finished = not done.cancelled() and done.exception() is None and not done.result()["failed"]
                sessions.release(session, done.result()["messages"] if finished else None)

            task.add_done_callback(end_turn)
        return task

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def capabilities_route(request: Request) -> Response:
        return JSONResponse(capabilities(settings)) if authorized(request) else unauthorized()

    async def toolsets_route(request: Request) -> Response:
        return JSONResponse(toolsets(settings)) if authorized(request) else unauthorized()

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
        try:
            session_id = header_value(request.headers, SESSION_ID_HEADER, path_safe=True)
            session_key = header_value(request.headers, SESSION_KEY_HEADER, path_safe=False)
        except SessionRefused as exc:
            return refusal(exc)
        if runs.closing:
            return error_response(503, "the server is shutting down", "server_error", "shutting_down")
        echo = {SESSION_ID_HEADER: session_id} if session_id else {}  # never the key: a secret stays in the request
        housekeeping = is_housekeeping(chat.user_message, chat.history)  # no tools, no sandbox, no session
        session = None
        if session_id and not housekeeping:
            try:
                session = sessions.acquire(session_id, session_key, request.client.host if request.client else "",
                                           chat.history)
            except SessionRefused as exc:
                return refusal(exc)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        completion = Completion(settings.model_name)
        # Thread-safe on purpose: a tool runner may report from a worker thread.
        task = start_run(chat, session, housekeeping, completion.task_id,
                         (lambda event: loop.call_soon_threadsafe(queue.put_nowait, dict(event))) if chat.stream
                         else None)
        if task is None:
            return error_response(429, f"{settings.max_concurrent_runs} agent runs are already in progress; retry "
                                  "shortly", "rate_limit_error", "too_many_runs", {"Retry-After": "1"})
        if chat.stream:
            task.add_done_callback(lambda _: queue.put_nowait(None))  # after every progress event
            stream = stream_run(task, queue, completion, inline_progress(request, settings.inline_progress),
                                settings.keepalive_s)
            return StreamingResponse(stream, media_type="text/event-stream",
                                     headers={"X-Accel-Buffering": "no", **echo})
        try:
            result = await _run_unless_disconnected(request, task)
        except Exception as exc:  # an agent bug, not a model failure: still an OpenAI-style answer
            return error_response(500, f"internal error: {exc}", "server_error", "internal_error")
        if result is None:  # cancelled: by a shutdown, or the client is gone and will not read this
            return error_response(503, "the agent run was cancelled: the server is shutting down", "server_error",
                                  "shutting_down") if runs.closing else Response(status_code=499)
        headers = {**echo, **status_headers(result)}
        if result["failed"] or (result["partial"] and not result["final_response"]):  # no answer to give
            return JSONResponse({"error": {**run_error(result)["error"], "hermes": hermes_status(result)}},
                                status_code=502, headers=headers)
        return JSONResponse(completion.response(result), headers=headers)

    @contextlib.asynccontextmanager
    async def lifespan(served: Starlette) -> AsyncIterator[None]:
        runs.closing = False  # a stopped ApiServer may be started again
        served.state.workers = Workers(settings.max_concurrent_runs)  # asyncio.run shuts it down with the loop
        asyncio.get_running_loop().set_default_executor(served.state.workers)
        sweeper = asyncio.ensure_future(sessions.sweep_forever())
        yield
        sweeper.cancel()
        await asyncio.gather(runs.shutdown(), chores.shutdown())
        await sessions.close_all()  # after the runs: no turn holds a session any more
        sandboxes.close()

    cors = Middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_credentials=False,
                      allow_methods=["GET", "POST", "OPTIONS"], max_age=600,
                      allow_headers=["Authorization", "Content-Type", "X-Hermes-Progress", SESSION_ID_HEADER,
                                     SESSION_KEY_HEADER],
                      expose_headers=["Retry-After", SESSION_ID_HEADER, "X-Hermes-Completed", "X-Hermes-Partial",
                                      "X-Hermes-Error"])
    app = Starlette(
        routes=[Route("/health", health, methods=["GET"]),
                Route("/v1/health", health, methods=["GET"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/v1/capabilities", capabilities_route, methods=["GET"]),
                Route("/v1/toolsets", toolsets_route, methods=["GET"]),
                Route("/v1/chat/completions", chat_completions, methods=["POST"])],
        middleware=[Middleware(SecurityHeaders), cors],  # outermost first: refusals get the headers too
        lifespan=lifespan,
    )
    app.state.runs = runs  # for observers (tests, metrics): how many agent runs are active
    app.state.sessions = sessions  # and how many sessions are open, how many were closed
    return app
