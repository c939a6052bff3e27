"""SPEC §8.1: golden ShareGPT conversions, tool_stats normalisation and failure rules."""

from __future__ import annotations

import json

import pytest

from hermes_core.formats.sharegpt import (
    FUNCTION_CALL_SCHEMA,
    hermes_system_prompt,
    reasoning_coverage,
    to_conversations,
    tool_stats,
)
from hermes_core.tools.registry import BLANK_TOOL_NAME_REPLY, unknown_tool_reply

UNIVERSE = ["terminal", "process", "read_file", "write_file", "web_search"]

TERMINAL_DEF = {
    "name": "terminal",
    "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
READ_DEF = {
    "name": "read_file",
    "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def reply(call_id: str, name: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def test_system_template_has_tools_schema_and_call_format() -> None:
    """Laid out as Hermes Agent lays it out: tools sorted by name, each with `"required": null`;
    the FunctionCall schema as a Python repr and the example as it writes it."""
    text = hermes_system_prompt([TERMINAL_DEF, READ_DEF])
    assert "function" in text.split("<tools>")[0] and "one or more" in text
    tools_block = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(tools_block) == [{**READ_DEF, "required": None}, {**TERMINAL_DEF, "required": None}]
    assert f"\n{FUNCTION_CALL_SCHEMA!r}\n" in text
    assert FUNCTION_CALL_SCHEMA == {
        "title": "FunctionCall",
        "type": "object",
        "properties": {
            "name": {"title": "Name", "type": "string"},
            "arguments": {"title": "Arguments", "type": "object"},
        },
        "required": ["name", "arguments"],
    }
    assert text.endswith("\n<tool_call>\n{'name': <function-name>,'arguments': <args-dict>}\n</tool_call>")


def test_system_template_accepts_openai_wrapped_definitions() -> None:
    wrapped = {"type": "function", "function": TERMINAL_DEF}
    assert hermes_system_prompt([wrapped]) == hermes_system_prompt([TERMINAL_DEF])


def test_golden_full_conversation() -> None:
    messages = [
        {"role": "system", "content": "EPHEMERAL: be terse"},
        {"role": "user", "content": "  List files, then read a.txt  "},
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning": "I should list first.",
            "tool_calls": [call("c1", "terminal", '{"command": "ls"}'), call("c2", "read_file", '{"path": "a.txt"}')],
        },
        reply("c1", "terminal", '{"output": "a.txt\\n", "exit_code": 0}'),
        reply("c2", "read_file", "hello world"),
        {"role": "assistant", "content": "a.txt says hello world.", "reasoning": None},
    ]
    conversations = to_conversations(messages, [TERMINAL_DEF, READ_DEF])
    assert conversations == [
        {"from": "system", "value": hermes_system_prompt([TERMINAL_DEF, READ_DEF])},
        {"from": "human", "value": "  List files, then read a.txt  "},
        {
            "from": "gpt",
            "value": "<think>\nI should list first.\n</think>\nLet me look.\n"
            '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>',
        },
        {
            "from": "tool",
            "value": '<tool_response>\n{"tool_call_id": "c1", "name": "terminal", '
            '"content": {"output": "a.txt\\n", "exit_code": 0}}\n</tool_response>\n'
            '<tool_response>\n{"tool_call_id": "c2", "name": "read_file", "content": "hello world"}\n</tool_response>',
        },
        {"from": "gpt", "value": "<think>\n</think>\na.txt says hello world."},
    ]
    assert "EPHEMERAL" not in json.dumps(conversations)


def test_empty_think_block_and_calls_without_content() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call("x", "terminal", '{"command": "pwd"}')]},
        reply("x", "terminal", "/work"),
        {"role": "assistant", "content": "", "reasoning": "   "},
    ]
    turns = to_conversations(messages, [])
    assert turns[2]["value"] == (
        '<think>\n</think>\n<tool_call>\n{"name": "terminal", "arguments": {"command": "pwd"}}\n</tool_call>'
    )
    assert turns[4] == {"from": "gpt", "value": "<think>\n</think>"}  # the whole value is stripped


