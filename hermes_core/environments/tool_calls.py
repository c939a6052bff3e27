"""Hermes `<tool_call>` blocks in a raw completion, parsed strictly into OpenAI-shaped tool calls.

A completion such as `Let me check.<tool_call>\\n{"name": "terminal", "arguments": {"command": "ls"}}\\n</tool_call>`
becomes its content ("Let me check."), its calls, and one error per malformed block. A malformed block
costs only itself: the valid calls around it are kept (dropping every call of the message, as the
reference parser did, would hide which call the model got wrong). The JSON of a block is read by a JSON
decoder, not by searching for the closing tag, so a `</tool_call>` inside a string value stays data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ParsedReply:
    """A completion split into its text outside the blocks, its valid calls, and why each bad block is bad."""

    content: str | None  # the text outside the blocks, stripped; None when there is none
    calls: list[dict[str, Any]] = field(default_factory=list)  # {"id", "type": "function", "function": {...}}
    errors: list[str] = field(default_factory=list)  # "tool call block <n>: <why>", n counted from 1


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _call_function(value: Any) -> tuple[dict[str, str] | None, str]:
    """The OpenAI `function` of one decoded block, or None and why it is not a call."""
    if not isinstance(value, dict):
        return None, f"the JSON is {type(value).__name__}, not an object"
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, "no \"name\" string" if name is None else f"\"name\" is not a non-empty string: {name!r}"
    arguments = value.get("arguments", {})  # a call without arguments is a call of a tool that takes none
    if isinstance(arguments, str):  # some models encode the arguments as a JSON string, as OpenAI does
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, "\"arguments\" is a string that is not JSON"
    if not isinstance(arguments, dict):
        return None, f"\"arguments\" is {type(arguments).__name__}, not an object"
    return {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}, ""


def _read_block(text: str, start: int) -> tuple[int, Any, str]:
    """Read the block whose `<tool_call>` ends at `start`: `(end, value, error)`, `end` being where
    scanning resumes (after its `</tool_call>`, or at the next `<tool_call>` of an unclosed block)."""
    pos = _skip_space(text, start)
    try:
        value, after = _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        after, error = pos, f"bad JSON ({exc.msg} at offset {exc.pos - pos})"
    else:
        after = _skip_space(text, after)
        if text.startswith(CLOSE, after):
            return after + len(CLOSE), value, ""
        error = ""
    close, reopen = text.find(CLOSE, after), text.find(OPEN, after)
    if close == -1 or -1 < reopen < close:
        unclosed = f"{OPEN} is never closed" + (f"; {error}" if error else "")
        return (len(text) if reopen == -1 else reopen), None, unclosed
    return close + len(CLOSE), None, error or f"text after the JSON object, before {CLOSE}"


def parse_tool_calls(text: str) -> ParsedReply:
    """Split a raw completion into content, OpenAI-shaped calls (ids `call_0`, `call_1`, ... in order)
    and one error per malformed block; blocks (and stray `</tool_call>` tags) are numbered from 1."""
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    pos = block = 0
    while True:
        opening, stray = text.find(OPEN, pos), text.find(CLOSE, pos)
        if opening == -1 and stray == -1:
            content.append(text[pos:])
            break
        block += 1
        if stray != -1 and (opening == -1 or stray < opening):
            content.append(text[pos:stray])
            errors.append(f"tool call block {block}: a stray {CLOSE} with no {OPEN} before it")
            pos = stray + len(CLOSE)
            continue
        content.append(text[pos:opening])
        pos, value, error = _read_block(text, opening + len(OPEN))
        function = None
        if not error:
            function, error = _call_function(value)
        if function is None:
            errors.append(f"tool call block {block}: {error}")
        else:
            calls.append({"id": f"call_{len(calls)}", "type": "function", "function": function})
    return ParsedReply(content="".join(content).strip() or None, calls=calls, errors=errors)
