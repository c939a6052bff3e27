"""Every message of a chat request checked against the chat-completions schema: a bad one is a 400
naming its field path, before any agent run (real server on 127.0.0.1)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from hermes_core.api_server import ApiServer
from api_servers import AUTH, client, sandbox_root, server, user  # noqa: F401  (fixtures)


CALL = {"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}
HISTORY = [{"role": "user", "content": "Run ls", "name": "ada"},
           {"role": "assistant", "content": None, "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a.txt"}]},
           {"role": "assistant", "content": [{"type": "text", "text": "One file."}], "refusal": None},
           {"role": "user", "content": [{"type": "text", "text": "look"},
                                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
           {"role": "assistant", "function_call": {"name": "terminal", "arguments": "{}"}},
           {"role": "function", "name": "terminal", "content": "ok"}]


def call(**changes: Any) -> dict[str, Any]:
    return {**CALL, **changes}


def fn(**changes: Any) -> dict[str, Any]:
    return call(function={**CALL["function"], **changes})


# (history messages before the final user message, the field path named, the error code)
BAD_HISTORIES = [
    ([{"role": "assistant", "content": None, "tool_calls": "garbage"}], "messages[0].tool_calls", "invalid_type"),
    ([{"role": "user", "content": 123}], "messages[0].content", "invalid_type"),
    ([{"role": "user"}], "messages[0].content", "missing_required_parameter"),
    (["hello"], "messages[0]", "invalid_type"),
    ([{"content": "hi"}], "messages[0].role", "missing_required_parameter"),
    ([{"role": "robot", "content": "hi"}], "messages[0].role", "invalid_value"),
    ([{"role": "user", "content": "hi", "name": 7}], "messages[0].name", "invalid_type"),
    ([{"role": "user", "content": []}], "messages[0].content", "invalid_value"),
    ([{"role": "user", "content": ["hi"]}], "messages[0].content[0]", "invalid_type"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content[0].text", "invalid_type"),
    ([{"role": "user", "content": [{"type": "video", "video": {}}]}], "messages[0].content[0].type", "invalid_value"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content[0].image_url.url",
     "missing_required_parameter"),
    ([{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content[0].type", "invalid_value"),
    ([{"role": "assistant", "content": None}], "messages[0].content", "missing_required_parameter"),
    ([{"role": "assistant", "content": "x", "refusal": 1}], "messages[0].refusal", "invalid_type"),
    ([{"role": "assistant", "tool_calls": []}], "messages[0].tool_calls", "invalid_value"),
    ([{"role": "assistant", "tool_calls": ["x"]}], "messages[0].tool_calls[0]", "invalid_type"),
    ([{"role": "assistant", "tool_calls": [{k: v for k, v in CALL.items() if k != "id"}]}],
     "messages[0].tool_calls[0].id", "missing_required_parameter"),
    ([{"role": "assistant", "tool_calls": [call(id=1)]}], "messages[0].tool_calls[0].id", "invalid_type"),
    ([{"role": "assistant", "tool_calls": [call(type="custom")]}], "messages[0].tool_calls[0].type", "invalid_value"),
    ([{"role": "assistant", "tool_calls": [call(function="terminal")]}], "messages[0].tool_calls[0].function",
     "invalid_type"),
    ([{"role": "assistant", "tool_calls": [fn(name=None)]}], "messages[0].tool_calls[0].function.name",
     "missing_required_parameter"),
    ([{"role": "assistant", "tool_calls": [fn(name="")]}], "messages[0].tool_calls[0].function.name", "invalid_value"),
    ([{"role": "assistant", "tool_calls": [fn(arguments={"command": "ls"})]}],
     "messages[0].tool_calls[0].function.arguments", "invalid_type"),
    ([{"role": "assistant", "function_call": {"name": "f", "arguments": 1}}], "messages[0].function_call.arguments",
     "invalid_type"),
    ([{"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "x"}], "messages[1].tool_call_id",
     "missing_required_parameter"),
    ([{"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": 1, "content": "x"}],
     "messages[1].tool_call_id", "invalid_type"),
    ([{"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_2", "content": "x"}],
     "messages[1].tool_call_id", "invalid_value"),
    ([{"role": "tool", "tool_call_id": "call_1", "content": "x"}], "messages[0].tool_call_id", "invalid_value"),
    ([{"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": 5}],
     "messages[1].content", "invalid_type"),
    ([{"role": "function", "content": "ok"}], "messages[0].name", "missing_required_parameter"),
]


def post_chat(server: ApiServer, body: Any) -> httpx.Response:
    return httpx.post(f"{server.base_url}/chat/completions", json=body, headers=AUTH, timeout=60)


@pytest.mark.parametrize("history, param, code", BAD_HISTORIES, ids=[f"{p}-{c}" for _, p, c in BAD_HISTORIES])
def test_bad_history_messages_are_400_naming_the_field(server: ApiServer, history: list, param: str,
                                                       code: str) -> None:
    response = post_chat(server, {"model": "hermes-agent", "messages": [*history, *user("Hi [sim:no-tools]")]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert f"'{param}'" in error["message"]
    assert server.active_runs == 0


def test_a_well_formed_history_of_every_role_reaches_the_agent(client: openai.OpenAI) -> None:
    messages = [{"role": "developer", "content": "Be brief."}, *HISTORY, *user("Thanks [sim:no-tools]")]
    reply = client.chat.completions.create(model="hermes-agent", messages=messages)
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\]\.tool_calls"):  # the official client too
        client.chat.completions.create(model="hermes-agent", messages=[
            *user("Run ls"), {"role": "assistant", "tool_calls": "garbage"}, *user("again")])


def test_request_level_errors_name_their_parameter(server: ApiServer) -> None:
    for body, param in (({"model": "m"}, "messages"), ({"messages": []}, "messages"),
                        ({"messages": [{"role": "assistant", "content": "hi"}]}, "messages[0].role"),
                        ({"messages": user("hi"), "temperature": "hot"}, "temperature"),
                        ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                                     "image_url": {"url": "x"}}]}]},
                         "messages[0].content[0].type")):
        response = post_chat(server, body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
