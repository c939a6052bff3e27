"""Toolset "terminal": shell commands in the session's sandbox, in the foreground or as background
processes that the `process` tool lists, polls, reads, waits for, kills and types into."""

from __future__ import annotations

import posixpath
import re
import shlex
import time
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from hermes_core.sandbox.base import DEFAULT_COMMAND_TIMEOUT_S, ProcessStatus, Sandbox, SandboxError
from hermes_core.tools.registry import ToolContext, ToolError, tool

MAX_TIMEOUT_S = 3600  # longer jobs belong in the background
WAIT_LIMIT_S = int(DEFAULT_COMMAND_TIMEOUT_S)  # the longest single `wait`, like a foreground command's default
WAIT_POLL_S = 0.2
LOG_LINES = 200  # what `log` shows without offset/limit: the last 200 lines
_STATE = "terminal.processes"  # ctx.state key: what the tools remember of each background process
_SESSION_ID = re.compile(r"(?:proc_)?(\d+)")
NO_NOTIFICATIONS = ("a batch run delivers no notifications: check on the process with "
                    "process(action='poll') or process(action='wait')")


def _session_id(process_id: int) -> str:
    return f"proc_{process_id}"


def _remembered(ctx: ToolContext) -> dict[int, dict[str, Any]]:
    return ctx.state.setdefault(_STATE, {})


@tool("terminal")
def terminal(ctx: ToolContext, command: str, background: Annotated[bool, {"default": False}] = False,
             timeout: Annotated[int | None, {"minimum": 1}] = None, workdir: str | None = None,
             pty: Annotated[bool, {"default": False}] = False,
             notify_on_complete: Annotated[bool, {"default": False}] = False,
             watch_patterns: list[str] | None = None) -> dict[str, Any]:
    """Run a shell command (bash) in the task's sandbox; returns its combined stdout/stderr and exit code.
    Each call is a fresh shell in the task's working directory: chain dependent steps with `&&`.
    Foreground commands get no input (use `-y`, `--no-pager`, ...). Start servers, long jobs and
    programs that read input with background=true and manage them with `process`.

    Args:
        command: The shell command line to run.
        background: Start it in the background and return its session_id at once.
        timeout: Seconds before a foreground command and its children are killed (default 180, at most 3600).
        workdir: Directory to run in (absolute or relative); default: the task's working directory.
        pty: Give a background command a pseudo-terminal (REPLs and other interactive programs).
        notify_on_complete: Mark a background command to report its exit; a batch run delivers no
            notifications, so use process poll/wait.
        watch_patterns: Strings to watch for in a background command's output (process list: watch_hit).
    """
    if workdir:
        command_line = f"cd -- {shlex.quote(workdir)} && {command}"
    else:
        command_line = command
    try:
        if background:
            return _start(ctx, command, command_line, workdir, pty, notify_on_complete, watch_patterns)
        if timeout is not None and not 1 <= timeout <= MAX_TIMEOUT_S:
            raise ToolError(f"timeout must be between 1 and {MAX_TIMEOUT_S} seconds; "
                            "run longer commands with background=true")
        result = ctx.sandbox.exec(command_line, timeout=timeout)
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc
    reply: dict[str, Any] = {"output": result.output, "exit_code": result.exit_code}
    if result.timed_out:
        reply["timed_out"] = True
    if result.truncated:
        reply["truncated"] = True
    return reply


