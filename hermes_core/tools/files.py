"""Toolset "file": read, write, patch and search files in the session's sandbox."""

from __future__ import annotations

import shlex
from typing import Any, Literal

from hermes_core.sandbox.base import DEFAULT_OUTPUT_CAP_BYTES, SandboxError
from hermes_core.tools.registry import ToolContext, ToolError, tool

MAX_READ_LINES = 2000  # default page size of read_file
MAX_SEARCH_RESULTS = 100
MAX_MATCH_CHARS = 500  # a minified file must not fill a whole search result with one line


def _read_bytes(ctx: ToolContext, path: str) -> bytes:
    try:
        return ctx.sandbox.read_file(path)
    except FileNotFoundError as exc:
        raise ToolError(f"file not found: {path}") from exc
    except (SandboxError, OSError) as exc:
        raise ToolError(str(exc)) from exc


def _read_text(ctx: ToolContext, path: str) -> str:
    data = _read_bytes(ctx, path)
    try:
        if b"\x00" in data[:8192]:
            raise UnicodeError
        return data.decode("utf-8")
    except UnicodeError as exc:
        raise ToolError(f"{path} is a binary file ({len(data)} bytes), not UTF-8 text; inspect it with "
                        "the terminal instead (e.g. `file`, `xxd | head`)") from exc


def _write_text(ctx: ToolContext, path: str, content: str) -> tuple[str, int]:
    data = content.encode("utf-8")
    try:
        return ctx.sandbox.write_file(path, data), len(data)
    except (SandboxError, OSError) as exc:
        raise ToolError(str(exc)) from exc


