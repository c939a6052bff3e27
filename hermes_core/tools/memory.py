"""Toolset "memory": notes the model keeps for itself during a session."""

from __future__ import annotations

from typing import Any, Literal

from hermes_core.tools.registry import ToolContext, ToolError, tool


def _match(notes: list[str], old_content: str | None, action: str) -> int:
    """Index of the single note containing `old_content`."""
    if not old_content:
        raise ToolError(f"old_content is required for {action}: a piece of the note to change")
    hits = [index for index, note in enumerate(notes) if old_content in note]
    if not hits:
        raise ToolError(f"no note contains {old_content!r}")
    if len(hits) > 1:
        raise ToolError(f"{len(hits)} notes contain {old_content!r}; quote more of the one you mean")
    return hits[0]


@tool("memory")
def memory(ctx: ToolContext, action: Literal["add", "replace", "remove", "read"], content: str | None = None,
           old_content: str | None = None) -> dict[str, Any]:
    """Keep short notes for the rest of this session (facts learned, decisions, findings) and read them
    back. Notes are kept in order; replace and remove pick the one note containing old_content.
    Every call returns all current notes.

    Args:
        action: "add" a note, "replace" a note's text, "remove" a note, or "read" all notes.
        content: The note text; required for add and replace.
        old_content: A distinctive piece of the existing note to change; required for replace and remove.
    """
    notes: list[str] = ctx.state.setdefault("memory", [])
    if action in ("add", "replace") and not (content and content.strip()):
        raise ToolError(f"content is required for {action}")
    if action == "add":
        assert content is not None
        notes.append(content.strip())
    elif action == "replace":
        assert content is not None
        notes[_match(notes, old_content, action)] = content.strip()
    elif action == "remove":
        del notes[_match(notes, old_content, action)]
    elif action != "read":
        raise ToolError(f"unknown action {action!r}; use add, replace, remove or read")
    return {"notes": list(notes), "count": len(notes)}
