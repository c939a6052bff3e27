"""Sessions of the API server: `X-Hermes-Session-Id` keeps a conversation's sandbox and history
across requests; `X-Hermes-Session-Key` (optional) is then a secret that the session's later requests
must repeat.

The store is bounded (the least recently used idle session is closed to make room) and expiring
(idle sessions are closed after a TTL); closing a session closes its sandbox, and so does the server's
shutdown. Without a session id a request is stateless: its sandbox lives for that request only.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from hermes_core.sandbox import Sandbox, SandboxBackend

SESSION_ID_HEADER = "X-Hermes-Session-Id"
SESSION_KEY_HEADER = "X-Hermes-Session-Key"
MAX_HEADER_CHARS = 256  # as the original: a stable channel id never needs more
_CONTROL = re.compile(r"[\r\n\x00]")


class SessionRefused(Exception):
    """A request's session headers cannot be honoured; `status` and `code` say how to answer."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def _path_shaped(value: str) -> bool:
    # Ids end up in sandbox names and paths: nothing that could walk out of a folder.
    return ".." in value or "/" in value or "\\" in value or (len(value) >= 2 and value[0].isalpha()
                                                             and value[1] == ":")


def header_value(headers: Any, name: str, path_safe: bool) -> str | None:
    """The stripped header value (None when absent or blank), refused (400) as the original refuses it:
    control characters, more than 256 characters, and for ids a path-like shape."""
    raw = (headers.get(name) or "").strip()
    if not raw:
        return None
    what = "session ID" if path_safe else "session key"
    if _CONTROL.search(raw) or (path_safe and _path_shaped(raw)):
        raise SessionRefused(400, f"Invalid {what} in {name}", f"invalid_{what.replace(' ', '_').lower()}", name)
    if len(raw) > MAX_HEADER_CHARS:
        raise SessionRefused(400, f"{what[0].upper()}{what[1:]} too long in {name} (at most {MAX_HEADER_CHARS} "
                             "characters)", f"invalid_{what.replace(' ', '_').lower()}", name)
    return raw


_KEPT_CLASSES: dict[type, type] = {}


def _kept(sandbox: Sandbox) -> Sandbox:
    """The same sandbox (same state, same class for the tools' capability checks) whose `close()`
    does nothing: the agent closes its sandbox after every turn, a session's must outlive the turn."""
    cls = type(sandbox)
    kept_cls = _KEPT_CLASSES.get(cls)
    if kept_cls is None:
        kept_cls = _KEPT_CLASSES[cls] = type(cls.__name__, (cls,), {"close": lambda self: None})
    view = object.__new__(kept_cls)
    view.__dict__ = sandbox.__dict__  # shared, not copied: one sandbox seen through two classes
    return view


@dataclass(eq=False)
class Session:
    id: str
    key: str | None
    history: list[dict[str, Any]] = field(default_factory=list)
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    sandbox: Sandbox | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # open and close run in worker threads

    @property
    def task_id(self) -> str:
        """The agent's task id on every turn (it names the sandbox): stable, and safe in file names."""
        return "api-" + hashlib.sha256(self.id.encode()).hexdigest()[:16]

    def close(self) -> None:
        """Close the sandbox (idempotent); called from a worker thread."""
        with self.lock:
            sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            sandbox.close()


class SessionSandboxes(SandboxBackend):
    """The sandbox backend an agent gets for one turn of a session: the session's sandbox, opened
    on the first tool call of its first turn and handed out again on later turns."""

    name = "session"

    def __init__(self, session: Session, backend: SandboxBackend) -> None:
        self.session, self.backend = session, backend
        self.isolated = backend.isolated

    def open(self, session_id: str, image: str | None = None, cwd: str | None = None) -> Sandbox:
        with self.session.lock:
            if self.session.sandbox is None:
                self.session.sandbox = self.backend.open(session_id, image, cwd)
            return _kept(self.session.sandbox)

    def image_problem(self, image: str) -> str | None:
        return self.backend.image_problem(image)


class SessionStore:
    """The live sessions, least recently used first. Used from the event loop only; sandboxes are
    closed in worker threads."""

    def __init__(self, max_sessions: int, idle_s: float) -> None:
        self.max_sessions, self.idle_s = max_sessions, idle_s
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.closed = 0  # sessions closed so far (evicted, expired or at shutdown): for observers
        self._closing: set[asyncio.Future] = set()

    def __len__(self) -> int:
        return len(self.sessions)

    def acquire(self, session_id: str, key: str | None, history: list[dict[str, Any]]) -> Session:
        """The session for a turn, marked busy; a new one starts from the request's `history`.
        Raises SessionRefused for a wrong key (403), a turn already running (409) or no room (429)."""
        self.expire()
        session = self.sessions.get(session_id)
        if session is not None:
            if not hmac.compare_digest((session.key or "").encode(), (key or "").encode()):
                raise SessionRefused(403, f"{SESSION_KEY_HEADER} does not match the key this session was started "
                                     "with", "session_key_mismatch", SESSION_KEY_HEADER)
            if session.busy:
                raise SessionRefused(409, f"session {session_id!r} is already answering a request; send the next "
                                     "message when that one has finished", "session_busy", SESSION_ID_HEADER)
        else:
            if len(self.sessions) >= self.max_sessions:
                idle = next((s for s in self.sessions.values() if not s.busy), None)
                if idle is None:
                    raise SessionRefused(429, f"all {self.max_sessions} sessions are answering requests; retry "
                                         "shortly", "too_many_sessions")
                self._close(idle)
            session = self.sessions[session_id] = Session(session_id, key, [dict(m) for m in history])
        self.sessions.move_to_end(session_id)
        session.busy = True
        return session

    def release(self, session: Session, messages: list[dict[str, Any]] | None) -> None:
        """End a turn; `messages` (the agent's full conversation) become the history when the turn
        finished, and the session's idle clock starts."""
        if messages is not None:
            session.history = [{k: v for k, v in m.items() if k != "reasoning"} for m in messages]
        session.busy = False
        session.last_used = time.monotonic()

    def expire(self) -> int:
        """Close the sessions idle for longer than the TTL; returns how many."""
        cutoff = time.monotonic() - self.idle_s
        stale = [s for s in self.sessions.values() if not s.busy and s.last_used < cutoff]
        for session in stale:
            self._close(session)
        return len(stale)

    def _close(self, session: Session) -> None:
        del self.sessions[session.id]
        self.closed += 1
        closing = asyncio.ensure_future(asyncio.to_thread(session.close))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def sweep_forever(self) -> None:
        """Expire idle sessions in the background (requests also expire them as they come)."""
        while True:
            await asyncio.sleep(min(max(self.idle_s / 4, 0.05), 60.0))
            self.expire()

    async def close_all(self) -> None:
        """At shutdown, after the runs were cancelled: close every session and wait for the sandboxes."""
        for session in list(self.sessions.values()):
            self._close(session)
        if self._closing:
            await asyncio.wait(list(self._closing))