def test_reasoning_is_verbatim_and_only_the_value_is_stripped() -> None:
    """As Hermes Agent's converter: non-blank reasoning goes in unchanged; the content is not
    stripped (the agent loop strips it when it stores the message), the whole value is."""
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "\n\nAnswer.\n", "reasoning": "\nthink\n"},
        {"role": "assistant", "content": "  Calling.  ", "reasoning": " r ",
         "tool_calls": [call("a", "terminal", '{"command": "ls"}')]},
    ]
    turns = to_conversations(messages, [])
    assert turns[2]["value"] == "<think>\n\nthink\n\n</think>\n\n\nAnswer."
    assert turns[3]["value"] == (
        '<think>\n r \n</think>\n  Calling.  \n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>'
    )


def test_scratchpad_left_in_content_becomes_a_think_block_in_place() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<REASONING_SCRATCHPAD>plan</REASONING_SCRATCHPAD>\nDone."},
        {"role": "assistant", "content": "<think>x</think> Hi", "reasoning": "r"},
    ]
    turns = to_conversations(messages, [])
    assert turns[2]["value"] == "<think>plan</think>\nDone."  # a think block is there: no empty one added
    assert turns[3]["value"] == "<think>\nr\n</think>\n<think>x</think> Hi"


def test_tool_response_names_come_from_the_calls_by_position() -> None:
    """The n-th reply is named after the n-th call (`unknown` past the last); tool messages that
    answer no assistant message are not written."""
    messages = [
        {"role": "user", "content": "q"},
        {"role": "tool", "tool_call_id": "stray", "name": "terminal", "content": "orphan"},
        {"role": "assistant", "content": "", "tool_calls": [call("a", "terminal", "{}")]},
        reply("a", "misnamed", "one"),
        reply("b", "extra", "two"),
    ]
    turns = to_conversations(messages, [])
    assert [t["from"] for t in turns] == ["system", "human", "gpt", "tool"]
    assert turns[3]["value"] == (
        '<tool_response>\n{"tool_call_id": "a", "name": "terminal", "content": "one"}\n</tool_response>\n'
        '<tool_response>\n{"tool_call_id": "b", "name": "unknown", "content": "two"}\n</tool_response>'
    )


@pytest.mark.parametrize("arguments", ["{not json", "[1, 2]", '"a string"', "42"])
def test_unparsable_or_non_object_arguments_become_empty_object(arguments: str) -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning": "r", "tool_calls": [call("a", "terminal", arguments)]},
        reply("a", "terminal", "error: bad arguments"),
    ]
    assert to_conversations(messages, [])[2]["value"] == (
        '<think>\nr\n</think>\n<tool_call>\n{"name": "terminal", "arguments": {}}\n</tool_call>'
    )


@pytest.mark.parametrize(
    "content, embedded",
    [
        ('{"a": 1}', {"a": 1}),
        ("[1, 2]", [1, 2]),
        ("42", "42"),  # JSON, but not an object/array: kept as the string
        ('"quoted"', '"quoted"'),
        ("plain text", "plain text"),
        ("", ""),
    ],
)
def test_tool_content_parsed_only_when_json_object_or_array(content: str, embedded: object) -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call("a", "terminal", "{}")]},
        reply("a", "terminal", content),
    ]
    value = to_conversations(messages, [])[3]["value"]
    assert value.startswith("<tool_response>\n") and value.endswith("\n</tool_response>")
    assert json.loads(value[len("<tool_response>\n") : -len("\n</tool_response>")])["content"] == embedded


def test_later_user_message_is_human_and_tool_name_falls_back_to_call() -> None:
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "", "reasoning": "r",
         "tool_calls": [call("a", "web_search", '{"query": "x"}')]},
        {"role": "tool", "tool_call_id": "a", "content": "results"},
        {"role": "user", "content": "You reached the limit. Summarise."},
        {"role": "system", "content": "never written"},
        {"role": "assistant", "content": "Summary.", "reasoning": "wrap up"},
    ]
    turns = to_conversations(messages, [])
    assert [t["from"] for t in turns] == ["system", "human", "gpt", "tool", "human", "gpt"]
    assert turns[4]["value"] == "You reached the limit. Summarise."
    assert '"name": "web_search"' in turns[3]["value"]
    assert all("never written" not in t["value"] for t in turns)


