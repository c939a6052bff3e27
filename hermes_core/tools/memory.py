"""Toolset "memory": two bounded stores of entries the model keeps during a session, with Hermes
Agent's interface: "memory" (the model's own notes) and "user" (what it learned about the user).

A write answers with the store's usage, not its entries (listing them invites rewriting them
again); a failed replace or remove lists the current entries so the model can retry precisely.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from hermes_core.tools.registry import ToolContext, ToolError, tool

LIMITS = {"memory": 2200, "user": 1375}  # characters per store, entries joined by SEPARATOR
SEPARATOR = "\n§\n"
Action = Literal["add", "replace", "remove"]

OPERATION_ITEMS = {"type": "object", "properties": {
    "action": {"type": "string", "enum": ["add", "replace", "remove"]},
    "content": {"type": "string", "description": "The entry text, for add and replace."},
    "old_text": {"type": "string", "description": "A piece of the existing entry, for replace and remove."},
}, "required": ["action"]}


class _Refused(Exception):
    """An operation cannot be applied; nothing was changed."""


def _size(entries: list[str]) -> int:
    return len(SEPARATOR.join(entries))


def _find(entries: list[str], old_text: str) -> int:
    """Index of the entry containing `old_text`; identical duplicates count as one."""
    hits = [index for index, entry in enumerate(entries) if old_text in entry]
    if not hits:
        raise _Refused(f"no entry contains {old_text!r}")
    if len({entries[index] for index in hits}) > 1:
        raise _Refused(f"{len(hits)} different entries contain {old_text!r}; quote more of the one you mean")
    return hits[0]


def _apply(entries: list[str], action: Any, content: str, old_text: str) -> None:
    """One operation on `entries`, in place."""
    if action == "add":
        if not content:
            raise _Refused("content is required for add")
        if content not in entries:  # adding an entry twice changes nothing
            entries.append(content)
    elif action in ("replace", "remove"):
        if not old_text:
            raise _Refused(f"old_text is required for {action}: a short piece of the entry to {action}")
        index = _find(entries, old_text)
        if action == "remove":
            del entries[index]
        elif not content:
            raise _Refused("content is required for replace (use remove to delete an entry)")
        else:
            entries[index] = content
    else:
        raise _Refused(f"unknown action {action!r}; use add, replace or remove")


@tool("memory")
def memory(ctx: ToolContext, *, action: Action | None = None, target: Literal["memory", "user"],
           content: str | None = None, old_text: str | None = None,
           operations: Annotated[list[dict] | None, {"items": OPERATION_ITEMS}] = None) -> dict[str, Any]:
    """Keep short entries for the rest of this session in one of two stores: "memory" for your own
    notes (facts found, decisions, progress), "user" for what you learned about the user
    (preferences, context). Each store has a character budget; when an entry does not fit, replace
    or remove older ones. Give either one action, or several operations applied all together.

    Args:
        action: "add" an entry, "replace" the entry containing old_text, or "remove" it. Leave it out
            when giving operations.
        target: The store: "memory" (your notes) or "user" (about the user).
        content: The entry text, for add and replace.
        old_text: A short, unique piece of the existing entry, for replace and remove.
        operations: Several {action, content, old_text} applied in order, all or none, checked
            against the budget once at the end.
    """
    if target is None:  # some models send null for "not given": the default store, as the original does
        target = "memory"
    if target not in LIMITS:
        raise ToolError(f"target must be 'memory' or 'user', not {target!r}")
    stores: dict[str, list[str]] = ctx.state.setdefault("memory", {})
    entries = stores.setdefault(target, [])
    if operations:
        if not isinstance(operations, list):
            raise ToolError("operations must be a list of {action, content, old_text} objects")
        steps = [(op.get("action"), op.get("content"), op.get("old_text")) if isinstance(op, dict) else (None, "", "")
                 for op in operations]
    elif action is None:
        raise ToolError("give an action (add, replace or remove) or a list of operations")
    else:
        steps = [(action, content, old_text)]
    working = list(entries)
    try:
        for number, (act, text, old) in enumerate(steps, 1):
            try:
                _apply(working, act, str(text or "").strip(), str(old or "").strip())
            except _Refused as exc:
                raise _Refused(f"operation {number}: {exc}" if len(steps) > 1 else str(exc)) from None
        if _size(working) > LIMITS[target]:
            raise _Refused(f"the {target} store would hold {_size(working):,} characters, more than its "
                           f"{LIMITS[target]:,}: shorten or remove entries (in the same call) and retry")
    except _Refused as exc:
        return {"success": False, "error": f"{exc}; nothing was changed", "target": target,
                "current_entries": list(entries), "usage": f"{_size(entries):,}/{LIMITS[target]:,}"}
    entries[:] = working
    used, limit = _size(entries), LIMITS[target]
    return {"success": True, "target": target, "entry_count": len(entries),
            "usage": f"{min(100, used * 100 // limit)}% — {used:,}/{limit:,} chars",
            "note": "Saved; this change is complete."}
