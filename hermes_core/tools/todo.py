"""Toolset "todo": the model's task list for the session."""

from __future__ import annotations

from typing import Any, Literal

from hermes_core.tools.registry import ToolContext, ToolError, tool

STATUSES = ("pending", "in_progress", "done")


def _find(items: list[dict[str, Any]], item_id: int | None, action: str) -> dict[str, Any]:
    if item_id is None:
        raise ToolError(f"item_id is required for {action}")
    for item in items:
        if item["id"] == item_id:
            return item
    known = ", ".join(str(item["id"]) for item in items) or "none"
    raise ToolError(f"no task with item_id {item_id} (known: {known})")


@tool("todo")
def todo(ctx: ToolContext, action: Literal["add", "update", "remove", "list", "clear"], content: str | None = None,
         item_id: int | None = None, status: Literal["pending", "in_progress", "done"] | None = None) -> dict[str, Any]:
    """Plan and track multi-step work with a task list for this session. Add tasks, mark them
    in_progress while working on them and done when finished, and list them to see what is left.
    Every call returns the whole list; pass a task's id as item_id to update or remove it.

    Args:
        action: "add" a task, "update" a task's text or status, "remove" a task, "list" all tasks,
            or "clear" the whole list.
        content: The task description; required for add, optional for update.
        item_id: The item_id of the task to update or remove.
        status: The task's state: "pending", "in_progress" or "done" (add defaults to "pending").
    """
    items: list[dict[str, Any]] = ctx.state.setdefault("todo", [])
    if status is not None and status not in STATUSES:  # the registry does not enforce enums
        raise ToolError(f"status must be one of {', '.join(STATUSES)}")
    if action == "add":
        if not (content and content.strip()):
            raise ToolError("content is required for add")
        next_id = max((item["id"] for item in items), default=0) + 1  # ids stay stable after removals
        items.append({"id": next_id, "content": content.strip(), "status": status or "pending"})
    elif action == "update":
        item = _find(items, item_id, action)
        if content is None and status is None:
            raise ToolError("update needs a new content or status")
        if content is not None:
            if not content.strip():
                raise ToolError("content must not be empty")
            item["content"] = content.strip()
        if status is not None:
            item["status"] = status
    elif action == "remove":
        items.remove(_find(items, item_id, action))
    elif action == "clear":
        items.clear()
    elif action != "list":
        raise ToolError(f"unknown action {action!r}; use add, update, remove, list or clear")
    counts = {state: sum(item["status"] == state for item in items) for state in STATUSES}
    return {"todos": [dict(item) for item in items], "counts": counts}
