"""The chat-completions schema of `messages` (OpenAI's), checked before any agent run: a malformed
message is a 400 naming the field (`messages[2].tool_calls[0].function.arguments`), never a 500
from deep inside the agent nor a request the upstream model refuses after we started a sandbox.

Keys the schema does not name are left alone (clients replay provider extras such as `reasoning`);
an optional key set to null counts as absent.
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # "function": the deprecated form
# The content part types each role may send, as in the API reference.
_PART_TYPES = {"system": ("text",), "developer": ("text",), "tool": ("text",), "assistant": ("text", "refusal"),
               "user": ("text", "image_url", "input_audio", "file")}
# What a part of each type holds: a string member, or an object with these required string members.
_PART_FIELDS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "text": ("text", None), "refusal": ("refusal", None), "image_url": ("image_url", ("url",)),
    "input_audio": ("input_audio", ("data", "format")), "file": ("file", ())}

MISSING = "missing_required_parameter"
WRONG_TYPE = "invalid_type"
WRONG_VALUE = "invalid_value"


class RequestError(ValueError):
    """A bad request body: HTTP 400 in OpenAI's shape, `param` naming the offending field."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def invalid(param: str, problem: str, code: str = WRONG_VALUE) -> RequestError:
    """The error for one field, worded as OpenAI words it: "Invalid 'messages[0].content': ..."."""
    return RequestError(f"Invalid '{param}': {problem}.", param, code)


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {str: "a string", int: "an integer", float: "a number", list: "an array", dict: "an object"}.get(
        type(value), type(value).__name__)


def wrong_type(value: Any, param: str, expected: str) -> RequestError:
    """The error for a field of the wrong JSON type."""
    return invalid(param, f"expected {expected}, but got {_json_type(value)}", WRONG_TYPE)


def _require(value: Any, param: str, kind: type, expected: str) -> Any:
    """`value` when it is a `kind` (str, list or dict); absent or null is a missing parameter."""
    if value is None:
        raise invalid(param, f"expected {expected}, but it is missing", MISSING)
    if not isinstance(value, kind):
        raise wrong_type(value, param, expected)
    return value


def _optional_string(message: dict[str, Any], key: str, param: str) -> None:
    if message.get(key) is not None:
        _require(message[key], f"{param}.{key}", str, "a string")


def _non_empty_string(value: Any, param: str) -> None:
    if not _require(value, param, str, "a string"):
        raise invalid(param, "expected a non-empty string, but got an empty one")


def _content_part(part: Any, param: str, allowed: tuple[str, ...]) -> None:
    _require(part, param, dict, "a content part object")
    kind = part.get("type")
    if kind not in allowed:
        raise invalid(f"{param}.type", f"expected one of {', '.join(map(repr, allowed))} here, but got {kind!r}",
                      MISSING if kind is None else WRONG_VALUE)
    member, required = _PART_FIELDS[kind]
    if required is None:
        _require(part.get(member), f"{param}.{member}", str, "a string")
        return
    holder = _require(part.get(member), f"{param}.{member}", dict, "an object")
    for name in required:
        _require(holder.get(name), f"{param}.{member}.{name}", str, "a string")


def _content(message: dict[str, Any], param: str, *, required: bool) -> None:
    """`content`: a string, or a non-empty array of the parts the role may send; null only when not required."""
    content, where = message.get("content"), f"{param}.content"
    if content is None:
        if required:
            raise invalid(where, "expected a string or an array of content parts, but it is missing", MISSING)
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise wrong_type(content, where, "a string or an array of content parts")
    if not content:
        raise invalid(where, "expected a string or a non-empty array of content parts, but got an empty array")
    for index, part in enumerate(content):
        _content_part(part, f"{where}[{index}]", _PART_TYPES[message["role"]])


def _function(value: Any, param: str) -> None:
    """`{name, arguments}` of a tool call (and of the deprecated `function_call`). Arguments stay a
    string: the API carries them as JSON text, which models do not always get right."""
    function = _require(value, param, dict, "an object")
    _non_empty_string(function.get("name"), f"{param}.name")
    _require(function.get("arguments"), f"{param}.arguments", str, "a string (JSON text)")


def _tool_calls(value: Any, param: str) -> list[str]:
    """The ids of a valid `tool_calls` array."""
    calls = _require(value, param, list, "an array of tool calls")
    if not calls:
        raise invalid(param, "expected an array with at least one tool call, but got an empty array")
    ids = []
    for index, call in enumerate(calls):
        where = f"{param}[{index}]"
        _require(call, where, dict, "a tool call object")
        ids.append(_require(call.get("id"), f"{where}.id", str, "a string"))
        if call.get("type") != "function":
            raise invalid(f"{where}.type", f"expected 'function', but got {call.get('type')!r}",
                          MISSING if call.get("type") is None else WRONG_VALUE)
        _function(call.get("function"), f"{where}.function")
    return ids


def validate_message(message: Any, index: int, open_calls: set[str]) -> set[str]:
    """Check `messages[index]`; returns the tool call ids a following tool message may answer.
    `open_calls` are those of the assistant message just before (the API wants tool results there)."""
    param = f"messages[{index}]"
    _require(message, param, dict, "a message object")
    role = message.get("role")
    if role not in ROLES:
        raise invalid(f"{param}.role", f"expected one of {', '.join(map(repr, ROLES))}, but got {role!r}",
                      MISSING if role is None else WRONG_VALUE)
    _optional_string(message, "name", param)
    if role == "function":
        _require(message.get("name"), f"{param}.name", str, "a string")
        if message.get("content") is not None:
            _require(message["content"], f"{param}.content", str, "a string")
        return set()
    if role == "tool":
        call_id = _require(message.get("tool_call_id"), f"{param}.tool_call_id", str, "a string")
        if call_id not in open_calls:
            raise invalid(f"{param}.tool_call_id", f"{call_id!r} answers no tool call of the assistant message "
                          "before it")
        _content(message, param, required=True)
        return open_calls  # parallel calls: several tool messages in a row
    if role != "assistant":
        _content(message, param, required=True)
        return set()
    calls = _tool_calls(message["tool_calls"], f"{param}.tool_calls") if message.get("tool_calls") is not None else []
    if message.get("function_call") is not None:
        _function(message["function_call"], f"{param}.function_call")
    _optional_string(message, "refusal", param)
    # Content may be left out only when the message calls something instead.
    _content(message, param, required=not calls and message.get("function_call") is None)
    return set(calls)


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's `messages`, every one checked against the schema (RequestError naming the field)."""
    if messages is None:
        raise invalid("messages", "expected a non-empty array of messages, but it is missing", MISSING)
    if not isinstance(messages, list):
        raise wrong_type(messages, "messages", "a non-empty array of messages")
    if not messages:
        raise invalid("messages", "expected a non-empty array of messages, but got an empty array")
    open_calls: set[str] = set()
    for index, message in enumerate(messages):
        open_calls = validate_message(message, index, open_calls)
    return messages
