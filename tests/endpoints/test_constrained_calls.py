"""tool_call_mode constrained: tools through a JSON-schema reply, for models without tool calling.
Against the simulated endpoint, which answers such requests with the JSON object the schema asks for
(the real-model path is tests/endpoints/test_local_model.py)."""

from __future__ import annotations

import json

import pytest

from hermes_core import AIAgent
from hermes_core.endpoints import constrained
from hermes_core.endpoints.simulated import SimulatedModelServer
from hermes_core.tools import registry
from hermes_assets.cli import batch_main
from hermes_core.config import data_root




@pytest.fixture
def recorded(monkeypatch):
    import hermes_core.endpoints.simulated.server as server

    bodies: list[dict] = []
    original = server.respond

    def respond(body, attempt=1):
        bodies.append(body)
        return original(body, attempt)

    monkeypatch.setattr(server, "respond", respond)
    with SimulatedModelServer() as sim:
        yield sim.base_url, bodies


def test_requests_carry_no_tools_and_replies_become_tool_calls(recorded):
    url, bodies = recorded
    agent = AIAgent(model="hermes-sim", base_url=url, api_key="k", quiet_mode=True, enabled_toolsets=["terminal"],
                    tool_call_mode="constrained")
    result = agent.run_conversation("Run a shell command that prints 'hi there'")
    assert result["completed"] and not result["failed"] and result["tool_call_mode"] == "constrained"
    # Stored like a native trajectory: a real tool call, a tool result, a final answer.
    assert [m["role"] for m in result["messages"]] == ["user", "assistant", "tool", "assistant"]
    call = result["messages"][1]["tool_calls"][0]["function"]
    assert call["name"] == "terminal" and "hi there" in json.loads(call["arguments"])["command"]
    assert json.loads(result["messages"][2]["content"])["exit_code"] == 0
    assert "terminal" in result["final_response"] and not result["final_response"].startswith("{")
    # On the wire: no `tools`, the tools described in the system message, a schema on the reply,
    # and the history as plain user/assistant turns.
    first, second = bodies
    assert "tools" not in first and first["messages"][0]["role"] == "system" and '"terminal"' in first["messages"][0]["content"]
    names = [option["properties"].get("tool", {}).get("enum") for option in first["response_format"]["json_schema"]["schema"]["anyOf"]]
    assert names == [["terminal"], ["process"], None]  # the terminal toolset: terminal and process
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert json.loads(second["messages"][2]["content"])["tool"] == "terminal"
    assert second["messages"][3]["content"].startswith("Result of terminal:\n")


def test_reply_parsing_keeps_what_is_not_a_call_as_text():
    assert constrained.parse_reply('{"final_answer": "42"}') == ("42", None)
    assert constrained.parse_reply('{"tool": "terminal"') == ('{"tool": "terminal"', None)  # cut off by max_tokens
    content, calls = constrained.parse_reply('{"tool": "terminal", "arguments": {"command": "ls"}}')
    assert content is None and calls[0]["function"] == {"name": "terminal", "arguments": '{"command": "ls"}'}


def test_every_tool_schema_fits_in_the_reply_schema():
    tools = [tool.openai_schema() for tool in registry.available(registry.toolsets)]
    schema = constrained.reply_schema(tools)
    assert len(schema["anyOf"]) == len(tools) + 1
    json.dumps(schema)  # plain JSON, as response_format needs


def test_batch_run_in_constrained_mode_marks_its_rows(isolated_homes, sim_url, tmp_path):
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in
                               ["Run a shell command that lists the folder", "What is 2+2?"]))
    argv = [f"--dataset_file={dataset}", "--run_name=c1", f"--base_url={sim_url}", "--api_key=k",
            "--distribution=terminal_only", "--tool_call_mode=constrained"]
    assert batch_main(argv) == 0
    rows = [json.loads(line) for line in (data_root() / "c1" / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and {row["metadata"]["tool_call_mode"] for row in rows} == {"constrained"}
    assert any("<tool_call>" in turn["value"] for row in rows for turn in row["conversations"] if turn["from"] == "gpt")
    # The mode is part of the recipe: the same run name in native mode is refused.
    assert batch_main(argv[:-1]) == 2
