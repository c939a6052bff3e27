"""Tool calls for endpoints whose model has no tool-calling template (SPEC §4, adapter mode).

In `constrained` mode the agent does not send `tools`. It describes the offered tools in the system
message, constrains the reply with a JSON schema (`response_format`): either one call of an offered
tool with arguments that fit its parameters, or a final answer. It parses the reply back into an
OpenAI `tool_calls` message. The history is sent as plain user/assistant turns (a template without
tool support may refuse `tool` messages). Trajectories are stored exactly as in `native` mode, so
the ShareGPT output is the same format, and their metadata says `tool_call_mode: constrained`.

Works with any server that honours `response_format` with a JSON schema (llama.cpp, vLLM, Ollama's
OpenAI endpoint).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

NATIVE, CONSTRAINED = "native", "constrained"
TOOL_CALL_MODES = (NATIVE, CONSTRAINED)

FINAL_PROMPT = 'Reply with one JSON object and nothing else: {"final_answer": "<text>"}.'
RESULT_HEADER = "Result of {name}:\n"  # a tool result, sent as a user turn
TOOLS_PROMPT = (
    "You can call tools. The tools you may call, as JSON:\n{tools}\n\n"
    'Reply with one JSON object and nothing else: {{"tool": "<name>", "arguments": {{...}}}} to call a '
    'tool (its result comes back in the next message), or {{"final_answer": "<text>"}} when you are done.'
)


def reply_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema a constrained reply must fit: a call of one of `tools` (OpenAI tool schemas),
    with arguments fitting that tool's parameters, or a final answer (only that, without tools)."""
    calls = [
        {"type": "object", "additionalProperties": False, "required": ["tool", "arguments"],
         "properties": {"tool": {"type": "string", "enum": [tool["function"]["name"]]},
                        "arguments": tool["function"].get("parameters") or {"type": "object"}}}
        for tool in tools
    ]
    final = {"type": "object", "additionalProperties": False, "required": ["final_answer"],
             "properties": {"final_answer": {"type": "string"}}}
    return {"anyOf": [*calls, final]}


def request_body(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The request fields replacing `messages` + `tools`: plain-text history, the tools in the system
    message, and the reply schema. Without tools (the summary call) the schema allows only a final
    answer: a model that has been replying in calls would otherwise write one more as text."""
    plain = plain_messages(messages)
    described = TOOLS_PROMPT.format(tools=json.dumps([
        {key: tool["function"].get(key) for key in ("name", "description", "parameters")} for tool in tools
    ], ensure_ascii=False)) if tools else FINAL_PROMPT
    if plain and plain[0]["role"] == "system":
        plain[0] = {"role": "system", "content": f"{plain[0]['content']}\n\n{described}"}
    else:
        plain.insert(0, {"role": "system", "content": described})
    return {"messages": plain, "response_format": {
        "type": "json_schema", "json_schema": {"name": "tool_call_or_final_answer", "schema": reply_schema(tools)}}}


def plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages with tool calls and results rewritten as the JSON replies and user turns a
    constrained conversation has."""
    plain = []
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls"):
            calls = [{"tool": call["function"]["name"], "arguments": _arguments(call)} for call in message["tool_calls"]]
            plain.append({"role": "assistant", "content": "\n".join(json.dumps(c, ensure_ascii=False) for c in calls)})
        elif message["role"] == "tool":
            header = RESULT_HEADER.format(name=message.get("name") or "the tool")
            plain.append({"role": "user", "content": header + (message.get("content") or "")})
        else:
            plain.append({"role": message["role"], "content": message.get("content") or ""})
    return plain


def _arguments(call: dict[str, Any]) -> Any:
    raw = call["function"].get("arguments") or "{}"
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_reply(content: str | None, calls_allowed: bool = True) -> tuple[str | None, list[dict[str, Any]] | None]:
    """(content, tool_calls) of an assistant message from a constrained reply. A reply that is not
    one of the two shapes (e.g. cut off by max_tokens) is kept as text, as a final answer."""
    try:
        reply = json.loads(content or "")
    except ValueError:
        return content, None
    if (calls_allowed and isinstance(reply, dict) and isinstance(reply.get("tool"), str)
            and isinstance(reply.get("arguments"), dict)):
        call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": reply["tool"], "arguments": json.dumps(reply["arguments"], ensure_ascii=False)}}
        return None, [call]
    if isinstance(reply, dict) and isinstance(reply.get("final_answer"), str):
        return reply["final_answer"], None
    return content, None
