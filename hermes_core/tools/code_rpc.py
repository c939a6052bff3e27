"""Tool calls from inside `execute_code` programs: the generated `hermes_tools` module and the parent's
side of its channel.

The channel is two kinds of files in a private folder of the sandbox, read and written through the
`Sandbox` file interface, because that is what every backend has (docker and modal sandboxes cannot
feed a background process's stdin, and the sandbox has no network): the program writes
`rpc/req_NNNNNN` (atomically), the parent answers with `rpc/res_NNNNNN`: the tool's result text as one
JSON string literal and a newline, so that a half-written answer is recognisable.
The program's stdout and stderr are not involved, so they hold exactly what it printed.

Everything arriving on the channel is untrusted: the parent checks the JSON shape, the tool name
(only sandbox tools the session offers), the call budget, and lets the registry validate the
arguments; whatever it reads, it answers with an `{"error": ...}` instead of raising. A request is
read only if it is a regular file of at most MAX_REQUEST_BYTES (a FIFO could hold the read, a huge
file the parent's memory). It stops serving when the program has ended, so a program that dies in
the middle of a call, or never reads its answer, cannot hold it; and when the sandbox has failed for
good (SandboxFailed, raised to the caller), rather than asking it again and again. Requests it cannot
read are answered ever more slowly, so a sandbox failing every read is never asked in a tight loop.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

from hermes_core.sandbox import SandboxError
from hermes_core.sandbox.base import SandboxFailed
from hermes_core.sandbox.base import DEFAULT_COMMAND_TIMEOUT_S
from hermes_core.tools.registry import ToolContext, registry

# Hermes Agent's sandbox tools: the program may call those of them the session offers.
SANDBOX_TOOLS = ("web_search", "web_extract", "read_file", "write_file", "search_files", "patch", "terminal")
MAX_TOOL_CALLS = 50  # per program, as the original's default
# terminal() from a program runs in the foreground only; these are dropped, as the original drops them.
_TERMINAL_DROPPED = ("background", "pty", "notify_on_complete", "watch_patterns")
_FIRST_POLL_S, _MAX_POLL_S = 0.01, 0.25
_MAX_ERROR_PAUSE_S = 2.0  # after each of consecutive unreadable requests: 0.02 s, 0.04 s, ... up to this
MAX_REQUEST_BYTES = 1 << 20  # a tool call's request file (its arguments as JSON)

_REQUIRED = object()
# The stubs' signatures: the original's parameter names, order, types and defaults (its interface).
_SIGNATURES: dict[str, list[tuple[str, str, Any]]] = {
    "web_search": [("query", "str", _REQUIRED), ("limit", "int", 5)],
    "web_extract": [("urls", "list", _REQUIRED), ("char_limit", "int", None)],
    "read_file": [("path", "str", _REQUIRED), ("offset", "int", 1), ("limit", "int", 500)],
    "write_file": [("path", "str", _REQUIRED), ("content", "str", _REQUIRED), ("cross_profile", "bool", False)],
    "search_files": [("pattern", "str", _REQUIRED), ("target", "str", "content"), ("path", "str", "."),
                     ("file_glob", "str", None), ("limit", "int", 50), ("offset", "int", 0),
                     ("output_mode", "str", "content"), ("context", "int", 0)],
    "patch": [("path", "str", None), ("old_string", "str", None), ("new_string", "str", None),
              ("replace_all", "bool", False), ("mode", "str", "replace"), ("patch", "str", None),
              ("cross_profile", "bool", False)],
    "terminal": [("command", "str", _REQUIRED), ("timeout", "int", None), ("workdir", "str", None)],
}
_DOCS = {
    "web_search": "Search the web; returns {'data': {'web': [{'url', 'title', 'description'}, ...]}}.",
    "web_extract": "Fetch pages as markdown; returns {'results': [{'url', 'title', 'content', 'error'}, ...]}.",
    "read_file": "Read a text file from line `offset` (1 = first); returns {'content', 'total_lines', ...}.",
    "write_file": "Replace a file's whole content (parent folders are created).",
    "search_files": "Search file contents (target='content') or file names (target='files').",
    "patch": "Replace old_string by new_string in a file (mode='replace'), or apply a V4A patch (mode='patch').",
    "terminal": "Run a shell command in the foreground; returns {'output', 'exit_code', ...}.",
}
STUB_SOURCE = Path(__file__).with_name("code_stub.py")


def callable_tools(ctx: ToolContext) -> list[str]:
    """The sandbox tools this session offers (sorted). A context that does not say what was offered
    allows every sandbox tool whose backend is configured."""
    if ctx.offered is not None:
        return sorted(name for name in SANDBOX_TOOLS if name in ctx.offered)
    return sorted(name for name in SANDBOX_TOOLS
                  if (tool := registry.get(name)) is not None and tool.unavailable_reason(ctx.backends) is None)


def stub_module(offered: list[str]) -> str:
    """Source of the `hermes_tools` module with a function for each tool in `offered`."""
    parts = [STUB_SOURCE.read_text(encoding="utf-8"),
             f"\n\n_OFFERED = {tuple(offered)!r}\n_ALL_SANDBOX_TOOLS = {SANDBOX_TOOLS!r}\n"]
    for name in offered:
        params = ", ".join(f"{p}: {kind}" if default is _REQUIRED else f"{p}: {kind} = {default!r}"
                           for p, kind, default in _SIGNATURES[name])
        payload = ", ".join(f"{p!r}: {p}" for p, _, _ in _SIGNATURES[name])
        parts.append(f"\n\ndef {name}({params}):\n    {_DOCS[name]!r}\n    return _call({name!r}, {{{payload}}})\n")
    return "".join(parts)


class ToolChannel:
    """The parent's side: answers one program's requests, in order, until the program has ended."""

    def __init__(self, ctx: ToolContext, folder: str, offered: list[str], deadline: float,
                 max_calls: int = MAX_TOOL_CALLS) -> None:
        self.ctx, self.folder, self.offered, self.deadline, self.max_calls = ctx, folder, offered, deadline, max_calls
        self.calls_made = 0

    def serve(self, finished: threading.Event) -> None:
        """Answer requests until `finished` is set (the program has exited or was killed); raises
        SandboxFailed when the sandbox has failed for good."""
        number, pause, error_pause = 1, _FIRST_POLL_S, _FIRST_POLL_S
        while not finished.is_set():
            request = f"{self.folder}/req_{number:06d}"
            try:
                raw: bytes | None = self.ctx.sandbox.read_file(request, MAX_REQUEST_BYTES)
            except FileNotFoundError:
                finished.wait(pause)
                pause = min(pause * 1.5, _MAX_POLL_S)
                continue
            except SandboxFailed:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. a folder, a FIFO, too large: answered, not fatal
                raw, unreadable = None, str(exc) or type(exc).__name__
            if finished.is_set():
                break  # the program is gone: nobody would read the answer
            if raw is None:
                self._reply(number, _error(f"unreadable request (a request is a regular file of at most "
                                           f"{MAX_REQUEST_BYTES >> 20} MiB): {unreadable}"))
                error_pause = min(error_pause * 2, _MAX_ERROR_PAUSE_S)
                finished.wait(error_pause)
            else:
                self._reply(number, self.answer(raw))
                error_pause = _FIRST_POLL_S
            number, pause = number + 1, _FIRST_POLL_S

    def _reply(self, number: int, answer: str) -> None:
        # One ASCII line ending in a newline: the program knows a half-written answer by its missing end.
        line = json.dumps(answer) + "\n"
        try:
            self.ctx.sandbox.write_file(f"{self.folder}/res_{number:06d}", line.encode("ascii"))
        except (SandboxError, OSError):
            pass  # the program (or its folder) is gone: nobody waits for this answer

    def answer(self, raw: bytes) -> str:
        """The text the program gets for one request; never raises."""
        try:
            request = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            return _error(f"invalid request (not JSON): {exc}")
        if not isinstance(request, dict) or not isinstance(request.get("tool"), str):
            return _error('invalid request: expected {"tool": NAME, "args": {...}}')
        name, args = request["tool"], request.get("args", {})
        if name not in self.offered:
            callable_here = ", ".join(self.offered) or "none"
            return _error(f"tool {name!r} cannot be called from execute_code in this session "
                          f"(callable: {callable_here})")
        if not isinstance(args, dict):
            return _error(f"{name}: the arguments must be a JSON object")
        if self.calls_made >= self.max_calls:
            return _error(f"this program has already made {self.max_calls} tool calls, the most one "
                          "execute_code run may make; no further calls are carried out")
        self.calls_made += 1
        return self._run(name, args)

    def _run(self, name: str, args: dict[str, Any]) -> str:
        # An omitted argument arrives as null (the stubs send every parameter): the tool's default applies.
        args = {key: value for key, value in args.items() if value is not None}
        if name == "terminal":
            for key in _TERMINAL_DROPPED:
                args.pop(key, None)
            # Never past the program's own deadline: the run must end when the program is killed.
            remaining = max(1, int(self.deadline - time.monotonic()) + 1)
            requested = args.get("timeout")
            if requested is None and remaining < DEFAULT_COMMAND_TIMEOUT_S:
                args["timeout"] = remaining
            elif isinstance(requested, (int, float)) and not isinstance(requested, bool):
                args["timeout"] = min(requested, remaining)  # anything else: the tool's own check refuses it
        try:
            return registry.call(name, args, self.ctx)
        except Exception as exc:  # noqa: BLE001 - nothing a program sends may break the parent
            return _error(f"{name}: {type(exc).__name__}: {exc}")


def _error(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


def serve_while(run: Callable[[], Any], channel: ToolChannel | None) -> Any:
    """`run()` (the program, blocking) with `channel` answering its tool calls meanwhile; returns what
    `run` returned, or raises what it raised. Without a channel, just `run()`."""
    if channel is None:
        return run()
    finished, outcome = threading.Event(), {}

    def target() -> None:
        try:
            outcome["value"] = run()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            outcome["error"] = exc
        finally:
            finished.set()

    worker = threading.Thread(target=target, name="hermes-execute-code", daemon=True)
    worker.start()
    try:
        channel.serve(finished)
    finally:
        worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
