"""Text edits for the `patch` tool: tolerant block matching and the V4A multi-file patch format.

V4A (the patch language of Codex-style coding agents) looks like::

    *** Begin Patch
    *** Update File: src/app.py
    @@ def main():
     context line (leading space)
    -removed line
    +added line
    *** Add File: docs/new.md
    +every line of the new file, prefixed with +
    *** Delete File: old.txt
    *** Move File: a.txt -> b.txt
    *** End Patch

This module is pure: it parses patch text and computes new file contents from old ones. Reading and
writing the sandbox's files is the caller's business, so a patch is validated completely before a
single file changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Literal

# Line comparisons from strictest to loosest: models often get trailing blanks or indentation wrong.
_LINE_EQUALITIES: tuple[Callable[[str], str], ...] = (lambda s: s, str.rstrip, str.strip)


class PatchError(ValueError):
    """A patch or replacement that cannot be applied; the message names the file and hunk."""


class OldStringNotFound(PatchError):
    """Replace mode found no place matching old_string (the failure the patch tool counts)."""


@dataclass
class Hunk:
    """One `@@` section of an Update: lines prefixed ' ' (context), '-' (removed) or '+' (added)."""

    hint: str | None
    lines: list[tuple[str, str]] = field(default_factory=list)  # (prefix, text)

    @property
    def old(self) -> list[str]:
        return [text for prefix, text in self.lines if prefix != "+"]

    @property
    def changes(self) -> bool:
        return any(prefix != " " for prefix, _ in self.lines)


@dataclass
class FileOp:
    kind: Literal["update", "add", "delete", "move"]
    path: str
    line: int  # where the operation starts in the patch text, for error messages
    new_path: str | None = None  # move destination (also `*** Move to:` after an Update)
    hunks: list[Hunk] = field(default_factory=list)
    content: list[str] = field(default_factory=list)  # an Add's lines


_HEADER = re.compile(r"^\*\*\*\s*(Update|Add|Delete|Move) File:\s*(.+?)\s*$")


def parse_patch(text: str) -> list[FileOp]:
    """The operations of a V4A patch, in order; `PatchError` names the offending patch line."""
    lines = text.strip("\n").split("\n")
    lines = [line.rstrip("\r") for line in lines]
    if not lines or lines[0].strip() != "*** Begin Patch":
        raise PatchError("a V4A patch starts with the line '*** Begin Patch'")
    ops: list[FileOp] = []
    for number, line in enumerate(lines[1:], start=2):
        header = _HEADER.match(line)
        if line.strip() == "*** End Patch":
            break
        if header:
            kind, path = header.group(1).lower(), header.group(2)
            new_path = None
            if kind == "move":
                path, arrow, new_path = (part.strip() for part in path.partition("->"))
                if not arrow or not path or not new_path:
                    raise PatchError(f"patch line {number}: write a move as '*** Move File: old -> new'")
            ops.append(FileOp(kind, path, number, new_path=new_path))  # type: ignore[arg-type]
            continue
        if not ops:
            raise PatchError(f"patch line {number}: expected a '*** Update/Add/Delete File:' header, got {line!r}")
        op = ops[-1]
        if op.kind == "add":
            if not line.startswith("+"):
                raise PatchError(f"patch line {number}: every line of an added file ({op.path}) starts with '+'")
            op.content.append(line[1:])
        elif op.kind == "update":
            _parse_update_line(op, line, number)
        elif line.strip():
            raise PatchError(f"patch line {number}: a {op.kind} of {op.path} takes no content lines")
    if not ops:
        raise PatchError("the patch names no file (no '*** Update/Add/Delete File:' header)")
    for op in ops:
        if op.kind == "update" and not any(hunk.changes for hunk in op.hunks) and not op.new_path:
            raise PatchError(f"patch line {op.line}: the update of {op.path} changes nothing "
                             "(no '-' or '+' lines)")
    return ops


def _parse_update_line(op: FileOp, line: str, number: int) -> None:
    if line.startswith("*** Move to:"):
        op.new_path = line.split(":", 1)[1].strip()
    elif line.strip() == "*** End of File":
        return
    elif line.startswith("@@"):
        hint = line[2:].strip()
        hint = hint[:-2].strip() if hint.endswith("@@") else hint  # "@@ def f(): @@" form
        op.hunks.append(Hunk(hint or None))
    elif line[:1] in (" ", "-", "+") or line == "":
        if not op.hunks:  # changes before any @@: an implicit first hunk
            op.hunks.append(Hunk(None))
        op.hunks[-1].lines.append((line[:1] or " ", line[1:]))  # an empty line is empty context
    else:
        raise PatchError(f"patch line {number}: in the update of {op.path}, a line must start with "
                         f"' ', '-', '+' or '@@', got {line!r}")


def _find_block(lines: list[str], block: list[str], start: int) -> list[int]:
    """Start indexes (from `start`) where `block` occurs, under the strictest equality that finds any."""
    for norm in _LINE_EQUALITIES:
        wanted = [norm(line) for line in block]
        found = [i for i in range(start, len(lines) - len(block) + 1)
                 if all(norm(lines[i + k]) == wanted[k] for k in range(len(block)))]
        if found:
            return found
    return []


def _find_hint(lines: list[str], hint: str, start: int) -> int | None:
    for norm in _LINE_EQUALITIES:
        for i in range(start, len(lines)):
            if norm(lines[i]) == norm(hint) or (norm is str.strip and hint.strip() in lines[i]):
                return i
    return None


def apply_hunks(text: str, hunks: list[Hunk], path: str) -> str:
    """`text` with every hunk applied in order; `PatchError` names the first hunk that does not fit."""
    crlf = "\r\n" in text
    body = text.replace("\r\n", "\n")
    trailing_newline = body.endswith("\n")
    lines = (body[:-1] if trailing_newline else body).split("\n") if body else []
    cursor = 0
    for number, hunk in enumerate(hunks, start=1):
        if not hunk.changes:
            continue  # a context-only hunk is an anchor at most
        label = f"{path}: hunk {number}" + (f" (@@ {hunk.hint})" if hunk.hint else "")
        start = cursor
        if hunk.hint:
            at = _find_hint(lines, hunk.hint, cursor)
            if at is None:
                raise PatchError(f"{label}: the @@ context line {hunk.hint!r} is not in the file")
            start = at if hunk.old else at + 1
        if not hunk.old:  # pure insertion: after the hint line, else at the end of the file
            at = start if hunk.hint else len(lines)
            added = [text for _, text in hunk.lines]
            lines[at:at] = added
            cursor = at + len(added)
            continue
        found = _find_block(lines, hunk.old, start)
        if hunk.hint:  # the @@ line already says where: its first match after it
            found = found[:1]
        if not found:
            first = hunk.old[0] if hunk.old else ""
            raise PatchError(f"{label}: its context and '-' lines do not match the file (looked for "
                             f"{len(hunk.old)} line(s) starting {first!r}); read the file again and "
                             "copy the lines exactly")
        if len(found) > 1:
            raise PatchError(f"{label}: its context matches {len(found)} places (lines "
                             f"{', '.join(str(i + 1) for i in found[:5])}); add context lines or an @@ line")
        at, new, i = found[0], [], found[0]
        for prefix, content in hunk.lines:
            if prefix == "+":
                new.append(content)
            else:
                if prefix == " ":
                    new.append(lines[i])  # keep the file's own spelling of a context line
                i += 1
        lines[at:i] = new
        cursor = at + len(new)
    result = "\n".join(lines) + ("\n" if trailing_newline or not text else "")
    return result.replace("\n", "\r\n") if crlf else result


def replace_text(text: str, old: str, new: str, replace_all: bool, path: str) -> tuple[str, int]:
    """`text` with `old` replaced by `new`, and how many places changed. Exact matches first; failing
    those, whole lines equal but for trailing blanks or indentation."""
    if not old:
        raise PatchError("old_string must not be empty; use write_file to create a file")
    count = text.count(old)
    if count > 1 and not replace_all:
        raise PatchError(f"old_string occurs {count} times in {path}; add surrounding lines to make it "
                         "unique, or set replace_all=true")
    if count:
        return text.replace(old, new), count
    lines = text.split("\n")
    block = old.strip("\n").split("\n")
    found = _find_block(lines, block, 0)
    if not found:
        raise OldStringNotFound(f"Could not find old_string in {path}; read the file and copy the exact text "
                         "(without read_file's line-number prefixes)")
    if len(found) > 1 and not replace_all:
        raise PatchError(f"old_string occurs {len(found)} times in {path}; add surrounding lines to make "
                         "it unique, or set replace_all=true")
    replacement = new.strip("\n").split("\n") if new.strip("\n") else []
    for at in reversed(found):  # from the end, so earlier indexes stay valid
        lines[at:at + len(block)] = replacement
    return "\n".join(lines), len(found)
