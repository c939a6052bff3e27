"""SPEC §7: dispositions and the quality filters."""

from __future__ import annotations

import pytest

from hermes_core.formats.filters import Disposition, FilterSettings, classify, hallucinated_tools

UNIVERSE = ["terminal", "process", "read_file", "web_search"]
OFFERED = ["terminal", "process"]


def trajectory(*tool_names: str, reasoning: str | None = "thinking") -> list[dict]:
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
        for i, name in enumerate(tool_names)
    ]
    messages: list[dict] = [{"role": "user", "content": "q"}]
    if calls:
        messages.append({"role": "assistant", "content": "", "reasoning": None, "tool_calls": calls})
        messages += [
            {"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": "ok"} for c in calls
        ]
    messages.append({"role": "assistant", "content": "done", "reasoning": reasoning})
    return messages


def run(messages: list[dict], completed: bool = True, **settings: bool) -> str:
    return classify(
        messages, completed=completed, universe=UNIVERSE, offered=OFFERED, settings=FilterSettings(**settings)
    )


def test_defaults() -> None:
    s = FilterSettings()
    assert (s.require_reasoning, s.reject_hallucinated_tools, s.strict_offered_tools, s.discard_incomplete) == (
        True, True, False, False,
    )


def test_disposition_values_and_final_set() -> None:
    assert (Disposition.KEPT, Disposition.DISCARDED_NO_REASONING, Disposition.DISCARDED_HALLUCINATED_TOOL,
            Disposition.DISCARDED_INCOMPLETE, Disposition.FAILED_RETRYABLE, Disposition.FAILED_TERMINAL) == (
        "kept", "discarded_no_reasoning", "discarded_hallucinated_tool", "discarded_incomplete",
        "failed_retryable", "failed_terminal",
    )
    assert Disposition.FINAL == {
        "kept", "discarded_no_reasoning", "discarded_hallucinated_tool", "discarded_incomplete", "failed_terminal",
    }


def test_clean_trajectory_is_kept() -> None:
    assert run(trajectory("terminal", "process")) == Disposition.KEPT


def test_reasoning_on_any_turn_is_enough() -> None:
    messages = trajectory("terminal", reasoning=None)
    messages[1]["reasoning"] = "first turn thought"
    assert run(messages) == Disposition.KEPT


@pytest.mark.parametrize("reasoning", [None, "", "  \n"])
def test_no_reasoning_discarded_unless_disabled(reasoning: str | None) -> None:
    messages = trajectory("terminal", reasoning=reasoning)
    assert run(messages) == Disposition.DISCARDED_NO_REASONING
    assert run(messages, require_reasoning=False) == Disposition.KEPT


def test_hallucinated_tool_outside_universe() -> None:
    messages = trajectory("terminal", "teleport")
    assert run(messages) == Disposition.DISCARDED_HALLUCINATED_TOOL
    assert run(messages, reject_hallucinated_tools=False) == Disposition.KEPT
    assert hallucinated_tools(messages, UNIVERSE) == ["teleport"]


def test_hallucination_is_checked_before_reasoning() -> None:
    assert run(trajectory("teleport", reasoning=None)) == Disposition.DISCARDED_HALLUCINATED_TOOL


def test_strict_mode_uses_offered_tools() -> None:
    messages = trajectory("web_search")  # in the universe but not offered
    assert run(messages) == Disposition.KEPT
    assert run(messages, strict_offered_tools=True) == Disposition.DISCARDED_HALLUCINATED_TOOL
    assert hallucinated_tools(messages, UNIVERSE, OFFERED) == ["web_search"]
    # Strict mode without the hallucination filter keeps it.
    assert run(messages, strict_offered_tools=True, reject_hallucinated_tools=False) == Disposition.KEPT


def test_incomplete_only_discarded_when_configured() -> None:
    messages = trajectory("terminal")
    assert run(messages, completed=False) == Disposition.KEPT
    assert run(messages, completed=False, discard_incomplete=True) == Disposition.DISCARDED_INCOMPLETE
    assert run(messages, completed=True, discard_incomplete=True) == Disposition.KEPT
    no_reasoning = trajectory(reasoning=None)
    assert run(no_reasoning, completed=False, discard_incomplete=True) == Disposition.DISCARDED_NO_REASONING
