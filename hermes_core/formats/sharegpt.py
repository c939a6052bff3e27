"""OpenAI-format conversations -> Hermes ShareGPT turns (SPEC §8.1), plus per-row tool statistics.

The bytes are those of Hermes Agent 0.19.0's converter (docs/explanation/conformance.md):
- system: `<preamble><tools>\n{json}\n</tools>\n<schema intro>\n{FunctionCall schema repr}\n
  <instruction>\n<example intro>\n<tool_call>\n{example}\n</tool_call>`; tools sorted by name, each
  `{name, description, parameters, "required": null}`; the sentences come from a `HermesText`.
- gpt: `<think>\n{reasoning}\n</think>\n` with the reasoning verbatim when it is not blank; then, for
  a message with tool calls, the content (when not blank) + `\n` and one
  `<tool_call>\n{json}\n</tool_call>\n` per call, right-stripped; for one without, the content,
  the whole value stripped. `<REASONING_SCRATCHPAD>` tags left in the content become `<think>` tags,
  and a value without any `<think>` gets the empty block `<think>\n</think>\n` first.
- tool: the replies right after an assistant message with calls, one `<tool_response>\n{json}\n
  </tool_response>` each, joined by `\n`; the name is that of the call at the same position.
Tool calls and responses are serialised with `json.dumps(..., ensure_ascii=False)` (default separators).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Iterator

import orjson

from hermes_core.formats.hermes_text import CALL_EXAMPLE, OWN_TEXT, HermesText, unwrap_untrusted

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
    """`{name, description, parameters, required: null}` as the original lists a tool (its
    `required` key is always null); also accepts the OpenAI `{"type": "function", ...}` wrapper."""
    spec = tool.get("function", tool) if tool.get("type") == "function" else tool
    return {"name": spec.get("name"), "description": spec.get("description", ""),
            "parameters": spec.get("parameters", {}), "required": None}


def hermes_system_prompt(tool_definitions: list[dict[str, Any]], text: HermesText = OWN_TEXT) -> str:
    """The Hermes function-calling system turn for the tools offered to a sample (sorted by name).
    Samples offered the same tools share it: it is written once per process for each tool set."""
    return _system_prompt(orjson.dumps(tool_definitions), text)


@functools.lru_cache(maxsize=256)
def _system_prompt(definitions: bytes, text: HermesText) -> str:
    tool_definitions = orjson.loads(definitions)
    tools = _dumps(sorted((_definition(tool) for tool in tool_definitions), key=lambda d: str(d["name"])))
    return (
        f"{text.preamble}<tools>\n{tools}\n</tools>\n{text.schema_intro}\n{FUNCTION_CALL_SCHEMA!r}\n"
        f"{text.call_instruction}\n{text.example_intro}\n<tool_call>\n{CALL_EXAMPLE}\n</tool_call>"
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


def _scratchpad_to_think(content: str) -> str:
    return content.replace("<REASONING_SCRATCHPAD>", "<think>").replace("</REASONING_SCRATCHPAD>", "</think>")


def _gpt_value(message: dict[str, Any]) -> str:
    reasoning = _text(message.get("reasoning"))
    value = f"<think>\n{reasoning}\n</think>\n" if reasoning.strip() else ""
    content = _text(message.get("content"))
    calls = [call for call in message.get("tool_calls") or [] if isinstance(call, dict)]
    if calls:
        value += _scratchpad_to_think(content) + "\n" if content.strip() else ""
        for call in calls:
            function = call.get("function") or {}
            payload = {"name": function.get("name"), "arguments": parse_arguments(function.get("arguments")) or {}}
            value += f"<tool_call>\n{_dumps(payload)}\n</tool_call>\n"
    else:
        value += _scratchpad_to_think(content)
    if "<think>" not in value:
        value = "<think>\n</think>\n" + value
    return value.rstrip() if calls else value.strip()


def _tool_content(content: Any) -> Any:
    """JSON object/array results are embedded as JSON; anything else stays a string."""
    text = _text(content)
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    return parsed if isinstance(parsed, (dict, list)) else text


def to_conversations(
    messages: list[dict[str, Any]], tool_definitions: list[dict[str, Any]], text: HermesText = OWN_TEXT
) -> list[dict[str, str]]:
    """ShareGPT `conversations` of one trajectory. System messages (ephemeral) are never written,
    nor tool messages that do not answer an assistant message's calls."""
    turns: list[dict[str, str]] = [{"from": "system", "value": hermes_system_prompt(tool_definitions, text)}]
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "user":
            turns.append({"from": "human", "value": _text(message.get("content"))})
        elif role == "assistant":
            turns.append({"from": "gpt", "value": _gpt_value(message)})
            calls = [name for _, name, _ in iter_tool_calls([message])]
            responses = []
            for follow in messages[index + 1:]:
                if follow.get("role") != "tool":
                    break
                name = calls[len(responses)] if len(responses) < len(calls) else "unknown"
                response = {"tool_call_id": follow.get("tool_call_id", ""), "name": name,
                            "content": _tool_content(follow.get("content"))}
                responses.append(f"<tool_response>\n{_dumps(response)}\n</tool_response>")
            if calls and responses:
                turns.append({"from": "tool", "value": "\n".join(responses)})
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
            # An untrusted tool's result is judged by its payload, not by the wrapper around it.
            reply = unwrap_untrusted(_text(replies.get(call_id)))
            failed = parse_arguments(raw_args) is None or result_failed(reply)
            entry["failure" if failed else "success"] += 1
    return stats, {name: entry["failure"] for name, entry in stats.items()}


def reasoning_coverage(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """(assistant turns, assistant turns with non-blank reasoning)."""
    assistant = [m for m in messages if m.get("role") == "assistant"]
    return len(assistant), sum(1 for m in assistant if _text(m.get("reasoning")).strip())
