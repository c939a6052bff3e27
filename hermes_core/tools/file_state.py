"""What the file tools remember within one session (one sample), as Hermes Agent 0.19.0's do.

- A re-read of the same (path, offset, limit) of a file unchanged since that read answers with a
  short "unchanged" result instead of the content; the second such answer in a row is a block.
- The same read_file or search_files call made again and again: the 3rd in a row carries a
  `_warning`, the 4th and later are blocked (an `error`, no content). Any other tool call in
  between starts the count afresh, except memory and todo (Hermes Agent runs those inside its
  agent loop, where they never reach the dispatcher that resets the count).
- write_file and patch on a file that changed since this session last read (or wrote) it get a
  `_warning`; their own writes are remembered, so consecutive edits raise no warning.
- "Could not find" failures of patch's replace mode on one path escalate its `_hint` from the
  3rd on; a successful patch of the path starts over.

"Changed" is judged by content, not mtime: the SHA-256 of the bytes the tool already got from the
sandbox (read_file, patch), so no extra sandbox call is needed. A file touched but not changed is
unchanged here. Hermes Agent forgets its dedup after compressing the context; a sample here is
never compressed while it runs, so nothing resets it but the session's own writes.
"""

from __future__ import annotations

import hashlib
import posixpath
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from hermes_core.tools.registry import ToolContext, ToolError, sandbox_failure

WARN_AT = 3  # the same read/search call this many times in a row: `_warning`
BLOCK_AT = 4  # ... and from this many on: blocked
STUB_BLOCK_AT = 2  # "unchanged" answers in a row to one read before the next is a block
PATCH_ESCALATE_AT = 3  # the failure number from which patch's hint escalates
DEDUP_CAP = 1000  # remembered reads (path, offset, limit); the oldest are forgotten first
SEEN_CAP = 1000  # remembered file contents for the staleness check
PATCH_FAILURES_CAP = 64  # paths with a failure count
# Calls that do not end a run of identical reads or searches (see the module docstring).
NOT_RESETTING = frozenset({"read_file", "search_files", "memory", "todo"})
_STATE = "files.tracker"  # ctx.state key

UNCHANGED_MESSAGE = ("Nothing in this file has changed since you last read this range; the earlier "
                     "read_file result in this conversation is still accurate, so use it instead of "
                     "reading the file again.")

Key = tuple[str, int, int]


