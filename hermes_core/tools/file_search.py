"""`search_files`' work: grep and find run inside the sandbox, their output parsed and paged.

Hidden files and folders (names starting with ".", such as .git) are skipped, like ripgrep does by
default; binary files are skipped by content search.
"""

from __future__ import annotations

import shlex
from typing import Any

from hermes_core.sandbox.base import SandboxError
from hermes_core.tools.registry import ToolContext, ToolError

DENSE_MATCHES = 5  # from this many content matches on, they are grouped by file as text
MAX_MATCH_CHARS = 500  # one minified line must not fill a whole result
CONTEXT_SLACK = 200  # extra output lines fetched when context lines are interleaved with matches


def _start(path: str) -> str:
    return shlex.quote("./" + path if path.startswith("-") else path)  # never parsed as an option


def files_command(pattern: str, path: str) -> str:
    """Files under `path` whose name matches the glob `pattern`, newest first (`MTIME PATH` lines).
    A pattern with a folder part is matched on its last segment; a plain word matches names
    containing it."""
    name = pattern.rsplit("/", 1)[-1] or "*"
    if not any(c in name for c in "*?["):
        name = f"*{name}*"
    return (f"find {_start(path)} -mindepth 1 -name '.*' -prune -o -type f -name {shlex.quote(name)} "
            "-printf '%T@ %p\\n' 2>/dev/null | sort -rn")


def content_command(pattern: str, path: str, file_glob: str | None, output_mode: str,
                    context: int, fetch: int) -> str:
    """grep for the extended regular expression `pattern`; -Z ends each file name with a NUL, so
    names containing ':' or '-' still parse. At most `fetch` output lines are kept."""
    # Hidden names are `.[!.]*` or `..?*`: globs that spare the start paths "." and "..".
    hidden = ".[!.]*", "..?*"
    options = ["-rIHZE", "--color=never", *(f"--exclude-dir='{g}' --exclude='{g}'" for g in hidden)]
    if output_mode == "files_only":
        options.append("-l")
    elif output_mode == "count":
        options.append("-c")
    else:
        options.append("-n")
        if context > 0:
            options.append(f"-C{context}")
    if file_glob:
        options.append(f"--include={shlex.quote(file_glob)}")
    cut = f" | head -n {fetch}" if output_mode == "content" else ""
    # pipefail: grep's own status (2 = error) must survive `head`.
    return f"set -o pipefail; grep {' '.join(options)} -e {shlex.quote(pattern)} -- {_start(path)}{cut}"


def parse_files(output: str) -> list[str]:
    """Paths from `files_command` output (find's warnings dropped)."""
    paths = []
    for line in output.split("\n"):
        stamp, _, path = line.partition(" ")
        if path and stamp.replace(".", "", 1).isdigit():
            paths.append(path)
    return paths


def parse_content(output: str) -> list[dict[str, Any]]:
    """`{path, line, content}` for each match and context line of grep's `-nZ` output; grep's
    warnings and `--` group separators are dropped."""
    matches = []
    for line in output.split("\n"):
        name, nul, rest = line.partition("\0")
        digits = len(rest) - len(rest.lstrip("0123456789"))
        if nul and digits and rest[digits:digits + 1] in (":", "-"):
            matches.append({"path": name, "line": int(rest[:digits]), "content": rest[digits + 1:][:MAX_MATCH_CHARS]})
    return matches


def parse_files_only(output: str) -> list[str]:
    """File names of grep's `-lZ` output (NUL-terminated)."""
    return [name.lstrip("\n") for name in output.split("\0")[:-1] if name.strip("\n")]


def parse_counts(output: str) -> dict[str, int]:
    """`{path: matches}` from grep's `-cZ` output, files without a match left out."""
    counts = {}
    for line in output.split("\n"):
        name, nul, count = line.partition("\0")
        if nul and count.isdigit() and int(count):
            counts[name] = int(count)
    return counts


def densify(matches: list[dict[str, Any]]) -> str:
    """Matches as text grouped by file: each path once, then `  LINE: content` rows under it."""
    rows: list[str] = []
    current = None
    for match in matches:
        if match["path"] != current:
            current = match["path"]
            rows.append(current)
        rows.append(f"  {match['line']}: {match['content'].rstrip()}")
    return "\n".join(rows)


def exists(ctx: ToolContext, path: str, test: str = "-e") -> bool:
    """`test TEST PATH` in the sandbox (-e: exists, -d: is a folder)."""
    try:
        return ctx.sandbox.exec(f"test {test} {shlex.quote(path)}").exit_code == 0
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc


def run_search(ctx: ToolContext, pattern: str, target: str, path: str, file_glob: str | None, limit: int,
               offset: int, output_mode: str, context: int) -> dict[str, Any]:
    """search_files' result (its arguments already normalized): grep or find in the sandbox, parsed
    and paged."""
    if not pattern:
        raise ToolError("pattern must not be empty")
    if not exists(ctx, path):
        raise ToolError(f"Path not found: {path}")
    if target == "files":
        command = files_command(pattern, path)
    else:
        fetch = offset + limit + 1 + (CONTEXT_SLACK + limit * 2 * context if context else 0)
        command = content_command(pattern, path, file_glob, output_mode, context, fetch)
    try:
        run = ctx.sandbox.exec(command)
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc
    if run.timed_out:
        raise ToolError("the search timed out; narrow the path, pattern or file_glob")
    output = run.output.split("\n...[output truncated:", 1)[0] if run.truncated else run.output
    result: dict[str, Any]
    if target == "files" or output_mode == "files_only":
        found = parse_files(output) if target == "files" else parse_files_only(output)
        result = {"total_count": len(found)}
        page: list[Any] = found[offset : offset + limit]
        if page:
            result["files"] = page
    elif output_mode == "count":
        counts = parse_counts(output)
        found = list(counts)
        result = {"total_count": sum(counts.values())}
        if counts:
            result["counts"] = counts
        offset, limit = 0, len(found)  # counts are one row per file, never paged
    else:
        found = parse_content(output)
        result = {"total_count": len(found)}
        page = found[offset : offset + limit]
        if len(page) >= DENSE_MATCHES:  # grouped text repeats each path once instead of per match
            result["matches_format"] = "grouped by file: a path line, then '  LINE: content' rows under it"
            result["matches_text"] = densify(page)
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
