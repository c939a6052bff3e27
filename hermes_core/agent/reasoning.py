"""Reasoning capture (SPEC §4), as Hermes Agent 0.19.0 stores an assistant message.

- Message fields, all of them: `reasoning`, then `reasoning_content` (unless it repeats an earlier
  part), then each `reasoning_details` block's summary/thinking/content/text, joined with a blank
  line. Field text is kept verbatim (the record writes it unstripped inside `<think>`).
- Only when no field has any: `thinking` blocks of list content, else inline `<think>`,
  `<thinking>`, `<thought>`, `<reasoning>`, `<REASONING_SCRATCHPAD>` blocks (all blocks of the first
  tag, then of the next...), each stripped.
- The content always loses its inline reasoning blocks (closed pairs, an unterminated block that
  opens a line, stray tags) and its outer whitespace.
"""

from __future__ import annotations

import re
from typing import Any

REASONING_FIELDS = ("reasoning", "reasoning_content", "reasoning_details")
INLINE_TAGS = ("think", "thinking", "thought", "reasoning", "REASONING_SCRATCHPAD")
_DETAIL_KEYS = ("summary", "thinking", "content", "text")
_FLAGS = re.DOTALL | re.IGNORECASE
_PAIRS = [re.compile(rf"<{tag}>(.*?)</{tag}>", _FLAGS) for tag in INLINE_TAGS]
_TAGS = "|".join(INLINE_TAGS)
_UNTERMINATED = re.compile(rf"(?:^|\n)[ \t]*<(?:{_TAGS})\b[^>]*>.*$", _FLAGS)
_STRAY = re.compile(rf"</?(?:{_TAGS})>\s*", re.IGNORECASE)


def _field_parts(message: dict[str, Any]) -> list[str]:
    parts: list[str] = []

    def add(text: Any) -> None:
        if text and isinstance(text, str) and text not in parts:
            parts.append(text)

    if message.get("reasoning") and isinstance(message["reasoning"], str):
        parts.append(message["reasoning"])  # the first part is never a duplicate
    add(message.get("reasoning_content"))
    for detail in message.get("reasoning_details") or []:
        if isinstance(detail, dict):
            add(next((detail[key] for key in _DETAIL_KEYS if detail.get(key)), None))
    return parts


def _inline_parts(content: Any) -> list[str]:
    parts: list[str] = []
    if isinstance(content, list):  # e.g. [{"type": "thinking", "thinking": "..."}, {"type": "text", ...}]
        blocks = [b.get("thinking") or b.get("text") or "" for b in content
                  if isinstance(b, dict) and b.get("type") == "thinking"]
    elif isinstance(content, str):
        blocks = [block for pattern in _PAIRS for block in pattern.findall(content)]
    else:
        blocks = []
    for block in blocks:
        if isinstance(block, str) and block.strip() and block.strip() not in parts:
            parts.append(block.strip())
    return parts


def strip_reasoning_blocks(content: str) -> str:
    """Content without inline reasoning: closed pairs, then an unterminated block opening a line
    (to the end), then stray open/close tags; outer whitespace stripped."""
    for pattern in _PAIRS:
        content = pattern.sub("", content)
    return _STRAY.sub("", _UNTERMINATED.sub("", content)).strip()


def extract_reasoning(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """(reasoning, content without inline reasoning blocks) of one assistant message as an
    endpoint returned it. Reasoning is None when there is none; blank field text is kept (the
    record then writes the empty think block, and coverage does not count it)."""
    content = message.get("content")
    parts = _field_parts(message) or _inline_parts(content)
    if isinstance(content, str) and content:
        content = strip_reasoning_blocks(content)
    return ("\n\n".join(parts) or None), content
