"""Our ChatML template in the Hermes function-calling format (hermes_template.jinja), written in Python:
the same text, with each assistant turn's span noted while it is written. Through jinja, finding the
spans takes two renders of a prefix per assistant turn besides the whole (five renders for two turns,
two thirds of a rollout's CPU); here it is one pass. The tests check that both give the same text."""

from __future__ import annotations

import functools
import json
from typing import Any

TOOLS_INTRO = "You can call functions. Their signatures are inside <tools></tools>:\n<tools>"
TOOLS_OUTRO = '\n</tools>\nTo call one, write a JSON object with "name" and "arguments" inside <tool_call></tool_call>.'


def _text(value: Any) -> str:
    """What `{{ value }}` writes in a chat template (a missing or None value writes nothing)."""
    return value if isinstance(value, str) else "" if value is None else str(value)


def _tojson(value: Any) -> str:
    """The `tojson` filter of transformers' chat templates."""
    return json.dumps(value, ensure_ascii=False)


@functools.lru_cache(maxsize=64)
def _tools_block(tools_json: str) -> str:
    """The <tools> part of the system turn: the same for every rollout offered the same tools."""
    return TOOLS_INTRO + "".join("\n" + _tojson(tool["function"]) for tool in json.loads(tools_json)) + TOOLS_OUTRO


def render_hermes(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  generation_prompt: bool = False) -> tuple[str, list[tuple[int, int]]]:
    """The conversation as hermes_template.jinja renders it, and the character span of each assistant
    turn: from after its `<|im_start|>assistant\\n` through its `<|im_end|>`."""
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    size = 0

    def put(text: str) -> None:
        nonlocal size
        parts.append(text)
        size += len(text)

    first = messages[0] if messages else None
    system_first = first is not None and first.get("role") == "system"
    if tools or system_first:
        put("<|im_start|>system\n")
        if system_first:
            put(_text(first.get("content")) + ("\n\n" if tools else ""))  # type: ignore[union-attr]
        if tools:
            put(_tools_block(json.dumps(tools)))
        put("<|im_end|>\n")
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "system" and index == 0:
            continue
        if role in ("system", "user"):
            put(f"<|im_start|>{role}\n{_text(message.get('content'))}<|im_end|>\n")
        elif role == "assistant":
            put("<|im_start|>assistant\n")
            start, content = size, message.get("content")
            put(_text(content or ""))
            for number, call in enumerate(message.get("tool_calls") or []):
                function = call["function"]
                put(("\n" if content or number else "") + '<tool_call>\n{"name": ' + _tojson(function["name"]) +
                    ', "arguments": ' + _text(function.get("arguments") or "{}") + "}\n</tool_call>")
            put("<|im_end|>")
            spans.append((start, size))
            put("\n")
        elif role == "tool":
            put(f"<|im_start|>tool\n<tool_response>\n{_text(message.get('content'))}\n</tool_response><|im_end|>\n")
    if generation_prompt:
        put("<|im_start|>assistant\n")
    return "".join(parts), spans
