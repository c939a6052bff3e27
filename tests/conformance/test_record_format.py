"""Issue 19, item 4: the records we save against those Hermes Agent 0.19.0 saves, per fixture case.

Each case of fixtures/messages.json runs through our real agent loop: a replay endpoint on
127.0.0.1 answers with the case's assistant messages exactly as an endpoint returned them
(reasoning fields, inline tags), and the offered tools answer with the case's tool results (the
real tools' definitions, canned answers; an unknown tool gets the loop's own reply). The records
are then made as the batch makes them (`to_conversations`, `tool_stats`) and compared with the
oracle's `sharegpt` (the original's message builder, tool-result messages and converter).

What may differ, and nothing else:
- with our prose (`OWN_TEXT`, the default): the system turn's sentences (`HermesText`: preamble,
  schema intro, call instruction, example intro) and the notice line inside
  `<untrusted_tool_result>`; in the system turn also the tool list itself (which tools, their
  descriptions and parameters: test_hermes_agent_oracle.py owns those), so there only its layout
  is compared. Every other turn is compared byte for byte with the notice masked.
- with the original's prose and tool definitions (read out of the oracle at test time, as
  `--hermes_agent_python` will), nothing: every turn, the system turn included, is byte-equal.
- tool_stats: a call of a tool that does not exist is a failure here (SPEC §4/§8.1) and a success
  there (hallucinated_tool).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hermes_core import AIAgent
from hermes_core.asgi_thread import ThreadedServer, uvicorn_config
from hermes_core.formats.hermes_text import OWN_TEXT, HermesText
from hermes_core.formats.sharegpt import FUNCTION_CALL_SCHEMA, reasoning_coverage, to_conversations, tool_stats
from hermes_core.tools import ToolContext, registry
from hermes_core.tools.registry import ToolRegistry

from .conftest import FIXTURES

CASES: dict[str, dict[str, Any]] = json.loads(FIXTURES.read_text(encoding="utf-8"))["cases"]
MASK = "<NOTICE>"


def replay_app() -> Starlette:
    """Chat completions answered from the fixture: the model name is the case, the number of
    assistant messages already in the request is the step."""
    async def chat(request: Request) -> Response:
        body = await request.json()
        replies = [m for m in CASES[body["model"]]["messages"] if m["role"] == "assistant"]
        message = replies[sum(1 for m in body["messages"] if m["role"] == "assistant")]
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return JSONResponse({"choices": [{"message": message, "finish_reason": finish}], "usage": usage,
                             "model": body["model"]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.fixture(scope="module")
def replay_url() -> Iterator[str]:
    server = ThreadedServer(uvicorn_config(replay_app()), name="replay").start()
    yield server.url("/v1")
    server.stop()


class CannedTools(ToolRegistry):
    """The real tools of some toolsets (same names, membership and definitions), answering each
    call with the case's recorded result instead of running."""

    def __init__(self, case: dict[str, Any]):
        super().__init__()
        for toolset in case["toolsets"]:
            for tool in registry.tools_of([toolset]):
                self.register(tool.function, toolset, name=tool.name)
        calls = {c["id"]: c["function"] for m in case["messages"] for c in m.get("tool_calls") or []}
        self.replies = {self.key(calls[m["tool_call_id"]]["name"], json.loads(calls[m["tool_call_id"]]["arguments"])):
                        m["content"] for m in case["messages"] if m["role"] == "tool" and "content" in m}

    @staticmethod
    def key(name: str, arguments: dict[str, Any]) -> str:
        return json.dumps([name, arguments], sort_keys=True)

    def call(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> str:
        return self.replies[self.key(name, arguments)]


def run_case(url: str, name: str, text: HermesText = OWN_TEXT) -> dict[str, Any]:
    case = CASES[name]
    agent = AIAgent(model=name, base_url=url, api_key="replay", quiet_mode=True, max_retries=0,
                    enabled_toolsets=case["toolsets"], tool_registry=CannedTools(case), hermes_text=text)
    result = agent.run_conversation(case["messages"][0]["content"])
    assert result["completed"] and not result["failed"], result["error"]
    return result


def records(result: dict[str, Any], definitions: list[dict[str, Any]], text: HermesText = OWN_TEXT) -> list[dict]:
    """`conversations` as hermes_core.batch.records.build_record makes them."""
    return to_conversations(result["messages"], definitions, text)


def our_definitions(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [registry.get(name).definition() for name in result["tools_offered"]]


def their_tools(oracle: dict[str, Any], name: str) -> list[dict[str, Any]]:
    system = oracle["sharegpt"][name][0]["value"]
    return json.loads(system.partition("<tools>\n")[2].partition("\n</tools>")[0])


def their_notice(oracle: dict[str, Any]) -> str:
    """The line after the opening tag of a result the original wrapped."""
    wrapped = next(m["content"] for messages in oracle["agent_messages"].values() for m in messages
                   if m["role"] == "tool" and str(m["content"]).startswith("<untrusted_tool_result"))
    return wrapped.split("\n")[1]


def their_text(oracle: dict[str, Any]) -> HermesText:
    return HermesText.from_system_turn(oracle["sharegpt"]["plain_answer"][0]["value"], their_notice(oracle))


def masked(value: str, notice: str) -> str:
    """The notice line masked, also where it sits JSON-escaped inside a tool_response."""
    return value.replace(json.dumps(notice, ensure_ascii=False)[1:-1], MASK)


@pytest.mark.parametrize("name", list(CASES))
def test_every_turn_after_the_system_turn_is_the_originals(oracle, replay_url, name) -> None:
    ours = records(run_case(replay_url, name), [])
    theirs = oracle["sharegpt"][name]
    assert [t["from"] for t in ours] == [t["from"] for t in theirs]
    notice = their_notice(oracle)
    for mine, original in zip(ours[1:], theirs[1:]):
        assert masked(mine["value"], OWN_TEXT.untrusted_notice) == masked(original["value"], notice)


@pytest.mark.parametrize("name", list(CASES))
def test_the_system_turn_has_the_originals_layout(oracle, replay_url, name) -> None:
    """Prose aside, our system turn is laid out as theirs: same lines around the tools, the
    FunctionCall schema as a Python repr, the example as they write it, and tool objects
    `{name, description, parameters, required: null}` sorted by name."""
    result = run_case(replay_url, name)
    ours = records(result, our_definitions(result))[0]["value"]
    theirs = oracle["sharegpt"][name][0]["value"]
    assert HermesText.from_system_turn(ours, OWN_TEXT.untrusted_notice) == OWN_TEXT  # checks the layout
    for text in (ours, theirs):
        assert text.partition("\n</tools>\n")[2].split("\n")[1] == repr(FUNCTION_CALL_SCHEMA)
        tools = json.loads(text.partition("<tools>\n")[2].partition("\n</tools>")[0])
        assert tools and all(list(tool) == ["name", "description", "parameters", "required"] for tool in tools)
        assert all(tool["required"] is None for tool in tools)
        assert [tool["name"] for tool in tools] == sorted(tool["name"] for tool in tools)


@pytest.mark.parametrize("name", list(CASES))
def test_with_the_originals_prose_every_byte_is_the_originals(oracle, replay_url, name) -> None:
    """What `--hermes_agent_python` is for: given the original's wording and tool definitions,
    the whole record, system turn included, is the original's byte for byte."""
    text = their_text(oracle)
    ours = records(run_case(replay_url, name, text), their_tools(oracle, name), text)
    assert json.dumps(ours, ensure_ascii=False) == json.dumps(oracle["sharegpt"][name], ensure_ascii=False)


@pytest.mark.parametrize("name", list(CASES))
def test_the_converter_alone_writes_the_originals_bytes(oracle, name) -> None:
    """Our converter on the fixture messages as given (no agent loop) writes what theirs writes on
    them (`sharegpt_direct`): verbatim reasoning, scratchpad tags turned into think tags in place,
    the empty think block only where no think block is."""
    messages = copy.deepcopy(CASES[name]["messages"])
    stored = oracle["agent_messages"][name]
    for index, message in enumerate(messages):
        if message.pop("unknown_tool_reply", False):
            message["content"] = stored[index]["content"]
    ours = to_conversations(messages, their_tools(oracle, name), their_text(oracle))
    assert ours == oracle["sharegpt_direct"][name]


@pytest.mark.parametrize("name", list(CASES))
def test_tool_stats_and_reasoning_coverage_are_the_originals(oracle, replay_url, name) -> None:
    """Counted as batch_runner counts them, a nested `{"content": {"error": ...}}` a failure too;
    except a call of a tool that does not exist: a failure by SPEC §4/§8.1, a success there."""
    result = run_case(replay_url, name)
    ours = {tool: s for tool, s in tool_stats(result["messages"], registry.universe)[0].items() if s["count"]}
    assert result["tool_stats"] == ours
    theirs = oracle["tool_stats"][name]
    if name == "hallucinated_tool":
        assert theirs == {"list_directory": {"count": 1, "success": 1, "failure": 0}}
        assert ours == {"list_directory": {"count": 1, "success": 0, "failure": 1}}
    else:
        assert ours == theirs
    total, with_reasoning = reasoning_coverage(result["messages"])
    stats = oracle["reasoning_stats"][name]
    assert (total, with_reasoning) == (stats["total_assistant_turns"], stats["turns_with_reasoning"])
