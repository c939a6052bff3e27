"""OpenAI-format conversations -> Hermes ShareGPT turns (SPEC §8.1), plus per-row tool statistics.

Whitespace rules of a `gpt` turn (fixed so every row is formatted the same way):
- the value starts with `<think>\\n{reasoning}\\n</think>\\n`; reasoning is stripped of outer
  whitespace, and missing/blank reasoning gives the empty block `<think>\\n\\n</think>\\n`;
- then the parts, joined with a single `\\n`: the content (outer whitespace stripped, omitted when
  empty) and one `<tool_call>\\n{json}\\n</tool_call>` block per call. So each call is preceded by
  `\\n` when anything precedes it in the body, and nothing trails the last part.
Tool calls and responses are serialised with `json.dumps(..., ensure_ascii=False)` (default separators).
"""

from __future__ import annotations

import json
from typing import Any, Iterator

FUNCTION_CALL_SCHEMA: dict[str, Any] = {
    "title": "FunctionCall",
    "type": "object",
    "properties": {
        "name": {"title": "Name", "type": "string"},
        "arguments": {"title": "Arguments", "type": "object"},
    },
    "required": ["name", "arguments"],
}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _definition(tool: dict[str, Any]) -> dict[str, Any]:
    """`{name, description, parameters}`; also accepts the OpenAI `{"type": "function", ...}` wrapper."""
    spec = tool.get("function", tool) if tool.get("type") == "function" else tool
    return {"name": spec.get("name"), "description": spec.get("description", ""),
            "parameters": spec.get("parameters", {"type": "object", "properties": {}})}


def hermes_system_prompt(tool_definitions: list[dict[str, Any]]) -> str:
    """The Hermes function-calling system turn for the tools offered to a sample."""
    tools = _dumps([_definition(tool) for tool in tool_definitions])
    return (
        "You are a function-calling AI model. The functions you can call are described by their "
        "signatures inside the <tools></tools> XML tags below. You may call one or more of them to "
        "help with the user's request. Do not guess values for arguments you were not given.\n"
        f"<tools>\n{tools}\n</tools>\n"
        "Each function call must follow this pydantic model JSON schema: "
        f"{_dumps(FUNCTION_CALL_SCHEMA)}\n"
        "For every function call, return a JSON object with the function name and its arguments "
        "wrapped in <tool_call></tool_call> XML tags, like this:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-dict>}\n</tool_call>'
    )


def _text(content: Any) -> str:
    """Message content as text (None -> "", OpenAI content parts -> their text joined)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else _dumps(content)


def parse_arguments(raw: Any) -> dict[str, Any] | None:
    """Tool-call arguments as a dict, or None when malformed (not JSON, or not a JSON object).

    A blank string means "no arguments": some endpoints send "" for argument-less calls.
    """
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        parsed = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def iter_tool_calls(messages: list[dict[str, Any]]) -> Iterator[tuple[str | None, str, Any]]:
    """(tool_call_id, name, raw arguments) of every tool call of every assistant message, in order."""
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            yield call.get("id"), str(function.get("name") or ""), function.get("arguments")


def _gpt_value(message: dict[str, Any]) -> str:
    reasoning = _text(message.get("reasoning")).strip()
    parts = [_text(message.get("content")).strip()]
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        payload = {"name": function.get("name"), "arguments": parse_arguments(function.get("arguments")) or {}}
        parts.append(f"<tool_call>\n{_dumps(payload)}\n</tool_call>")
    return f"<think>\n{reasoning}\n</think>\n" + "\n".join(part for part in parts if part)


def _tool_content(content: Any) -> Any:
    """JSON object/array results are embedded as JSON; anything else stays a string."""
    text = _text(content)
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    return parsed if isinstance(parsed, (dict, list)) else text


def to_conversations(messages: list[dict[str, Any]], tool_definitions: list[dict[str, Any]]) -> list[dict[str, str]]:
    """ShareGPT `conversations` of one trajectory. System messages (ephemeral) are never written."""
    turns: list[dict[str, str]] = [{"from": "system", "value": hermes_system_prompt(tool_definitions)}]
    call_names: dict[Any, str] = {}  # tool messages without `name` get it from their call
    pending: list[str] = []  # <tool_response> blocks of the current run of tool messages

    def flush() -> None:
        if pending:
            turns.append({"from": "tool", "value": "\n".join(pending)})
            pending.clear()

    for message in messages:
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            response = {"tool_call_id": call_id, "name": message.get("name") or call_names.get(call_id, ""),
                        "content": _tool_content(message.get("content"))}
            pending.append(f"<tool_response>\n{_dumps(response)}\n</tool_response>")
            continue
        flush()
        if role == "user":
            turns.append({"from": "human", "value": _text(message.get("content"))})
        elif role == "assistant":
            call_names.update((call_id, name) for call_id, name, _ in iter_tool_calls([message]))
            turns.append({"from": "gpt", "value": _gpt_value(message)})
    flush()
    return turns


def tool_stats(messages: list[dict[str, Any]], universe: list[str]) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """(`{tool: {count, success, failure}}`, `{tool: failure}`) over every universe tool (zeros when
    unused) plus any called name outside the universe, counted under that name.

    A call fails when its arguments are malformed, it got no tool reply, or the reply is a failure
    by `result_failed` (SPEC §8.1).
    """
    # Imported here: the tools package imports (registers) every tool module, which row
    # conversion does not otherwise need.
    from hermes_core.tools.registry import result_failed

    stats = {name: {"count": 0, "success": 0, "failure": 0} for name in universe}
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        # Replies are matched only within the tool messages right after this assistant message:
        # some servers reuse ids such as "call_0" on every turn.
        replies: dict[Any, Any] = {}
        for follow in messages[index + 1:]:
            if follow.get("role") != "tool":
                break
            replies.setdefault(follow.get("tool_call_id"), follow.get("content"))
        for call_id, name, raw_args in iter_tool_calls([message]):
            entry = stats.setdefault(name, {"count": 0, "success": 0, "failure": 0})
            entry["count"] += 1
            # A missing reply reads as empty text, which result_failed counts as a failure.
            failed = parse_arguments(raw_args) is None or result_failed(_text(replies.get(call_id)))
            entry["failure" if failed else "success"] += 1
    return stats, {name: entry["failure"] for name, entry in stats.items()}


def reasoning_coverage(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """(assistant turns, assistant turns with non-blank reasoning)."""
    assistant = [m for m in messages if m.get("role") == "assistant"]
    return len(assistant), sum(1 for m in assistant if _text(m.get("reasoning")).strip())