def test_tool_stats_has_every_universe_tool_and_counts_hallucinated_names() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("1", "terminal", '{"command": "ls"}'), call("2", "teleport", '{"to": "mars"}')],
        },
        reply("1", "terminal", '{"output": "", "exit_code": 0}'),
        reply("2", "teleport", unknown_tool_reply("teleport", ["terminal"])),
    ]
    stats, errors = tool_stats(messages, UNIVERSE)
    assert list(stats) == UNIVERSE + ["teleport"]
    assert stats["terminal"] == {"count": 1, "success": 1, "failure": 0}
    assert stats["teleport"] == {"count": 1, "success": 0, "failure": 1}  # a call of no tool failed
    assert all(stats[name] == {"count": 0, "success": 0, "failure": 0} for name in UNIVERSE[1:])
    assert errors == {name: s["failure"] for name, s in stats.items()}
    empty_stats, empty_errors = tool_stats([{"role": "user", "content": "hi"}], UNIVERSE)
    assert list(empty_stats) == UNIVERSE and set(empty_errors.values()) == {0}


@pytest.mark.parametrize(
    "result, failed",
    [
        ('{"error": "file not found"}', True),
        ('{"error": null, "output": "ok"}', False),
        ('{"success": false, "message": "nope"}', True),
        ('{"success": true}', False),
        ("", True),
        ("   ", True),
        ("error: command not allowed", True),
        ("Error: something", True),
        ('{"output": "boom", "exit_code": 1}', False),  # non-zero exit codes are not failures
        ('{"content": {"error": "denied"}}', True),  # a nested error fails, as Hermes Agent counts it
        ('{"content": {"error": null, "output": "ok"}}', False),
        ('{"content": "error: in a string is data"}', False),
        ("plain output mentioning an error: inside", False),
        ("[1, 2]", False),
    ],
)
def test_failure_rules(result: str, failed: bool) -> None:
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [call("1", "terminal", '{"command": "x"}')]},
        reply("1", "terminal", result),
    ]
    stats, errors = tool_stats(messages, UNIVERSE)
    assert stats["terminal"] == {"count": 1, "success": int(not failed), "failure": int(failed)}
    assert errors["terminal"] == int(failed)


def test_malformed_arguments_and_missing_reply_are_failures() -> None:
    messages = [
        {"role": "assistant", "content": "",
         "tool_calls": [call("1", "read_file", "{oops"), call("2", "read_file", "{}")]},
        reply("1", "read_file", '{"content": "fine"}'),  # even a clean reply does not redeem bad arguments
        {"role": "assistant", "content": "", "tool_calls": [call("3", "write_file", '{"path": "a", "content": "b"}')]},
        {"role": "user", "content": "interrupted"},
    ]
    stats, errors = tool_stats(messages, UNIVERSE)
    assert stats["read_file"] == {"count": 2, "success": 0, "failure": 2}  # call 2 got no reply
    assert stats["write_file"] == {"count": 1, "success": 0, "failure": 1}
    assert errors["read_file"] == 2 and errors["write_file"] == 1


def test_reused_call_ids_match_replies_of_their_own_turn() -> None:
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [call("call_0", "terminal", '{"command": "a"}')]},
        reply("call_0", "terminal", '{"error": "denied"}'),
        {"role": "assistant", "content": "", "tool_calls": [call("call_0", "terminal", '{"command": "b"}')]},
        reply("call_0", "terminal", '{"output": "ok"}'),
    ]
    assert tool_stats(messages, UNIVERSE)[0]["terminal"] == {"count": 2, "success": 1, "failure": 1}


def test_reasoning_coverage() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning": "because"},
        {"role": "assistant", "content": "b", "reasoning": ""},
        {"role": "assistant", "content": "c", "reasoning": None},
        {"role": "assistant", "content": "d"},
    ]
    assert reasoning_coverage(messages) == (4, 1)
    assert reasoning_coverage([{"role": "user", "content": "q"}]) == (0, 0)


def test_unknown_tool_reply_lists_the_offered_tools_sorted_and_counts_as_failure() -> None:
    """Hermes Agent's structure; a failure by SPEC §4/§8.1 (Hermes Agent counts it a success)."""
    assert unknown_tool_reply("teleport", ["write_file", "patch", "read_file"]) == (
        "Tool 'teleport' does not exist. Available tools: patch, read_file, write_file"
    )
    assert unknown_tool_reply("  ", ["terminal"]) == BLANK_TOOL_NAME_REPLY  # no catalogue for a blank name
    for name in ("teleport", " "):
        messages = [
            {"role": "assistant", "content": "", "tool_calls": [call("1", name, "{}")]},
            reply("1", name, unknown_tool_reply(name, ["terminal"])),
        ]
        assert tool_stats(messages, UNIVERSE)[0][name] == {"count": 1, "success": 0, "failure": 1}
