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
from hermes_core.tools import file_search, file_state
from hermes_core.tools.registry import ToolContext, ToolError, registry, tool
from hermes_core.tools.v4a import FileOp, OldStringNotFound, PatchError, apply_hunks, parse_patch, replace_text

MAX_READ_LINES = 2000  # the most lines one read_file call returns
MAX_LINE_CHARS = 2000  # longer lines are cut, so a minified file cannot flood a page
MAX_READ_CHARS = 100_000  # a page stops at the last whole line within this many characters

_NUMBERED_LINE = re.compile(r"^\s*(\d+)\|")
_SHA256 = re.compile(r"^([0-9a-f]{64})\b", re.MULTILINE)


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
    return file_state.read(ctx, path, offset, limit, lambda: _read_bytes(ctx, path),
                           lambda data: _page(data, path, offset, limit))


def _page(data: bytes, path: str, offset: int, limit: int) -> dict[str, Any]:
    """read_file's result for the lines `offset`.. (at most `limit`) of the file `data`."""
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
    if file_state.is_status_text(content):
        raise ToolError("content is read_file's 'unchanged' message, not the file's text; write the "
                        "file's real content")
    parent = posixpath.dirname(path)
    warning = None
    if file_state.watching(ctx, path):  # one command checks the folder and the file's content
        dirs_created, current = _probe(ctx, parent or ".", path)
        warning = file_state.stale_warning(ctx, path, current)
    else:
        dirs_created = bool(parent) and not file_search.exists(ctx, parent, "-d")
    written, size = _write_text(ctx, path, content)
    file_state.note_written(ctx, path, content.encode("utf-8"))
    result = {"bytes_written": size, "dirs_created": dirs_created, "resolved_path": written,
              "files_modified": [written]}
    return {**result, "_warning": warning} if warning else result


def _probe(ctx: ToolContext, folder: str, path: str) -> tuple[bool, str | None]:
    """Whether `folder` is missing, and the SHA-256 of the file `path` (None when it cannot be
    read), from one sandbox command."""
    command = (f"[ -d {shlex.quote(folder)} ] || echo missing-folder; "
               f"sha256sum 2>/dev/null < {shlex.quote(path)} || true")
    try:
        output = ctx.sandbox.exec(command).output
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc
    found = _SHA256.search(output)
    return "missing-folder" in output.split(), found.group(1) if found else None


def _diff(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"a/{path}", f"b/{path}"))


_Plan = tuple[dict[str, str | None], dict[str, str | None], list[str], list[str], list[str]]


def _plan_v4a(ctx: ToolContext, ops: list[FileOp], digests: dict[str, str]) -> _Plan:
    """Every operation worked out in memory, in order: the files' contents before and after, and
    the paths modified, created and deleted. Nothing is written. `digests` receives the SHA-256 of
    each existing file read."""
    files: dict[str, str | None] = {}  # path -> content after the operations so far (None: deleted)
    before: dict[str, str | None] = {}

    def current(path: str) -> str | None:
        if path not in files:
            try:
                data = _read_bytes(ctx, path)
                digests[path] = file_state.digest(data)
                files[path] = _decode(data, path)
            except ToolError:
                if file_search.exists(ctx, path):
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
    digests: dict[str, str] = {}
    try:
        files, before, modified, created, deleted = _plan_v4a(ctx, ops, digests)
    except (PatchError, ToolError) as exc:
        failure = {"error": f"patch not applied, no file was changed: {exc}"}
        return _with_warnings(failure, _stale(ctx, digests))
    warnings = _stale(ctx, digests)  # before the writes below change what the session remembers
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
        file_state.note_written(ctx, path, None if content is None else content.encode("utf-8"))
    file_state.patch_succeeded(ctx, list(files))
    result: dict[str, Any] = {"success": True, "diff": "\n".join(d for d in diffs if d)}
    for key, paths in (("files_modified", modified), ("files_created", created), ("files_deleted", deleted)):
        if paths:
            result[key] = paths
    return _with_warnings(result, warnings)


def _stale(ctx: ToolContext, digests: dict[str, str]) -> list[str]:
    """The staleness warnings of the files a V4A patch read (their digests then)."""
    return [w for path, d in digests.items() if (w := file_state.stale_warning(ctx, path, d))]


def _with_warnings(result: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """`result` with its `_warning` (several joined by " | "); a bare error is raised as one."""
    return file_state.finish({**result, "_warning": " | ".join(warnings)} if warnings else result)


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
    data = _read_bytes(ctx, path)
    text = _decode(data, path)
    warning = file_state.stale_warning(ctx, path, file_state.digest(data))
    try:
        new, count = replace_text(text, old_string, new_string, replace_all, path)
    except OldStringNotFound as exc:
        hint = file_state.patch_hint(path, file_state.patch_failed(ctx, path))
        return {"error": str(exc), **({"_warning": warning} if warning else {}), "_hint": hint}
    except PatchError as exc:
        return _with_warnings({"error": str(exc)}, [warning] if warning else [])
    written, _ = _write_text(ctx, path, new)
    file_state.note_written(ctx, path, new.encode("utf-8"))
    file_state.patch_succeeded(ctx, [path])
    result = {"success": True, "diff": _diff(text, new, path), "files_modified": [written],
              "resolved_path": written, "replacements": count}
    return _with_warnings(result, [warning] if warning else [])


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
    offset, limit, context = max(0, offset), max(1, limit), max(0, context)
    # The repeat guard's key, as Hermes Agent's: output_mode and context do not count.
    call = (pattern, target, path, file_glob or "", limit, offset)
    return file_state.search(ctx, call, pattern, lambda: file_search.run_search(
        ctx, pattern, target, path, file_glob, limit, offset, output_mode, context))


registry.observe_calls(file_state.note_call)  # another tool in between ends a run of identical reads
