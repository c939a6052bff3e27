"""Reasoning capture (SPEC §4): message fields first, then inline tags moved out of the content."""

from __future__ import annotations

import re
from typing import Any

REASONING_FIELDS = ("reasoning_content", "reasoning", "reasoning_details")
_INLINE = re.compile(
    r"<(think|thinking|reasoning|REASONING_SCRATCHPAD)>(.*?)</\1>\s*", re.DOTALL | re.IGNORECASE
)


def _field_text(value: Any) -> str:
    """`reasoning_details` is a list of blocks ({text}/{summary}); the others are strings."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [_field_text(item.get("text") or item.get("summary") or "") for item in value if isinstance(item, dict)]
        return "\n".join(part for part in parts if part)
    return ""


def extract_reasoning(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """(reasoning, content without inline reasoning blocks) of one assistant message."""
    content = message.get("content")
    inline: list[str] = []
    if isinstance(content, str) and "<" in content:
        inline = [m.group(2).strip() for m in _INLINE.finditer(content)]
        if inline:
            content = _INLINE.sub("", content).strip()
    for field in REASONING_FIELDS:
        text = _field_text(message.get(field)).strip()
        if text:
            return text, content
    return ("\n\n".join(part for part in inline if part) or None), content