def _start(ctx: ToolContext, command: str, command_line: str, workdir: str | None, pty: bool,
           notify_on_complete: bool, watch_patterns: list[str] | None) -> dict[str, Any]:
    """Start a background process and remember what `process` reports about it besides its state."""
    sandbox = ctx.sandbox
    reply: dict[str, Any] = {"output": "Background process started"}
    if pty and type(sandbox).spawn_pty is Sandbox.spawn_pty:  # this backend has no terminals
        process_id, pty = sandbox.spawn(command_line), False
        reply["pty_note"] = f"{type(sandbox).__name__} cannot give processes a terminal; started without one"
    else:
        process_id = sandbox.spawn_pty(command_line) if pty else sandbox.spawn(command_line)
    if notify_on_complete and watch_patterns:  # one signal is enough: the exit, as the original decides
        reply["watch_patterns_ignored"] = "watch_patterns ignored because notify_on_complete is set"
        watch_patterns = None
    cwd = posixpath.normpath(posixpath.join(sandbox.cwd, workdir or "."))  # where `cd workdir` lands
    _remembered(ctx)[process_id] = {"command": command, "cwd": cwd,
                                    "started": time.time(), "pty": pty, "notify_on_complete": notify_on_complete,
                                    "watch_patterns": list(watch_patterns or [])}
    reply.update(session_id=_session_id(process_id), exit_code=0, error=None)
    if notify_on_complete:
        reply["notify_on_complete"] = True
    if watch_patterns:
        reply["watch_patterns"] = list(watch_patterns)
    if notify_on_complete or watch_patterns:
        reply["note"] = NO_NOTIFICATIONS
    return reply


class _NotFound(Exception):
    """An unknown session_id: reported as the original reports it, `{"status": "not_found", ...}`."""


def _lookup(ctx: ToolContext, session_id: str) -> tuple[int, ProcessStatus]:
    """The sandbox's process id and current state of `session_id` ("proc_N"; a bare N is accepted too)."""
    match = _SESSION_ID.fullmatch(session_id.strip())
    if match:
        try:
            return int(match.group(1)), ctx.sandbox.poll(int(match.group(1)))
        except SandboxError:
            pass
    known = ", ".join(_session_id(status.process_id) for status in ctx.sandbox.processes()) or "none"
    raise _NotFound(f"No process with ID {session_id} (known: {known})")


def _state(status: ProcessStatus) -> str:
    return "running" if status.running else "exited"


def _entry(ctx: ToolContext, status: ProcessStatus) -> dict[str, Any]:
    """A `list` row: the process's state, where and when it started, and what it is watched for."""
    info = _remembered(ctx).get(status.process_id, {})
    started = info.get("started", time.time())
    entry: dict[str, Any] = {
        "session_id": _session_id(status.process_id), "command": info.get("command", status.command)[:200],
        "cwd": info.get("cwd", ctx.sandbox.cwd),
        "started_at": datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
        "uptime_seconds": int(time.time() - started), "status": _state(status),
        "output_preview": status.output[-200:]}
    if info.get("watch_patterns"):
        entry["watch_patterns"] = info["watch_patterns"]
        entry["watch_hit"] = any(pattern in status.output for pattern in info["watch_patterns"])
    if info.get("notify_on_complete"):
        entry["notify_on_complete"] = True
    if not status.running:
        entry["exit_code"] = status.exit_code
    return entry


def _log(ctx: ToolContext, status: ProcessStatus, offset: int, limit: int) -> dict[str, Any]:
    lines = status.output.splitlines()
    selected = lines[-limit:] if offset == 0 else lines[offset:offset + limit]  # 0: the last `limit` lines
    reply = {"session_id": _session_id(status.process_id), "command": _command(ctx, status),
             "status": _state(status), "output": "\n".join(selected), "total_lines": len(lines),
             "showing": f"{len(selected)} lines"}
    if status.truncated:
        reply["truncated"] = True  # the middle of a very long log is left out
    return reply


def _command(ctx: ToolContext, status: ProcessStatus) -> str:
    return _remembered(ctx).get(status.process_id, {}).get("command", status.command)


