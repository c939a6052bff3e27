"""Toolset "file": read, write, patch and search files in the session's sandbox.

The interface is Hermes Agent's (names, parameters, defaults and result keys); every file access
goes through the session's sandbox, so a path is always the sandbox's own.
"""

from __future__ import annotations

import difflib
import posixpath
import re
import shlex
from typing import Annotated, Any, Literal

from hermes_core.sandbox.base import SandboxError
from hermes_core.tools import file_search
from hermes_core.tools.registry import ToolContext, ToolError, tool
from hermes_core.tools.v4a import FileOp, PatchError, apply_hunks, parse_patch, replace_text

MAX_READ_LINES = 2000  # the most lines one read_file call returns
MAX_LINE_CHARS = 2000  # longer lines are cut, so a minified file cannot flood a page
MAX_READ_CHARS = 100_000  # a page stops at the last whole line within this many characters
DENSE_MATCHES = 5  # from this many content matches on, they are grouped by file as text

_NUMBERED_LINE = re.compile(r"^\s*(\d+)\|")


def _read_bytes(ctx: ToolContext, path: str) -> bytes:
    try:
        return ctx.sandbox.read_file(path)
    except FileNotFoundError as exc:
        raise ToolError(f"File not found: {path}") from exc
    except (SandboxError, OSError) as exc:
        raise ToolError(str(exc)) from exc


def _decode(data: bytes, path: str) -> str:
    try:
        if b"\x00" in data[:8192]:
            raise UnicodeError
        return data.decode("utf-8").removeprefix("\ufeff")  # a BOM is no character of the text
    except UnicodeError as exc:
        raise ToolError(f"{path} is a binary file ({len(data)} bytes), not UTF-8 text; inspect it with "
                        "the terminal instead (e.g. `file`, `xxd | head`), or vision_analyze for images") from exc


def _read_text(ctx: ToolContext, path: str) -> str:
    return _decode(_read_bytes(ctx, path), path)


def _write_text(ctx: ToolContext, path: str, content: str) -> tuple[str, int]:
    data = content.encode("utf-8")
    try:
        return ctx.sandbox.write_file(path, data), len(data)
    except (SandboxError, OSError) as exc:
        raise ToolError(str(exc)) from exc


def _lines(text: str) -> list[str]:
    """The file's lines without their terminators (a final newline ends the last line)."""
    body = text[:-1] if text.endswith("\n") else text
    return [line.removesuffix("\r") for line in body.split("\n")] if text else []


@tool("file", read_only=True)
def read_file(
    ctx: ToolContext,
    path: str,
    offset: Annotated[int, {"default": 1, "minimum": 1}] = 1,
    limit: Annotated[int, {"default": 500, "maximum": 2000}] = 500,
) -> dict[str, Any]:
    """Read a UTF-8 text file from the sandbox, a page of lines at a time. Each line comes back as
    `NUMBER|TEXT` (the number is not part of the file: leave it out of `patch` and `write_file`).
    A page ends after `limit` lines or about 100,000 characters; when more remains, `truncated` is
    true and the hint names the offset to continue from. Binary files and images are refused.

    Args:
        path: File path, relative to the task's working directory or absolute.
        offset: Line number to start at; 1 is the first line (default 1).
        limit: How many lines to return at most (default 500, at most 2000).
    """
    offset, limit = max(1, offset), max(1, min(limit, MAX_READ_LINES))  # clamp like the original
    data = _read_bytes(ctx, path)
    lines = _lines(_decode(data, path))
    total = len(lines)
    if offset > total and total:
        raise ToolError(f"offset {offset} is past the end of {path} ({total} lines)")
    numbered: list[str] = []
    size = 0
    for number, line in enumerate(lines[offset - 1 : offset - 1 + limit], start=offset):
        text = line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + "... [truncated]"
        entry = f"{number}|{text}"
        size += len(entry) + 1
        if size > MAX_READ_CHARS and numbered:
            break
        numbered.append(entry[:MAX_READ_CHARS])
    end = offset + len(numbered) - 1
    result: dict[str, Any] = {"content": "\n".join(numbered), "total_lines": total, "file_size": len(data),
                              "truncated": end < total}
    if end < min(offset - 1 + limit, total):  # the character budget ended the page early
        result.update(truncated_by="bytes", next_offset=end + 1)
    if result["truncated"]:
        result["hint"] = f"Use offset={end + 1} to continue reading (showing {offset}-{end} of {total} lines)"
    return result


