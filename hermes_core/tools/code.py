"""Toolset "code_execution": run a Python program in the session's sandbox, which may call some of the
session's tools itself through `from hermes_tools import ...` (the channel: hermes_core/tools/code_rpc.py).

The result has Hermes Agent's shape: `status` (success, error, timeout), `output` (what the program
printed), `exit_code`, `tool_calls_made`, `duration_seconds` and the stdout_* byte counts, plus
`error` when it failed. The calls a program makes are not tool calls of the conversation."""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

from hermes_core.sandbox import SandboxError
from hermes_core.sandbox.base import ExecResult, SandboxFailed
from hermes_core.tools import code_rpc
from hermes_core.tools.registry import ToolContext, ToolError, tool

TIMEOUT_S = 300  # as Hermes Agent's default: the model cannot choose it (there is no timeout argument)
MAX_STDOUT_BYTES = 50_000  # what the model gets of stdout: its first 40% and last 60% beyond this
MAX_STDERR_BYTES = 10_000  # of stderr: the beginning (errors come first)
TIMEOUT_EXIT_CODE = 124  # `timeout`'s convention, as the original's remote backends report a killed script
# The sandbox's own cap on command output (hermes_core.sandbox.output) marks what it left out so.
_SANDBOX_CUT = re.compile(r"\n\.\.\.\[output truncated: (\d+) bytes omitted\]\.\.\.\n")


@tool("code_execution")
def execute_code(ctx: ToolContext, code: str) -> dict[str, Any]:
    """Run a Python 3 program in the task's sandbox, from the task's working directory, and return what
    it printed. The program can call the session's tools itself: `from hermes_tools import terminal,
    read_file, ...` gives it those of web_search, web_extract, read_file, write_file, search_files,
    patch and terminal that this session offers, each returning the tool's result as a dict (a
    failure as {"error": ...}); hermes_tools also has json_parse(text), shell_quote(s) and
    retry(fn, max_attempts=3, delay=2). Use it to chain several tool calls with logic in between, or
    to boil a large output down before reading it. Every run is a fresh interpreter (files it writes
    stay). Limits: 5 minutes, 50 tool calls, 50 KB of printed output; terminal() runs in the
    foreground only.

    Args:
        code: The complete Python source to run; import tools from hermes_tools and print what you need.
    """
    if not code.strip():
        raise ToolError("no code to run: `code` is empty")
    started = time.monotonic()
    # A hidden folder in the working directory (every backend can write there): the program, the
    # hermes_tools module and the channel's files. Modules of the working directory stay importable.
    folder = f".hermes_exec_{secrets.token_hex(4)}"
    channel = None
    try:
        ctx.sandbox.write_file(f"{folder}/script.py", code.encode("utf-8"))
        if "hermes_tools" in code:  # only then the module exists, and the parent answers its calls
            offered = code_rpc.callable_tools(ctx)
            ctx.sandbox.write_file(f"{folder}/hermes_tools.py", code_rpc.stub_module(offered).encode("utf-8"))
            channel = code_rpc.ToolChannel(ctx, f"{folder}/rpc", offered, started + TIMEOUT_S)
        command = (f'PYTHONPATH="$PWD${{PYTHONPATH:+:$PYTHONPATH}}" PYTHONDONTWRITEBYTECODE=1 '
                   f'python3 "$PWD/{folder}/script.py" 2> {folder}/stderr')
        try:
            run: ExecResult = code_rpc.serve_while(lambda: ctx.sandbox.exec(command, timeout=TIMEOUT_S), channel)
        finally:
            stderr = ctx.sandbox.exec(f"head -c {MAX_STDERR_BYTES} {folder}/stderr 2>/dev/null; rm -rf {folder}",
                                      timeout=30).output
    except SandboxFailed:
        raise  # not the program's error: the sample's sandbox is broken (registry.call)
    except SandboxError as exc:
        return {"status": "error", "error": str(exc), "tool_calls_made": channel.calls_made if channel else 0,
                "duration_seconds": round(time.monotonic() - started, 2)}
    return _result(run, stderr, channel.calls_made if channel else 0, round(time.monotonic() - started, 2))


def _result(run: ExecResult, stderr: str, calls: int, duration: float) -> dict[str, Any]:
    stdout, counts = _capped_stdout(run)
    exit_code = TIMEOUT_EXIT_CODE if run.timed_out else run.exit_code
    result: dict[str, Any] = {"status": "success", "output": stdout, "exit_code": exit_code,
                              "tool_calls_made": calls, "duration_seconds": duration, **counts}
    if run.timed_out:
        message = f"The program ran longer than {TIMEOUT_S} s and was stopped."
        result.update(status="timeout", error=message, output=f"{stdout}\n\n{message}" if stdout else message)
    elif exit_code != 0:
        # As the original: stderr is shown when the program failed (a success shows stdout only).
        result.update(status="error", error=stderr or f"The program ended with exit code {exit_code}.")
        if stderr:
            result["output"] = f"{stdout}\n--- stderr ---\n{stderr}"
    return result


def _capped_stdout(run: ExecResult) -> tuple[str, dict[str, Any]]:
    """stdout as the model gets it (at most MAX_STDOUT_BYTES: head 40%, tail 60%) and its byte counts."""
    head, omitted, tail = run.output, 0, ""
    cut = _SANDBOX_CUT.search(run.output) if run.truncated else None
    if cut:  # already cut by the sandbox: its head and tail, and how much it left out
        head, omitted, tail = run.output[:cut.start()], int(cut.group(1)), run.output[cut.end():]
    head_bytes, tail_bytes = head.encode("utf-8"), tail.encode("utf-8")
    total = len(head_bytes) + omitted + len(tail_bytes)
    if total <= MAX_STDOUT_BYTES:
        text, captured = head, len(head_bytes)
    else:
        keep_head = int(MAX_STDOUT_BYTES * 0.4)
        keep_tail = MAX_STDOUT_BYTES - keep_head
        whole = head_bytes + tail_bytes  # what exists of it here
        first = whole[:min(keep_head, len(head_bytes))]
        last = whole[len(first):][-keep_tail:]
        captured = len(first) + len(last)
        text = (first.decode("utf-8", "replace")
                + f"\n\n... [stdout cut: {total - captured:,} of {total:,} bytes left out] ...\n\n"
                + last.decode("utf-8", "replace"))
    counts: dict[str, Any] = {"stdout_truncated": captured < total, "stdout_bytes_captured": captured,
                              "stdout_bytes_total": total, "stdout_bytes_omitted": total - captured}
    if captured < total:
        counts["warning"] = ("The program's stdout was cut (it did run completely); only its beginning and end "
                             "are shown. Print less, or write the data to a file, if the middle matters.")
    return text, counts