@tool("file", read_only=True)
def read_file(ctx: ToolContext, path: str, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
    """Read a UTF-8 text file from the sandbox, a page of lines at a time (up to 2000 lines or
    64 KiB per call). Returns the exact text (no line numbers, so it can be copied into `patch`),
    the file's total_lines and, when more lines remain, the next_offset to continue from.

    Args:
        path: File path, relative to the task's working directory or absolute.
        offset: Number of lines to skip from the start of the file (0 reads from the first line).
        limit: Maximum number of lines to return (default 2000).
    """
    if offset < 0:
        raise ToolError("offset must be 0 or more")
    if limit is not None and limit < 1:
        raise ToolError("limit must be 1 or more")
    lines = _read_text(ctx, path).splitlines(keepends=True)
    if offset and offset >= len(lines):
        raise ToolError(f"offset {offset} is past the end of {path} ({len(lines)} lines)")
    chosen: list[str] = []
    size = 0
    for line in lines[offset : offset + (limit or MAX_READ_LINES)]:
        size += len(line.encode("utf-8"))
        if size > DEFAULT_OUTPUT_CAP_BYTES:
            if not chosen:  # a single giant line: show its start rather than nothing
                chosen.append(line[: DEFAULT_OUTPUT_CAP_BYTES // 4] + "...[line truncated]\n")
            break
        chosen.append(line)
    result: dict[str, Any] = {
        "path": path,
        "content": "".join(chosen),
        "total_lines": len(lines),
        "offset": offset,
        "lines_returned": len(chosen),
    }
    if offset + len(chosen) < len(lines):
        result["next_offset"] = offset + len(chosen)
    return result


@tool("file")
def write_file(ctx: ToolContext, path: str, content: str) -> dict[str, Any]:
    """Create or overwrite a text file in the sandbox with exactly `content` (UTF-8), creating missing
    parent folders. Use `patch` to change part of an existing file.

    Args:
        path: File path, relative to the task's working directory or absolute (inside the sandbox).
        content: The complete new content of the file.
    """
    written, size = _write_text(ctx, path, content)
    return {"path": written, "bytes_written": size}


@tool("file")
def patch(ctx: ToolContext, path: str, old_string: str, new_string: str, replace_all: bool = False) -> dict[str, Any]:
    """Edit a text file by replacing an exact piece of text. `old_string` must match the file
    character for character (whitespace and indentation included) and, unless replace_all is true,
    occur exactly once: include enough surrounding lines to make it unique.

    Args:
        path: File path, relative to the task's working directory or absolute.
        old_string: The exact text to replace.
        new_string: The text to put in its place (may be empty to delete old_string).
        replace_all: Replace every occurrence instead of requiring a unique match.
    """
    if not old_string:
        raise ToolError("old_string must not be empty; use write_file to create a file")
    if old_string == new_string:
        raise ToolError("old_string and new_string are identical; nothing to change")
    text = _read_text(ctx, path)
    count = text.count(old_string)
    if count == 0:
        raise ToolError(f"old_string not found in {path}; read the file and copy the exact text, "
                        "including whitespace and indentation")
    if count > 1 and not replace_all:
        raise ToolError(f"old_string occurs {count} times in {path}; add surrounding lines to make it "
                        "unique, or set replace_all=true")
    written, _ = _write_text(ctx, path, text.replace(old_string, new_string))
    return {"path": written, "replacements": count}


def _search_command(pattern: str, path: str, glob: str | None, target: str) -> str:
    start = shlex.quote("./" + path if path.startswith("-") else path)  # never parsed as an option
    if target == "filename":
        name = pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"
        return f"find {start} -name .git -prune -o -name {shlex.quote(name)} -print"
    # -Z puts a NUL after each file name, so names containing ':' still parse.
    include = f" --include={shlex.quote(glob)}" if glob else ""
    return f"grep -rnHIZE --color=never --exclude-dir=.git{include} -e {shlex.quote(pattern)} -- {start}"


@tool("file", read_only=True)
def search_files(ctx: ToolContext, pattern: str, path: str = ".", glob: str | None = None,
                 target: Literal["content", "filename"] = "content") -> dict[str, Any]:
    """Search the sandbox's files, recursively (skipping .git and binary files). With target
    "content", find lines matching a regular expression and return path, line number and text of
    each; with target "filename", find files and folders whose name matches a glob. At most 100
    results are returned.

    Args:
        pattern: For content: an extended regular expression (grep -E), e.g. "def \\w+_test".
            For filename: a name glob such as "*.py"; a plain word matches names containing it.
        path: File or folder to search in, relative to the task's working directory (default ".").
        glob: Content search only: restrict it to files whose name matches this glob, e.g. "*.py".
        target: "content" to search inside files, "filename" to search file names.
    """
    if not pattern:
        raise ToolError("pattern must not be empty")
    try:
        run = ctx.sandbox.exec(_search_command(pattern, path, glob, target))
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc
    if run.timed_out:
        raise ToolError("the search timed out; narrow the path, pattern or glob")
    lines = run.output.split("\n")
    if run.truncated:  # keep only the complete lines before the truncation marker
        lines = run.output.split("\n...[output truncated:", 1)[0].split("\n")[:-1]
    result: dict[str, Any]
    if target == "filename":
        root = "./" + path if path.startswith("-") else path
        found = sorted(line for line in lines if line.startswith(root))  # drops find's warnings
        result = {"files": found[:MAX_SEARCH_RESULTS], "count": min(len(found), MAX_SEARCH_RESULTS)}
        failed = run.exit_code != 0 and not found
    else:
        matches = []
        for line in lines:
            name, nul, rest = line.partition("\0")
            number, colon, text = rest.partition(":")
            if nul and colon and number.isdigit():  # anything else is a grep warning
                matches.append({"path": name, "line": int(number), "text": text[:MAX_MATCH_CHARS]})
        found = matches
        result = {"matches": matches[:MAX_SEARCH_RESULTS], "count": min(len(matches), MAX_SEARCH_RESULTS)}
        failed = run.exit_code not in (0, 1) and not matches  # grep: 1 means no match
    if failed:
        raise ToolError(f"search failed: {run.output.strip() or f'exit code {run.exit_code}'}")
    if len(found) > MAX_SEARCH_RESULTS or run.truncated:
        result["truncated"] = True
        result["note"] = "there are more results than shown; narrow the path, pattern or glob"
    return result
