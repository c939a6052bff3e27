"""The simulated model under `tool_call_mode: constrained` (hermes_core.endpoints.constrained): a request with
a JSON-schema `response_format` is read back into the native form the policy understands, and the
policy's reply is written as the JSON object the schema asks for. Without a schema: the policy as is."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from typing import Any

from hermes_core.endpoints.constrained import RESULT_HEADER
from hermes_core.endpoints.simulated.policy import Reply, respond as native_respond

_RESULT = re.compile("^" + re.escape(RESULT_HEADER).replace(re.escape("{name}"), "(?P<name>[^:\\n]+)"))


def respond(body: dict[str, Any], attempt: int = 1) -> Reply:
    schema = _reply_schema(body)
    if schema is None:
        return native_respond(body, attempt)
    tools = [{"type": "function", "function": {"name": option["properties"]["tool"]["enum"][0],
                                               "parameters": option["properties"]["arguments"]}}
             for option in schema.get("anyOf", []) if "tool" in option.get("properties", {})]
    reply = native_respond({**body, "messages": _native(body.get("messages") or []), "tools": tools}, attempt)
    if reply.tool_calls:
        call = reply.tool_calls[0]["function"]
        answer = {"tool": call["name"], "arguments": json.loads(call["arguments"])}
    else:
        answer = {"final_answer": reply.content or ""}
    return replace(reply, content=json.dumps(answer, ensure_ascii=False), tool_calls=[], finish_reason="stop")


def _reply_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    response_format = body.get("response_format")
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    schema = (response_format.get("json_schema") or {}).get("schema")
    return schema if isinstance(schema, dict) else None


def _native(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plain constrained turns back to OpenAI tool calls and tool messages."""
    native = []
    for message in messages:
        content = message.get("content") if isinstance(message.get("content"), str) else ""
        result = _RESULT.match(content) if message.get("role") == "user" else None
        call = _as_call(content) if message.get("role") == "assistant" else None
        if result:
            native.append({"role": "tool", "name": result["name"], "content": content[result.end():]})
        elif call:
            call_id = "call_" + hashlib.sha256(content.encode()).hexdigest()[:12]
            native.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": call["tool"],
                                                                 "arguments": json.dumps(call["arguments"])}}]})
        else:
            native.append(message)
    return native


def _as_call(content: str) -> dict[str, Any] | None:
    try:
        value = json.loads(content)
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("tool"), str) else None
