"""Toolset "terminal": shell commands in the session's sandbox, in the foreground or background."""

from __future__ import annotations

from typing import Any, Literal

from hermes_core.sandbox.base import ProcessStatus, SandboxError
from hermes_core.tools.registry import ToolContext, ToolError, tool

MAX_TIMEOUT_S = 3600  # longer jobs belong in the background


def _status(status: ProcessStatus, with_output: bool = True) -> dict[str, Any]:
    result: dict[str, Any] = {
        "process_id": status.process_id,
        "command": status.command,
        "status": "running" if status.running else "exited",
        "exit_code": status.exit_code,
    }
    if with_output:
        result["output"] = status.output
        if status.truncated:
            result["truncated"] = True
    return result


@tool("terminal")
def terminal(ctx: ToolContext, command: str, timeout: int | None = None, background: bool = False) -> dict[str, Any]:
    """Run a shell command (bash) in the task's sandbox and return its combined stdout/stderr and exit code.
    Each call starts a fresh shell in the task's working directory: `cd` and exported variables do not
    carry over between calls, so chain dependent steps with `&&`. Stdin is closed, so use
    non-interactive flags (`-y`, `--no-pager`, ...). A non-zero exit code is reported, not an error.
    Very long output keeps only its beginning and end. Start servers, watchers and other
    long-running commands with background=true and check on them with the `process` tool.

    Args:
        command: The shell command line to run, e.g. "ls -la && python3 -m pytest -q".
        timeout: Seconds to wait before the command and every process it started are killed
            (default 180, at most 3600). Ignored for background commands.
        background: Start the command in the background and return its process_id at once instead
            of waiting for it to finish.
    """
    try:
        if background:
            return {"process_id": ctx.sandbox.spawn(command), "status": "started"}
        if timeout is not None and not 1 <= timeout <= MAX_TIMEOUT_S:
            raise ToolError(f"timeout must be between 1 and {MAX_TIMEOUT_S} seconds; "
                            "run longer commands with background=true")
        result = ctx.sandbox.exec(command, timeout=timeout)
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc
    reply: dict[str, Any] = {"output": result.output, "exit_code": result.exit_code}
    if result.timed_out:
        reply["timed_out"] = True
    if result.truncated:
        reply["truncated"] = True
    return reply


@tool("terminal")
def process(ctx: ToolContext, action: Literal["list", "poll", "kill"], process_id: int | None = None) -> dict[str, Any]:
    """Manage background commands started with terminal(background=true): list them all, poll one for
    its status, exit code and output so far, or kill one together with every process it started.

    Args:
        action: "list" all background commands (without output), "poll" one for its status and
            output, or "kill" one.
        process_id: The process_id returned by terminal(background=true); required for poll and kill.
    """
    try:
        if action == "list":
            return {"processes": [_status(status, with_output=False) for status in ctx.sandbox.processes()]}
        if process_id is None:
            raise ToolError(f"process_id is required for action {action!r}")
        if action == "poll":
            return _status(ctx.sandbox.poll(process_id))
        if action == "kill":
            return _status(ctx.sandbox.kill(process_id))
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc
    raise ToolError(f"unknown action {action!r}; use list, poll or kill")
