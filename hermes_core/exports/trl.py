"""OpenAI chat messages for TRL `SFTTrainer`: `data/<run>/trl/messages.jsonl` and `messages.parquet`.

Columns: `messages`, `tools`, `sample_key`, `prompt_index`, `disposition`.

- Every message has the same six keys, `None` where they do not apply, so every row has one Arrow
  schema: `role`, `content` (always a string, "" when an assistant message only calls tools),
  `reasoning_content` (assistant reasoning as its own field, None when absent — chat templates that
  support reasoning read it from there), `tool_calls` (`[{id, type: "function", function: {name,
  arguments}}]` or None), `tool_call_id` and `name` (tool messages).
- `arguments` is the JSON string of the call, as the OpenAI API sends it (its keys differ per tool,
  which one Arrow struct cannot hold).
- `tools` is the JSON string of the offered tools as OpenAI tool schemas. As Arrow structs, tools with
  different parameters would be merged into one struct padded with nulls, which corrupts the schemas
  a chat template renders; TRL's `SFTTrainer` decodes a JSON-string `tools` column itself.
- No system message: the Hermes system turn is only a rendering of the offered tools, and each chat
  template renders `tools` its own way. A system turn that is not exactly that template is kept.

Source of a row's messages: the agent's own messages recorded in the ledger (exact: the model's raw
argument text, even when malformed, where the ShareGPT row has `{}`), else — ledgers written before they were recorded, or rows
edited after the run — a parse of the ShareGPT `conversations` (`sharegpt_to_messages`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from hermes_core.exports.rows import ExportPaths, ExportRow, atomic_path, collect_rows, to_dataset
from hermes_core.fileio import atomic_write_jsonl
from hermes_core.formats.sharegpt import _text as content_text
from hermes_core.formats.sharegpt import hermes_system_prompt

_THINK = re.compile(r"\A<think>\n?(.*?)\n?</think>\n?", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.DOTALL)
_TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)

_STRING = datasets.Value("string")
MESSAGE_FEATURES = {
    "role": _STRING, "content": _STRING, "reasoning_content": _STRING,
    "tool_calls": datasets.List({"id": _STRING, "type": _STRING,
                                 "function": {"name": _STRING, "arguments": _STRING}}),
    "tool_call_id": _STRING, "name": _STRING,
}
TRL_FEATURES = datasets.Features({
    "messages": datasets.List(MESSAGE_FEATURES), "tools": _STRING, "sample_key": _STRING,
    "prompt_index": datasets.Value("int64"), "disposition": _STRING,
})


def message(role: str, content: str = "", *, reasoning_content: str | None = None,
            tool_calls: list[dict[str, Any]] | None = None, tool_call_id: str | None = None,
            name: str | None = None) -> dict[str, Any]:
    return {"role": role, "content": content, "reasoning_content": reasoning_content, "tool_calls": tool_calls,
            "tool_call_id": tool_call_id, "name": name}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def arguments_text(raw: Any) -> str:
    """Arguments as the OpenAI JSON string: a string is kept verbatim (even malformed: it is what the
    model wrote, and the tool reply that follows says so); absent or blank means no arguments."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return "{}"
    return raw if isinstance(raw, str) else _json(raw)


def tool_definitions(system_value: str) -> list[dict[str, Any]] | None:
    """The `{name, description, parameters}` list inside a system turn's `<tools>` block, if any."""
    match = _TOOLS.search(system_value)
    try:
        parsed = json.loads(match.group(1)) if match else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, list) else None


def openai_tools(definitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": d.get("name"), "description": d.get("description", ""),
                                              "parameters": d.get("parameters", {"type": "object", "properties": {}})}}
            for d in definitions]


def _assistant(value: str, turn: int) -> dict[str, Any]:
    """A `gpt` turn: `<think>` block -> reasoning_content; `<tool_call>` blocks holding a JSON object with
    a string `name` -> tool_calls (ids `call_<turn>_<n>` until a tool turn supplies the real ones); any
    other text, including a `<tool_call>` block that is not such JSON, stays in the content."""
    think = _THINK.match(value)
    reasoning = think.group(1).strip() if think else ""
    body = value[think.end():] if think else value
    calls, kept, position = [], [], 0
    for match in _TOOL_CALL.finditer(body):
        try:
            payload = json.loads(match.group(1))
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            continue
        kept.append(body[position:match.start()])
        position = match.end()
        calls.append(_tool_call(f"call_{turn}_{len(calls)}", payload["name"], arguments_text(payload.get("arguments"))))
    kept.append(body[position:])
    return message("assistant", "".join(kept).strip(), reasoning_content=reasoning or None, tool_calls=calls or None)