def _looks_line_numbered(content: str) -> bool:
    """True when `content` is mostly read_file's `N|text` display (consecutive numbers), which a
    model sometimes pastes back as file content."""
    lines = [line for line in content.splitlines() if line.strip()]
    numbers = [int(m.group(1)) for m in map(_NUMBERED_LINE.match, lines) if m]
    if len(numbers) < 2 or len(numbers) < 0.6 * len(lines):
        return False
    return all(b == a + 1 for a, b in zip(numbers, numbers[1:]))


def _exists(ctx: ToolContext, path: str, test: str = "-e") -> bool:
    try:
        return ctx.sandbox.exec(f"test {test} {shlex.quote(path)}").exit_code == 0
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc


@tool("file")
def write_file(
    ctx: ToolContext,
    path: str,
    content: str,
    cross_profile: Annotated[bool, {"default": False}] = False,
) -> dict[str, Any]:
    """Create or overwrite a text file in the sandbox with exactly `content` (UTF-8), creating missing
    parent folders. The whole file is replaced: use `patch` to change part of an existing file.

    Args:
        path: File path, relative to the task's working directory or absolute (inside the sandbox).
        content: The complete new content of the file.
        cross_profile: Allow writing into another Hermes profile's folders (default false). A
            sandbox holds no Hermes profiles, so this changes nothing here.
    """
    del cross_profile  # Hermes Agent's guard for its own profile folders; none exist in a sandbox
    if _looks_line_numbered(content):
        raise ToolError("content looks like read_file output (NUMBER|text lines); write the file's real "
                        "text, without the line-number prefixes")
    parent = posixpath.dirname(path)
    dirs_created = bool(parent) and not _exists(ctx, parent, "-d")
    written, size = _write_text(ctx, path, content)
    return {"bytes_written": size, "dirs_created": dirs_created, "resolved_path": written,
            "files_modified": [written]}


def _diff(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"a/{path}", f"b/{path}"))


_Plan = tuple[dict[str, str | None], dict[str, str | None], list[str], list[str], list[str]]


def _plan_v4a(ctx: ToolContext, ops: list[FileOp]) -> _Plan:
    """Every operation worked out in memory, in order: the files' contents before and after, and
    the paths modified, created and deleted. Nothing is written."""
    files: dict[str, str | None] = {}  # path -> content after the operations so far (None: deleted)
    before: dict[str, str | None] = {}

    def current(path: str) -> str | None:
        if path not in files:
            try:
                files[path] = _read_text(ctx, path)
            except ToolError:
                if _exists(ctx, path):
                    raise
                files[path] = None
            before[path] = files[path]
        return files[path]

    modified, created, deleted = [], [], []
    for op in ops:
        old = current(op.path)
        if op.kind == "add":
            if old is not None:
                raise PatchError(f"cannot add {op.path}: it already exists (use *** Update File:)")
            files[op.path] = "\n".join(op.content) + "\n"
            created.append(op.path)
            continue
        if old is None:
            raise PatchError(f"cannot {op.kind} {op.path}: file not found")
        if op.kind == "delete":
            files[op.path] = None
            deleted.append(op.path)
            continue
        new = apply_hunks(old, op.hunks, op.path) if op.kind == "update" else old
        if op.new_path:
            if current(op.new_path) is not None:
                raise PatchError(f"cannot move {op.path} to {op.new_path}: the destination exists")
            files[op.path], files[op.new_path] = None, new
            modified.append(f"{op.path} -> {op.new_path}")
        else:
            files[op.path] = new
            modified.append(op.path)
    return files, before, modified, created, deleted


