"""Toolset "code_execution": run a Python program in the session's sandbox."""

from __future__ import annotations

import secrets
from typing import Any

from hermes_core.sandbox import DEFAULT_OUTPUT_CAP_BYTES, SandboxError
from hermes_core.sandbox.output import truncate_output
from hermes_core.tools.registry import ToolContext, ToolError, tool

TIMEOUT_S = 300  # as Hermes Agent's default: the model cannot choose it (there is no timeout argument)


@tool("code_execution")
def execute_code(ctx: ToolContext, code: str) -> dict[str, Any]:
    """Run a Python 3 program in the task's sandbox, from the task's working directory, and return
    its stdout, stderr and exit code separately. Every call is a fresh interpreter: variables and
    imports do not persist between calls, but files the program writes do. Modules in the working
    directory can be imported. Print whatever you need to see. A program running longer than five
    minutes is killed.

    Args:
        code: The complete Python source to run.
    """
    # Hidden files in the working directory itself: sys.path[0] is then that directory, so the
    # program imports the task's modules just like `python3 script.py` run there would.
    stem = f".hermes_exec_{secrets.token_hex(4)}"
    script, errors = f"{stem}.py", f"{stem}.stderr"
    try:
        ctx.sandbox.write_file(script, code.encode("utf-8"))
        try:
            run = ctx.sandbox.exec(f"python3 {script} 2> {errors}", timeout=TIMEOUT_S)
            try:
                stderr, stderr_truncated = truncate_output(ctx.sandbox.read_file(errors), DEFAULT_OUTPUT_CAP_BYTES)
            except FileNotFoundError:
                stderr, stderr_truncated = "", False
        finally:
            ctx.sandbox.exec(f"rm -f {script} {errors}", timeout=30)
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc
    result: dict[str, Any] = {"stdout": run.output, "stderr": stderr, "exit_code": run.exit_code}
    if run.timed_out:
        result["timed_out"] = True
    if run.truncated or stderr_truncated:
        result["truncated"] = True
    return result