def _responses(value: str) -> list[dict[str, Any]]:
    """`<tool_response>` blocks of a `tool` turn as tool messages (a block that is not JSON becomes
    the content of a tool message with no id or name, matched to a call below)."""
    found = []
    for match in _TOOL_RESPONSE.finditer(value):
        try:
            payload = json.loads(match.group(1))
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            payload = {"content": match.group(1)}
        content = payload.get("content")
        found.append(message("tool", content if isinstance(content, str) else _json(content),
                             tool_call_id=payload.get("tool_call_id") or None, name=payload.get("name") or None))
    return found


def _link(assistant: dict[str, Any] | None, responses: list[dict[str, Any]], turn: int) -> None:
    """Give each call the id of its response: the first unclaimed response with the call's name (or no
    name), which is the positional match in files this product writes; fill ids/names either way."""
    free = list(responses)
    for call in (assistant or {}).get("tool_calls") or []:
        function = call["function"]
        response = next((r for r in free if r["name"] in (None, function["name"])), None)
        if response is None:
            continue
        free.remove(response)
        call["id"] = response["tool_call_id"] = response["tool_call_id"] or call["id"]
        response["name"] = response["name"] or function["name"]
    for index, response in enumerate(free):  # replies to no call (hand-edited data): still valid messages
        response["tool_call_id"] = response["tool_call_id"] or f"call_{turn}_r{index}"


def sharegpt_to_messages(conversations: list[dict[str, str]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, OpenAI tools) of one ShareGPT conversation (SPEC §8.1 turns; `human` -> user)."""
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    for turn, item in enumerate(conversations):
        source, value = item.get("from"), item.get("value") or ""
        if source == "system":
            definitions = tool_definitions(value)
            tools = openai_tools(definitions) if definitions is not None else tools
            if definitions is None or value != hermes_system_prompt(definitions):
                messages.append(message("system", value))
        elif source == "human":
            messages.append(message("user", value))
        elif source == "gpt":
            messages.append(_assistant(value, turn))
        elif source == "tool":
            responses = _responses(value)
            previous = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
            _link(previous, responses, turn)
            messages.extend(responses)
        else:
            raise ValueError(f"turn {turn}: unknown ShareGPT role {source!r}")
    return messages, tools


def agent_to_messages(recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's recorded OpenAI messages in the export form. System messages are the ephemeral
    system prompt, which is never written to the data; text is stripped as in the ShareGPT row."""
    messages, call_names = [], {}
    for index, item in enumerate(recorded):
        role = item.get("role")
        if role == "user":
            messages.append(message("user", content_text(item.get("content"))))
        elif role == "assistant":
            calls = []
            for n, call in enumerate(item.get("tool_calls") or []):
                function = call.get("function") or {}
                call_id = call.get("id") or f"call_{index}_{n}"
                call_names[call_id] = str(function.get("name") or "")
                calls.append(_tool_call(call_id, call_names[call_id], arguments_text(function.get("arguments"))))
            reasoning = content_text(item.get("reasoning") or item.get("reasoning_content")).strip()
            messages.append(message("assistant", content_text(item.get("content")).strip(),
                                    reasoning_content=reasoning or None, tool_calls=calls or None))
        elif role == "tool":
            call_id = item.get("tool_call_id") or ""
            messages.append(message("tool", content_text(item.get("content")), tool_call_id=call_id,
                                    name=item.get("name") or call_names.get(call_id, "")))
    return messages


def trl_row(item: ExportRow) -> dict[str, Any]:
    messages, tools = sharegpt_to_messages(item.row["conversations"])
    if item.messages is not None:
        # The recorded messages never hold the data's system turn; keep one the ShareGPT row has
        # beyond the Hermes tools template (there is none in rows this product writes).
        messages = [m for m in messages if m["role"] == "system"] + agent_to_messages(item.messages)
    return {"messages": messages, "tools": _json(tools), "sample_key": item.row["sample_key"],
            "prompt_index": item.row["prompt_index"], "disposition": item.disposition}


@dataclass(frozen=True)
class TrlExport:
    rows: int
    paths: dict[str, Path]


def export_trl(run_dir: Path, include_discarded: bool = False) -> TrlExport:
    """Write `trl/messages.jsonl` and `trl/messages.parquet` (same rows, TRL_FEATURES)."""
    paths = ExportPaths(run_dir, include_discarded)
    rows = [trl_row(item) for item in collect_rows(paths.run, include_discarded)]
    atomic_write_jsonl(paths.trl_jsonl, rows)
    with atomic_path(paths.trl_parquet) as tmp:
        to_dataset(rows, TRL_FEATURES).to_parquet(str(tmp))
    return TrlExport(len(rows), {"messages_jsonl": paths.trl_jsonl, "messages_parquet": paths.trl_parquet})