def _apply_v4a(ctx: ToolContext, ops: list[FileOp]) -> dict[str, Any]:
    """Validate the whole patch first, then write: a patch with one bad hunk changes nothing."""
    try:
        files, before, modified, created, deleted = _plan_v4a(ctx, ops)
    except (PatchError, ToolError) as exc:
        raise ToolError(f"patch not applied, no file was changed: {exc}") from exc
    diffs = []
    for path, content in files.items():  # write phase: only now does the sandbox change
        if content == before[path]:
            continue
        try:
            if content is None:
                ctx.sandbox.exec(f"rm -f -- {shlex.quote(path)}")
            else:
                _write_text(ctx, path, content)
        except (SandboxError, ToolError) as exc:
            raise ToolError(f"patch partly applied (stopped at {path}): {exc}") from exc
        diffs.append(_diff(before[path] or "", content or "", path))
    result: dict[str, Any] = {"success": True, "diff": "\n".join(d for d in diffs if d)}
    for key, paths in (("files_modified", modified), ("files_created", created), ("files_deleted", deleted)):
        if paths:
            result[key] = paths
    return result


@tool("file")
def patch(
    ctx: ToolContext,
    mode: Annotated[Literal["replace", "patch"], {"default": "replace"}],
    path: str | None = None,
    old_string: str | None = None,
    new_string: str | None = None,
    replace_all: Annotated[bool, {"default": False}] = False,
    patch: str | None = None,
    cross_profile: Annotated[bool, {"default": False}] = False,
) -> dict[str, Any]:
    """Edit files. Mode "replace" swaps one exact piece of text in `path` (`old_string` must occur
    once unless replace_all is true; lines differing only in surrounding whitespace still match).
    Mode "patch" applies a V4A patch that can update, add, delete and move several files at once;
    it is checked completely first, so a hunk that does not fit changes nothing. Returns a unified
    diff of the change.

    Args:
        mode: "replace" (needs path, old_string, new_string) or "patch" (needs patch).
        path: Replace mode: the file to edit, relative to the working directory or absolute.
        old_string: Replace mode: the text to find, copied exactly (without read_file's line numbers);
            include neighbouring lines to make it unique.
        new_string: Replace mode: the text to put in its place ("" deletes old_string).
        replace_all: Replace mode: change every occurrence instead of requiring one (default false).
        patch: Patch mode: the V4A patch text, from "*** Begin Patch" to "*** End Patch", with
            "*** Update File: PATH" sections of "@@ context" lines and " " / "-" / "+" lines,
            "*** Add File: PATH" followed by "+" lines, and "*** Delete File: PATH".
        cross_profile: Allow editing another Hermes profile's folders (default false). A sandbox
            holds no Hermes profiles, so this changes nothing here.
    """
    del cross_profile  # see write_file
    if mode == "patch":
        if not patch:
            raise ToolError("patch content required: mode 'patch' takes the V4A text in `patch`")
        try:
            ops = parse_patch(patch)
        except PatchError as exc:
            raise ToolError(f"invalid V4A patch: {exc}") from exc
        return _apply_v4a(ctx, ops)
    if mode != "replace":
        raise ToolError(f"unknown mode {mode!r}: use 'replace' or 'patch'")
    if not path:
        raise ToolError("path required: mode 'replace' edits the file named by `path`")
    if old_string is None or new_string is None:
        raise ToolError("old_string and new_string required in mode 'replace'")
    if old_string == new_string:
        raise ToolError("old_string and new_string are identical; nothing to change")
    text = _read_text(ctx, path)
    try:
        new, count = replace_text(text, old_string, new_string, replace_all, path)
    except PatchError as exc:
        raise ToolError(str(exc)) from exc
    written, _ = _write_text(ctx, path, new)
    return {"success": True, "diff": _diff(text, new, path), "files_modified": [written],
            "resolved_path": written, "replacements": count}


