"""Toolset "todo": the model's task list for the session, with Hermes Agent's interface: the model
writes the list (whole, or merged by id) and every call returns all of it with per-status counts."""

from __future__ import annotations

import json
from typing import Annotated, Any

from hermes_core.tools.registry import ToolContext, ToolError, tool

STATUSES = ("pending", "in_progress", "completed", "cancelled")
MAX_CONTENT_CHARS = 4000  # a task is a short line; a huge one would only bloat every later result
MAX_ITEMS = 256
_CUT = "… [truncated]"

TASK_ITEM_SCHEMA = {"type": "object", "properties": {
    "id": {"type": "string", "description": "The task's identifier, chosen by you; unique in the list."},
    "content": {"type": "string", "description": "What the task is."},
    "status": {"type": "string", "enum": list(STATUSES), "description": "Where the task stands."},
}, "required": ["id", "content", "status"]}


def _text(value: Any) -> str:
    content = str(value).strip()
    return content if len(content) <= MAX_CONTENT_CHARS else content[:MAX_CONTENT_CHARS - len(_CUT)] + _CUT


def _status(value: Any) -> str | None:
    status = str(value or "").strip().lower()
    return status if status in STATUSES else None


def _item(raw: Any) -> dict[str, str]:
    """A complete {id, content, status}: missing or invalid fields get neutral values, not errors."""
    if not isinstance(raw, dict):
        return {"id": "?", "content": "(invalid item)", "status": "pending"}
    return {"id": str(raw.get("id", "")).strip() or "?", "content": _text(raw.get("content", "")) or "(no description)",
            "status": _status(raw.get("status", "pending")) or "pending"}


def _last_per_id(todos: list[Any]) -> list[Any]:
    """The list with repeated ids collapsed to their last occurrence (kept at that position)."""
    last: dict[str, int] = {}
    for index, raw in enumerate(todos):
        key = (str(raw.get("id", "")).strip() or "?") if isinstance(raw, dict) else f"\0{index}"
        last[key] = index
    return [todos[index] for index in sorted(last.values())]


def _merge(items: list[dict[str, str]], todos: list[Any]) -> list[dict[str, str]]:
    """Update the tasks whose id is known (only the fields given), append the new ones."""
    by_id = {item["id"]: item for item in items}
    for raw in _last_per_id(todos):
        item_id = str(raw.get("id", "")).strip() if isinstance(raw, dict) else ""
        if not item_id:
            continue  # nothing to merge on
        if item_id in by_id:
            if raw.get("content"):
                by_id[item_id]["content"] = _text(raw["content"])
            if _status(raw.get("status")):
                by_id[item_id]["status"] = _status(raw["status"])  # type: ignore[assignment]
        else:
            by_id[item_id] = _item(raw)
            items.append(by_id[item_id])
    return items


@tool("todo")
def todo(ctx: ToolContext,
         todos: Annotated[list[dict] | None, {"items": TASK_ITEM_SCHEMA}] = None,
         merge: Annotated[bool, {"default": False}] = False) -> dict[str, Any]:
    """Plan and track multi-step work with a task list kept for this session. Call it with todos to
    write the list, without todos to read it; every call returns the whole list (in priority order)
    and how many tasks are in each status. Keep one task in_progress at a time and mark tasks
    completed as soon as they are done, or cancelled when they no longer apply.

    Args:
        todos: The tasks to write, each {id, content, status}. Leave it out to read the list.
        merge: false (default): the given tasks become the whole list. true: tasks with a known id are
            updated (only the fields given), tasks with a new id are appended, the others are kept.
    """
    items: list[dict[str, str]] = ctx.state.setdefault("todo", [])
    if isinstance(todos, str):  # some models send the list as a JSON string
        try:
            todos = json.loads(todos)
        except ValueError:
            raise ToolError("todos must be a list of {id, content, status} objects; got a string that is not JSON") from None
    if todos is not None:
        if not isinstance(todos, list):
            raise ToolError(f"todos must be a list of {{id, content, status}} objects, not {type(todos).__name__}")
        items[:] = _merge(items, todos) if merge else [_item(raw) for raw in _last_per_id(todos)]
        del items[MAX_ITEMS:]
    summary = {"total": len(items), **{status: sum(item["status"] == status for item in items) for status in STATUSES}}
    return {"todos": [dict(item) for item in items], "summary": summary}