def _wait(ctx: ToolContext, process_id: int, status: ProcessStatus, timeout: int | None) -> dict[str, Any]:
    """Block until the process exits or `timeout` seconds (at most WAIT_LIMIT_S) have passed."""
    limit = min(timeout or WAIT_LIMIT_S, WAIT_LIMIT_S)
    deadline = time.monotonic() + limit
    while status.running and time.monotonic() < deadline:
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))
        status = ctx.sandbox.poll(process_id)
    if status.running:
        reply = {"status": "timeout", "command": _command(ctx, status), "output": status.output[-1000:],
                 "timeout_note": f"Waited {limit}s, process still running"}
    else:
        reply = {"status": "exited", "command": _command(ctx, status), "exit_code": status.exit_code,
                 "output": status.output[-2000:]}
    if timeout and timeout > WAIT_LIMIT_S:
        reply["timeout_note"] = f"Requested wait of {timeout}s was clamped to the limit of {WAIT_LIMIT_S}s"
    return reply


def _input(ctx: ToolContext, process_id: int, data: bytes | None) -> dict[str, Any]:
    """`write`/`submit` (data) or `close` (None) on a running process's stdin."""
    terminal_input = _remembered(ctx).get(process_id, {}).get("pty", False)
    if data is None:
        ctx.sandbox.close_stdin(process_id)
        return {"status": "ok", "message": "EOF sent" if terminal_input else "stdin closed"}
    ctx.sandbox.write_stdin(process_id, data)
    return {"status": "ok", "bytes_written": len(data)}


@tool("terminal")
def process(ctx: ToolContext, action: Literal["list", "poll", "log", "wait", "kill", "write", "submit", "close"],
            session_id: str | None = None, data: str | None = None,
            timeout: Annotated[int | None, {"minimum": 1}] = None, offset: int | None = None,
            limit: Annotated[int | None, {"minimum": 1}] = None) -> dict[str, Any]:
    """Manage background processes from terminal(background=true): list, poll (state, latest output),
    log (output by lines), wait (until exit or timeout), kill, and stdin input: write (raw text),
    submit (text plus Enter), close (end of input).

    Args:
        action: The action to take.
        session_id: The session_id from terminal; required except for list.
        data: Text for write or submit.
        timeout: Seconds wait blocks at most (default and limit 180).
        offset: First line for log (0-based); default: the last lines.
        limit: Lines for log (default 200).
    """
    if action == "list":
        return {"processes": [_entry(ctx, status) for status in ctx.sandbox.processes()]}
    if not session_id:
        raise ToolError(f"session_id is required for {action}")
    for name, value in (("timeout", timeout), ("limit", limit)):
        if value is not None and value < 1:
            raise ToolError(f"{name} must be at least 1")
    if offset is not None and offset < 0:
        raise ToolError("offset must not be negative")
    try:
        process_id, status = _lookup(ctx, str(session_id))
        if action == "poll":
            reply = {"session_id": _session_id(process_id), "command": _command(ctx, status),
                     "status": _state(status), "uptime_seconds": _entry(ctx, status)["uptime_seconds"],
                     "output_preview": status.output[-1000:]}
            return reply if status.running else {**reply, "exit_code": status.exit_code}
        if action == "log":
            return _log(ctx, status, offset or 0, limit or LOG_LINES)
        if action == "wait":
            return _wait(ctx, process_id, status, timeout)
        if action == "kill":
            if not status.running:
                return {"status": "already_exited", "command": _command(ctx, status),
                        "exit_code": status.exit_code, "output": status.output[-2000:]}
            return {"status": "killed", "session_id": _session_id(process_id),
                    "output": ctx.sandbox.kill(process_id).output[-2000:]}
        if action in ("write", "submit", "close"):
            if not status.running:
                return {"status": "already_exited", "error": f"Process {session_id} has already finished"}
            text = None if action == "close" else (data or "") + ("\n" if action == "submit" else "")
            return _input(ctx, process_id, None if text is None else text.encode())
    except _NotFound as exc:
        return {"status": "not_found", "error": str(exc)}
    except SandboxError as exc:
        return {"status": "error", "error": str(exc)}
    raise ToolError(f"Unknown process action: {action}. Use: list, poll, log, wait, kill, write, submit, close")