@tool("file", read_only=True)
def search_files(
    ctx: ToolContext,
    pattern: str,
    target: Annotated[Literal["content", "files"], {"default": "content"}] = "content",
    path: Annotated[str, {"default": "."}] = ".",
    file_glob: str | None = None,
    limit: Annotated[int, {"default": 50}] = 50,
    offset: Annotated[int, {"default": 0}] = 0,
    output_mode: Annotated[Literal["content", "files_only", "count"], {"default": "content"}] = "content",
    context: Annotated[int, {"default": 0}] = 0,
) -> dict[str, Any]:
    """Search the sandbox's files recursively, skipping hidden files and folders (.git...) and binary
    files. Target "content" finds lines matching a regular expression; target "files" finds files
    whose name matches a glob, newest first. Results come a page at a time (`limit`, `offset`);
    `total_count` tells how many there are and `truncated` that more remain.

    Args:
        pattern: For content: an extended regular expression, e.g. "def \\w+_test". For files: a
            name glob such as "*.py" (a plain word matches names containing it).
        target: "content" to search inside files (default), "files" to search file names.
        path: File or folder to search in, relative to the task's working directory (default ".").
        file_glob: Content search only: search just the files whose name matches this glob, e.g. "*.py".
        limit: Most results to return (default 50).
        offset: Results to skip first, for paging (default 0).
        output_mode: Content search only: "content" (matching lines with path and line number,
            the default), "files_only" (paths of matching files) or "count" (matches per file).
        context: Content search only: lines to show before and after each match (default 0).
    """
    if not pattern:
        raise ToolError("pattern must not be empty")
    offset, limit, context = max(0, offset), max(1, limit), max(0, context)
    if not _exists(ctx, path):
        raise ToolError(f"Path not found: {path}")
    if target == "files":
        command = file_search.files_command(pattern, path)
    else:
        fetch = offset + limit + 1 + (file_search.CONTEXT_SLACK + limit * 2 * context if context else 0)
        command = file_search.content_command(pattern, path, file_glob, output_mode, context, fetch)
    try:
        run = ctx.sandbox.exec(command)
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc
    if run.timed_out:
        raise ToolError("the search timed out; narrow the path, pattern or file_glob")
    output = run.output.split("\n...[output truncated:", 1)[0] if run.truncated else run.output
    result: dict[str, Any]
    if target == "files" or output_mode == "files_only":
        found = file_search.parse_files(output) if target == "files" else file_search.parse_files_only(output)
        result = {"total_count": len(found)}
        page: list[Any] = found[offset : offset + limit]
        if page:
            result["files"] = page
    elif output_mode == "count":
        counts = file_search.parse_counts(output)
        found = list(counts)
        result = {"total_count": sum(counts.values())}
        if counts:
            result["counts"] = counts
        offset, limit = 0, len(found)  # counts are one row per file, never paged
    else:
        found = file_search.parse_content(output)
        result = {"total_count": len(found)}
        page = found[offset : offset + limit]
        if len(page) >= DENSE_MATCHES:  # grouped text repeats each path once instead of per match
            result["matches_format"] = "grouped by file: a path line, then '  LINE: content' rows under it"
            result["matches_text"] = file_search.densify(page)
        elif page:
            result["matches"] = page
    # grep: 1 means no match; 2 an error (a bad regex), fatal only when nothing was found.
    if target == "content" and run.exit_code not in (0, 1) and not found and not run.truncated:
        raise ToolError(f"Search failed: {run.output.strip() or f'exit code {run.exit_code}'}")
    if len(found) > offset + limit or run.truncated:
        result["truncated"] = True
        result["hint"] = (f"Results truncated. Use offset={offset + limit} to see more, or narrow with "
                          "a more specific pattern or file_glob.")
    return result
