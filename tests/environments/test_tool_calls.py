"""The strict Hermes `<tool_call>` parser: valid calls in OpenAI shape, one error per malformed block,
and a malformed block never costs the valid ones around it."""

from __future__ import annotations

import json

import pytest

from hermes_core.environments.tool_calls import ParsedReply, parse_tool_calls


def block(obj: object) -> str:
    return f"<tool_call>\n{obj if isinstance(obj, str) else json.dumps(obj)}\n</tool_call>"


def call(index: int, name: str, arguments: dict) -> dict:
    return {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


LS = {"name": "terminal", "arguments": {"command": "ls"}}
CAT = {"name": "read_file", "arguments": {"path": "notes.txt"}}


def test_one_call_with_content_before_it() -> None:
    reply = parse_tool_calls("Let me check." + block(LS))
    assert reply == ParsedReply(content="Let me check.", calls=[call(0, "terminal", {"command": "ls"})], errors=[])
    assert json.loads(reply.calls[0]["function"]["arguments"]) == {"command": "ls"}


def test_two_calls_with_content_before_and_after() -> None:
    reply = parse_tool_calls("First.\n" + block(LS) + "\n" + block(CAT) + "\nThen I answer.")
    assert reply.calls == [call(0, "terminal", {"command": "ls"}), call(1, "read_file", {"path": "notes.txt"})]
    assert reply.content == "First.\n\n\nThen I answer." and reply.errors == []


def test_a_malformed_block_between_two_valid_ones_costs_only_itself() -> None:
    reply = parse_tool_calls(block(LS) + block('{"name": "terminal", "arguments": {"command": "ls"}') + block(CAT))
    assert reply.calls == [call(0, "terminal", {"command": "ls"}), call(1, "read_file", {"path": "notes.txt"})]
    assert len(reply.errors) == 1 and reply.errors[0].startswith("tool call block 2: bad JSON")
    assert reply.content is None


def test_an_unclosed_block_at_the_end_is_an_error_after_the_valid_calls() -> None:
    reply = parse_tool_calls("Sure." + block(LS) + '<tool_call>\n{"name": "read_file", "arguments": {"pa')
    assert reply.calls == [call(0, "terminal", {"command": "ls"})] and reply.content == "Sure."
    assert len(reply.errors) == 1 and reply.errors[0].startswith("tool call block 2: <tool_call> is never closed")


def test_a_complete_object_without_its_closing_tag_is_unclosed() -> None:
    reply = parse_tool_calls("<tool_call>" + json.dumps(LS))
    assert reply.calls == [] and reply.errors == ["tool call block 1: <tool_call> is never closed"]


def test_an_unclosed_block_followed_by_another_block_loses_only_itself() -> None:
    reply = parse_tool_calls('<tool_call>{"name": "terminal" ' + block(CAT))
    assert reply.calls == [call(0, "read_file", {"path": "notes.txt"})]
    assert reply.errors[0].startswith("tool call block 1: <tool_call> is never closed; bad JSON")


def test_a_stray_closing_tag_is_an_error_and_leaves_the_text() -> None:
    reply = parse_tool_calls("done </tool_call>" + block(LS))
    assert reply.calls == [call(0, "terminal", {"command": "ls"})] and reply.content == "done"
    assert reply.errors == ["tool call block 1: a stray </tool_call> with no <tool_call> before it"]


@pytest.mark.parametrize(("body", "why"), [
    ({"arguments": {"command": "ls"}}, 'no "name" string'),
    ({"name": 7, "arguments": {}}, '"name" is not a non-empty string'),
    ({"name": " ", "arguments": {}}, '"name" is not a non-empty string'),
    ('["terminal", {"command": "ls"}]', "the JSON is list, not an object"),
    ({"name": "terminal", "arguments": ["ls"]}, '"arguments" is list, not an object'),
    ({"name": "terminal", "arguments": '"ls"'}, '"arguments" is str, not an object'),
    ({"name": "terminal", "arguments": "ls -la"}, '"arguments" is a string that is not JSON'),
    ('{"name": "terminal"} and more', "text after the JSON object, before </tool_call>"),
    ("", "bad JSON"),
])
def test_each_malformed_block_says_why(body: object, why: str) -> None:
    reply = parse_tool_calls(block(body) + block(LS))
    assert reply.calls == [call(0, "terminal", {"command": "ls"})]
    assert len(reply.errors) == 1 and reply.errors[0].startswith(f"tool call block 1: {why}")


def test_arguments_given_as_a_json_string_holding_an_object_are_accepted() -> None:
    reply = parse_tool_calls(block({"name": "terminal", "arguments": json.dumps({"command": "ls"})}))
    assert reply.calls == [call(0, "terminal", {"command": "ls"})] and reply.errors == []


def test_a_call_without_arguments_takes_none() -> None:
    assert parse_tool_calls(block({"name": "get_time"})).calls == [call(0, "get_time", {})]


def test_a_closing_tag_and_braces_inside_a_json_string_stay_data() -> None:
    arguments = {"path": "a.txt", "content": "a </tool_call> b {not: json} <tool_call> c"}
    reply = parse_tool_calls(block({"name": "write_file", "arguments": arguments}) + " done")
    assert reply.calls == [call(0, "write_file", arguments)]
    assert reply.content == "done" and reply.errors == []


def test_unicode_arguments_stay_readable() -> None:
    reply = parse_tool_calls(block({"name": "terminal", "arguments": {"command": "echo café 😀"}}))
    assert reply.calls[0]["function"]["arguments"] == '{"command": "echo café 😀"}'


@pytest.mark.parametrize("text", ["Just an answer, no tools.", "  ", ""])
def test_no_blocks_is_only_content(text: str) -> None:
    assert parse_tool_calls(text) == ParsedReply(content=text.strip() or None, calls=[], errors=[])
