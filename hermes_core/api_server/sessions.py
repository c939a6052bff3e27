"""Sessions of the API server: `X-Hermes-Session-Id` keeps a conversation's sandbox and history
across requests; `X-Hermes-Session-Key` (optional) is then a secret that the session's later requests
must repeat. Without a key, whoever knows the id owns the session.

The store is bounded and expiring: idle sessions are closed after a TTL, and a new session past the
bound closes an idle one of the same client (its address), else of a client holding more sessions than
this one would, else it is refused (429). A closed session's id is remembered for another TTL and
answers 410 `session_expired` rather than a fresh, empty session; nobody can take it over meanwhile.
Its owner, once told, may start it afresh with the same key. A session's history has a size cap (413
`session_history_too_large`). Closing a session closes its sandbox, and so does the server's shutdown.
Without a session id a request is stateless: its sandbox lives for that request only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import hmac
import json
import re
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from hermes_core.sandbox import Sandbox, SandboxBackend

SESSION_ID_HEADER = "X-Hermes-Session-Id"
SESSION_KEY_HEADER = "X-Hermes-Session-Key"
MAX_HEADER_CHARS = 256  # as the original: a stable channel id never needs more
MAX_TOMBSTONES = 10_000  # closed ids remembered at most (about 3 MB); past it the oldest is forgotten
CLOSERS = 2  # threads that close sessions' sandboxes: never the runs' workers, however many expire at once
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


def _end_turn(view: Sandbox) -> None:
    """`close()` of a session's sandbox as its turn sees it: the sandbox outlives the turn, only the
    commands the turn left running stop (its client hung up and the turn was cancelled)."""
    view.interrupt()


def _kept(sandbox: Sandbox) -> Sandbox:
    """The same sandbox (same state, same class for the tools' capability checks) whose `close()`
    only interrupts: the agent closes its sandbox after every turn, a session's must outlive the turn."""
    cls = type(sandbox)
    kept_cls = _KEPT_CLASSES.get(cls)
    if kept_cls is None:
        kept_cls = _KEPT_CLASSES[cls] = type(cls.__name__, (cls,), {"close": _end_turn})
    view = object.__new__(kept_cls)
    view.__dict__ = sandbox.__dict__  # shared, not copied: one sandbox seen through two classes
    return view


def history_bytes(history: list[dict[str, Any]]) -> int:
    """The size of a history as JSON in UTF-8, what the session cap counts."""
    return len(json.dumps(history, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def same_key(a: str | None, b: str | None) -> bool:
    return hmac.compare_digest((a or "").encode(), (b or "").encode())


@dataclass(eq=False)
class Session:
    id: str
    key: str | None
    client: str  # who started it (its address): eviction is fair between clients
    history: list[dict[str, Any]] = field(default_factory=list)
    history_bytes: int = 0
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


@dataclass
class Tombstone:
    """A closed session's id, refused (410) until `until`; `told`: its owner has had that answer."""

    key: str | None
    why: str
    until: float
    told: bool = False


class SessionStore:
    """The live sessions, least recently used first, and the ids of closed ones. Used from the event
    loop only; sandboxes are closed in the store's own threads."""

    def __init__(self, max_sessions: int, idle_s: float, max_history_bytes: int) -> None:
        self.max_sessions, self.idle_s, self.max_history_bytes = max_sessions, idle_s, max_history_bytes
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.tombstones: OrderedDict[str, Tombstone] = OrderedDict()  # oldest first: one TTL for all
        self.closed = 0  # sessions closed so far (evicted, expired or at shutdown): for observers
        self._closing: set[asyncio.Future] = set()
        self._closer: concurrent.futures.ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self.sessions)

    def acquire(self, session_id: str, key: str | None, client: str, history: list[dict[str, Any]]) -> Session:
        """The session for a turn, marked busy; a new one (of `client`) starts from the request's
        `history`. Raises SessionRefused: a wrong key (403), a turn already running (409), a closed
        session's id (410), a history over the cap (413), no room (429)."""
        self.expire()
        session = self.sessions.get(session_id)
        if session is None:
            self._check_tombstone(session_id, key)
            session = Session(session_id, key, client, [dict(m) for m in history], history_bytes(history))
            self._check_history(session)
            self._make_room(client)
            self.sessions[session_id] = session
        elif not same_key(session.key, key):
            raise SessionRefused(403, f"{SESSION_KEY_HEADER} does not match the key this session was started "
                                 "with", "session_key_mismatch", SESSION_KEY_HEADER)
        elif session.busy:
            raise SessionRefused(409, f"session {session_id!r} is already answering a request; send the next "
                                 "message when that one has finished", "session_busy", SESSION_ID_HEADER)
        else:
            self._check_history(session)
        self.sessions.move_to_end(session_id)
        session.busy = True
        return session

    def _check_tombstone(self, session_id: str, key: str | None) -> None:
        """410 for the id of a closed session, until its tombstone expires; the key it was started with
        (never an empty one: without a key anyone could) takes it back once it has been told."""
        stone = self.tombstones.get(session_id)
        if stone is None:
            return
        owner = stone.key is not None and same_key(stone.key, key)
        if owner and stone.told:
            del self.tombstones[session_id]
            return
        stone.told = stone.told or owner
        again = " (with this session's key, the next request starts this id afresh)" if owner else ""
        raise SessionRefused(410, f"session {session_id!r} was closed ({stone.why}): its history and sandbox are "
                             f"gone; start a new session with a new {SESSION_ID_HEADER}{again}", "session_expired",
                             SESSION_ID_HEADER)

    def _check_history(self, session: Session) -> None:
        if session.history_bytes > self.max_history_bytes:
            raise SessionRefused(413, f"session {session.id!r} holds {session.history_bytes:,} bytes of history, "
                                 f"more than the {self.max_history_bytes:,} allowed "
                                 "(API_SERVER_MAX_SESSION_HISTORY_BYTES); start a new session with what it needs "
                                 "to know", "session_history_too_large", SESSION_ID_HEADER)

    def _make_room(self, client: str) -> None:
        """Close an idle session if the store is full: `client`'s own least recently used, else the least
        recently used of the client holding the most, if that is more than `client` would then hold."""
        if len(self.sessions) < self.max_sessions:
            return
        idle = [s for s in self.sessions.values() if not s.busy]
        victim = next((s for s in idle if s.client == client), None)
        if victim is None:
            held = Counter(s.client for s in self.sessions.values())
            most = max((held[s.client] for s in idle), default=0)
            if most > held[client] + 1:
                victim = next(s for s in idle if held[s.client] == most)
        if victim is None:
            raise SessionRefused(429, f"all {self.max_sessions} sessions are answering requests or held by clients "
                                 "with no more than their share; retry shortly", "too_many_sessions")
        self._close(victim, "evicted to make room for a new session")

    def release(self, session: Session, messages: list[dict[str, Any]] | None) -> None:
        """End a turn; `messages` (the agent's full conversation) become the history when the turn
        finished, and the session's idle clock starts."""
        if messages is not None:
            session.history = [{k: v for k, v in m.items() if k != "reasoning"} for m in messages]
            session.history_bytes = history_bytes(session.history)
        session.busy = False
        session.last_used = time.monotonic()

    def expire(self) -> int:
        """Close the sessions idle for longer than the TTL and forget expired tombstones; returns how
        many sessions were closed."""
        now = time.monotonic()
        while self.tombstones and next(iter(self.tombstones.values())).until < now:
            self.tombstones.popitem(last=False)
        stale = [s for s in self.sessions.values() if not s.busy and s.last_used < now - self.idle_s]
        for session in stale:
            self._close(session, f"idle for more than {self.idle_s:g} s")
        return len(stale)

    def _close(self, session: Session, why: str) -> None:
        del self.sessions[session.id]
        self.tombstones[session.id] = Tombstone(session.key, why, time.monotonic() + self.idle_s)
        if len(self.tombstones) > MAX_TOMBSTONES:
            self.tombstones.popitem(last=False)
        self.closed += 1
        if self._closer is None:
            self._closer = concurrent.futures.ThreadPoolExecutor(CLOSERS, thread_name_prefix="hermes-session-close")
        closing = asyncio.get_running_loop().run_in_executor(self._closer, session.close)
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
            self._close(session, "the server stopped")
        if self._closing:
            await asyncio.wait(list(self._closing))
        if self._closer is not None:
            self._closer.shutdown(wait=False)
            self._closer = None
