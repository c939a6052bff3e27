"""Reasoning capture as Hermes Agent stores an assistant message (hermes_core.agent.reasoning)."""

from __future__ import annotations

import pytest

from hermes_core.agent.reasoning import extract_reasoning


@pytest.mark.parametrize("message, reasoning", [
    ({"reasoning": "\nA thought.\n\n"}, "\nA thought.\n\n"),  # verbatim, not stripped
    ({"reasoning": "First.", "reasoning_content": "Second."}, "First.\n\nSecond."),
    ({"reasoning": "Same.", "reasoning_content": "Same."}, "Same."),  # a repeat is dropped
    ({"reasoning_content": "Only this."}, "Only this."),
    ({"reasoning_details": [{"type": "reasoning.summary", "summary": "S"}, {"text": "T"}, {"summary": "S"}]}, "S\n\nT"),
    ({"reasoning": "R", "reasoning_details": [{"thinking": "D"}]}, "R\n\nD"),
    ({"reasoning": "   "}, "   "),  # blank but present: the record writes the empty block
    ({"reasoning": "", "reasoning_content": None}, None),
])
def test_every_reasoning_field_is_joined(message: dict, reasoning: str | None) -> None:
    assert extract_reasoning({"role": "assistant", "content": "Hi", **message}) == (reasoning, "Hi")


def test_inline_blocks_are_read_only_without_fields_and_always_removed() -> None:
    content = "<thinking> b </thinking>Answer <think>a</think>\n<REASONING_SCRATCHPAD>c</REASONING_SCRATCHPAD> end "
    # All blocks of the first tag, then of the next: think, thinking, thought, reasoning, scratchpad.
    assert extract_reasoning({"content": content}) == ("a\n\nb\n\nc", "Answer \n end")
    assert extract_reasoning({"content": content, "reasoning": "field"}) == ("field", "Answer \n end")


@pytest.mark.parametrize("content, kept", [
    ("Visible.\n<think>never closed, to the end", "Visible."),  # unterminated block opening a line
    ("Use a </think> stray tag.", "Use a stray tag."),
    ("  <THINK>loud</THINK>  Hello!\n", "Hello!"),
    ("", ""),
    (None, None),
])
def test_content_loses_reasoning_tags_and_outer_whitespace(content: str | None, kept: str | None) -> None:
    assert extract_reasoning({"content": content})[1] == kept


def test_thinking_blocks_of_list_content() -> None:
    content = [{"type": "thinking", "thinking": " plan "}, {"type": "text", "text": "Done."}]
    assert extract_reasoning({"content": content}) == ("plan", content)