@dataclass
class Tracker:
    """One session's memory. `started` turns true at its first read or search: only from then on
    are writes remembered for the staleness check (as in Hermes Agent)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    started: bool = False
    last_call: tuple[Any, ...] | None = None
    repeats: int = 0
    dedup: dict[Key, str] = field(default_factory=dict)  # read -> digest of the file then
    stub_hits: dict[Key, int] = field(default_factory=dict)  # "unchanged" answers in a row
    seen: dict[str, str] = field(default_factory=dict)  # path -> digest last read or written
    patch_failures: dict[str, int] = field(default_factory=dict)
    path_locks: dict[str, threading.Lock] = field(default_factory=dict)

    def repeat(self, call: tuple[Any, ...]) -> int:
        """Count `call` (lock held): how many times in a row it has now been made."""
        self.started = True
        self.repeats = self.repeats + 1 if call == self.last_call else 1
        self.last_call = call
        return self.repeats


def tracker(ctx: ToolContext) -> Tracker:
    return ctx.state.setdefault(_STATE, Tracker())  # setdefault is atomic: concurrent calls share one


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def resolve(ctx: ToolContext, path: str) -> str:
    """The sandbox path that `path` names (relative paths start at the sandbox's cwd)."""
    return posixpath.normpath(posixpath.join(ctx.sandbox.cwd, path))


def _cap(table: dict[Any, Any], size: int) -> None:
    while len(table) > size:
        del table[next(iter(table))]  # the oldest entry first


def note_call(name: str, ctx: ToolContext) -> None:
    """Called by the registry before every tool call: another tool ends a run of repeats."""
    state = ctx.state.get(_STATE)
    if state is None or name in NOT_RESETTING:
        return
    with state.lock:
        state.last_call, state.repeats = None, 0
        state.stub_hits.clear()


def _as_result(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return run()
    except ToolError as exc:
        if sandbox_failure(exc):
            raise  # a broken sandbox fails the sample (registry.call)
        return {"error": str(exc)}


def finish(result: dict[str, Any]) -> dict[str, Any]:
    """A bare error is raised, so the registry renders it exactly as any other tool error."""
    if set(result) == {"error"}:
        raise ToolError(result["error"])
    return result


def read(ctx: ToolContext, path: str, offset: int, limit: int, fetch: Callable[[], bytes],
         render: Callable[[bytes], dict[str, Any]]) -> dict[str, Any]:
    """read_file's answer: `render(fetch())`, or "unchanged", a `_warning` or a block (see above).
    Reads of one path are serialized, so that the same read twice in one message is one read and
    then an "unchanged" answer, as Hermes Agent runs them one after the other."""
    state = tracker(ctx)
    resolved = resolve(ctx, path)
    key = (resolved, offset, limit)
    with state.lock:
        path_lock = state.path_locks.setdefault(resolved, threading.Lock())
        _cap(state.path_locks, SEEN_CAP)
    with path_lock:
        data: bytes | None = None
        try:
            data = fetch()
        except ToolError as exc:
            if sandbox_failure(exc):
                raise  # a broken sandbox fails the sample (registry.call)
            result: dict[str, Any] = {"error": str(exc)}
        current = digest(data) if data is not None else None
        with state.lock:
            if current is not None and state.dedup.get(key) == current:
                hits = state.stub_hits[key] = state.stub_hits.get(key, 0) + 1
                _cap(state.stub_hits, DEDUP_CAP)
                if hits >= STUB_BLOCK_AT:
                    return {"error": f"BLOCKED: this is read number {hits + 1} of the same range of {path}, "
                                     "which has not changed. Do not read it again: the earlier read_file "
                                     "result in this conversation still holds its content, so carry on "
                                     "with the task using it.",
                            "path": path, "already_read": hits + 1}
                return {"status": "unchanged", "message": UNCHANGED_MESSAGE, "path": path, "dedup": True,
                        "content_returned": False}
        if data is not None:
            result = _as_result(lambda: render(data))
        with state.lock:
            state.stub_hits.pop(key, None)
            count = state.repeat(("read", path, offset, limit))
            if current is not None and "error" not in result:
                state.dedup[key] = state.seen[resolved] = current
                _cap(state.dedup, DEDUP_CAP)
                _cap(state.seen, SEEN_CAP)
    if count >= BLOCK_AT:
        return {"error": f"BLOCKED: you have now made this same read of {path} {count} times in a row. "
                         "What it returned is already in this conversation: stop reading it and "
                         "continue with the task.",
                "path": path, "already_read": count}
    if count >= WARN_AT:
        result["_warning"] = (f"This is the same read made {count} times in a row. You already have what "
                              "it returns; if you are going round in circles, stop reading and write or "
                              "answer instead.")
    return finish(result)


def search(ctx: ToolContext, call: tuple[Any, ...], pattern: str,
           run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """search_files' answer: `run()`, with a `_warning` or a block when `call` (its pattern, target,
    path, glob and page) repeats. The repeat is counted before the search runs."""
    state = tracker(ctx)
    with state.lock:
        count = state.repeat(("search", *call))
    if count >= BLOCK_AT:
        return {"error": f"BLOCKED: you have now run this same search {count} times in a row. Its "
                         "results are already in this conversation: stop searching again and continue "
                         "with the task.",
                "pattern": pattern, "already_searched": count}
    result = _as_result(run)
    if count >= WARN_AT:
        result["_warning"] = (f"This is the same search run {count} times in a row, and you already have "
                              "its results. Use them.")
    return finish(result)


def watching(ctx: ToolContext, path: str) -> bool:
    """Whether the session remembers the content of `path` (so a write should check it first)."""
    state = ctx.state.get(_STATE)
    return state is not None and resolve(ctx, path) in state.seen


def stale_warning(ctx: ToolContext, path: str, current: str | None) -> str | None:
    """The warning for a write to `path` whose content now has the digest `current` (None: unknown,
    e.g. the file is gone), when that differs from what this session last read or wrote."""
    state = ctx.state.get(_STATE)
    if state is None or current is None:
        return None
    with state.lock:
        known = state.seen.get(resolve(ctx, path))
    if known is None or known == current:
        return None
    return (f"Warning: {path} has changed since you last read it (a command, a program or another "
            "process modified it), so what you read may be out of date. Read it again to check before "
            "you write to it.")


def note_written(ctx: ToolContext, path: str, content: bytes | None) -> None:
    """The session wrote `content` to `path` (None: deleted it): earlier reads of it are no longer
    "unchanged", and a later external change is measured against this content."""
    state = ctx.state.get(_STATE)
    if state is None:
        return
    resolved = resolve(ctx, path)
    with state.lock:
        for key in [key for key in state.dedup if key[0] == resolved]:
            del state.dedup[key]
        if content is None:
            state.seen.pop(resolved, None)
        elif state.started:
            state.seen[resolved] = digest(content)
            _cap(state.seen, SEEN_CAP)


def patch_failed(ctx: ToolContext, path: str) -> int:
    """One more "old_string not found" failure on `path`; returns how many in a row."""
    state = tracker(ctx)
    resolved = resolve(ctx, path)
    with state.lock:
        failures = state.patch_failures
        if resolved not in failures and len(failures) >= PATCH_FAILURES_CAP:
            del failures[next(iter(failures))]
        failures[resolved] = failures.get(resolved, 0) + 1
        return failures[resolved]


def patch_succeeded(ctx: ToolContext, paths: list[str]) -> None:
    state = ctx.state.get(_STATE)
    if state is None:
        return
    with state.lock:
        for path in paths:
            state.patch_failures.pop(resolve(ctx, path), None)


def patch_hint(path: str, failures: int) -> str:
    """The `_hint` of a replace that did not find old_string, escalating from the 3rd failure."""
    if failures < PATCH_ESCALATE_AT:
        return ("old_string was not found. Read the file with read_file to see its current text, or "
                "locate the text with search_files.")
    return (f"Failure number {failures} patching {path!r}. Stop retrying small variations of the same "
            "old_string. Either read the file again to see what it holds now, or give a longer "
            "old_string with more surrounding lines so it is unique, or rewrite the whole file with "
            "write_file if the place is hard to pin down.")


def is_status_text(content: str) -> bool:
    """True when `content` is mostly the "unchanged" message (a model pasting it as file content)."""
    text = content.strip()
    return bool(text) and UNCHANGED_MESSAGE in text and len(text) <= 2 * len(UNCHANGED_MESSAGE)
