"""The simulated OpenAI-compatible model: protocol shape, deterministic policy and directives."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hermes_core.endpoints.simulated import MODEL_ID, SimulatedModelServer
from hermes_core.endpoints.simulated.policy import conform, respond

REPO = Path(__file__).resolve().parents[2]


def _fn(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": schema}}


TERMINAL = _fn("terminal", {"command": {"type": "string"}}, ["command"])
EXECUTE_CODE = _fn("execute_code", {"code": {"type": "string"}}, ["code"])
WRITE_FILE = _fn("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"])
READ_FILE = _fn("read_file", {"path": {"type": "string"}}, ["path"])
WEB_SEARCH = _fn("web_search", {"query": {"type": "string"}}, ["query"])
ALL_TOOLS = [TERMINAL, EXECUTE_CODE, WRITE_FILE, READ_FILE, WEB_SEARCH]


@pytest.fixture(scope="module")
def server() -> Any:
    with SimulatedModelServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: SimulatedModelServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are Hermes."}, {"role": "user", "content": text}]


def extra(message: Any, name: str) -> Any:
    return (message.model_extra or {}).get(name)


def add_round(messages: list[dict[str, Any]], message: Any, result: str = "hello from the tool") -> None:
    """Append the assistant tool-call message and one tool result per call, as an agent would."""
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], tools: list[Any] | None = None, **kw: Any) -> Any:
    extra_kw = {"tools": tools} if tools else {}
    return client.chat.completions.create(model="anything", messages=messages, **extra_kw, **kw)


def collect_stream(client: openai.OpenAI, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> dict:
    """Assemble a streamed reply the way an agent does, including non-standard reasoning fields."""
    out: dict[str, Any] = {"content": "", "reasoning": {}, "calls": {}, "finish": None, "usage": None, "chunks": 0}
    stream = ask(client, messages, tools, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        out["chunks"] += 1
        if chunk.usage is not None:
            assert chunk.choices == []
            out["usage"] = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            out["content"] += delta.content or ""
            for name, value in (delta.model_extra or {}).items():
                part = value if isinstance(value, str) else "".join(v["text"] for v in value)
                out["reasoning"][name] = out["reasoning"].get(name, "") + part
            for tc in delta.tool_calls or []:
                slot = out["calls"].setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                if tc.function:
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
            out["finish"] = choice.finish_reason or out["finish"]
    return out


def test_models_and_health(server: SimulatedModelServer, client: openai.OpenAI) -> None:
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    assert models.data[0].owned_by == "hermes-foundry-simulated"
    health = httpx.get(f"http://127.0.0.1:{server.port}/health")
    assert health.json() == {"status": "ok", "simulated": True}


def test_sim_requests_counts_what_was_sent_as_the_readme_says() -> None:
    with SimulatedModelServer() as fresh:
        url = f"http://127.0.0.1:{fresh.port}/sim/requests"
        assert httpx.get(url).json()["requests"] == 0
        started = time.time()
        for _ in range(2):  # the same sample twice: paid for twice
            httpx.post(f"{fresh.base_url}/chat/completions",
                       json={"model": MODEL_ID, "messages": [{"role": "user", "content": "Say hi"}]})
        seen = httpx.get(url).json()
        assert seen["requests"] == 2 and seen["sample_starts"] == {"Say hi": 2} and seen["max_in_flight"] == 1
        assert started <= seen["first_at"] <= seen["last_at"]
        assert httpx.get(url, params={"since": time.time() + 60}).json()["first_at"] is None  # none since then


def test_tool_call_then_final_answer(client: openai.OpenAI) -> None:
    messages = user("Please run 'hi there' in the shell")
    first = ask(client, messages, [TERMINAL])
    assert first.model == MODEL_ID and first.system_fingerprint == "hermes-sim-simulated"
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "terminal" and call.id.startswith("call_")
    assert "hi there" in json.loads(call.function.arguments)["command"]
    assert "`terminal`" in extra(choice.message, "reasoning_content")
    assert first.usage.completion_tokens_details.reasoning_tokens > 0
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens

    add_round(messages, choice.message, "hi there\ntotal 0")
    final = ask(client, messages, [TERMINAL])
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls
    assert "`terminal`" in final.choices[0].message.content and "hi there" in final.choices[0].message.content
    assert ask(client, messages, [TERMINAL]).choices[0].message.content == final.choices[0].message.content


def test_stream_matches_non_stream(client: openai.OpenAI) -> None:
    messages = user("Calculate the sum with python [sim:tools=1]")
    plain = ask(client, messages, ALL_TOOLS).choices[0].message
    streamed = collect_stream(client, messages, ALL_TOOLS)
    assert streamed["chunks"] > 5 and streamed["finish"] == "tool_calls"
    assert streamed["reasoning"] == {"reasoning_content": extra(plain, "reasoning_content")}
    (call,) = streamed["calls"].values()
    assert (call["id"], call["name"]) == (plain.tool_calls[0].id, "execute_code")
    assert call["arguments"] == plain.tool_calls[0].function.arguments
    assert streamed["usage"].total_tokens > 0

    add_round(messages, plain, "45")
    final_plain = ask(client, messages, ALL_TOOLS).choices[0].message.content
    final_stream = collect_stream(client, messages, ALL_TOOLS)
    assert final_stream["content"] == final_plain and final_stream["finish"] == "stop"


def test_no_tools_direct_answer_and_determinism(client: openai.OpenAI) -> None:
    a = ask(client, user("What is 6 * 7?"))
    b = ask(client, user("What is 6 * 7?"))
    assert "42" in a.choices[0].message.content and a.choices[0].finish_reason == "stop"
    assert a.choices[0].message.content == b.choices[0].message.content and a.id == b.id
    offered_none = ask(client, user("run ls"), [TERMINAL], tool_choice="none").choices[0]
    assert offered_none.finish_reason == "stop" and not offered_none.message.tool_calls


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("Write a file called todo.md with 'buy milk'", "write_file"),
        ("Search the web for the latest news about Rust", "web_search"),
        ("Read the contents of config.json", "read_file"),
        ("Hello there", "terminal"),  # no keyword: preference order
    ],
)
def test_tool_chosen_by_keywords(client: openai.OpenAI, prompt: str, expected: str) -> None:
    (call,) = ask(client, user(prompt), ALL_TOOLS).choices[0].message.tool_calls
    assert call.function.name == expected
    args = json.loads(call.function.arguments)
    if expected in ("write_file", "read_file"):
        assert args["path"] in ("todo.md", "config.json")


def test_unknown_tool_arguments_follow_schema(client: openai.OpenAI) -> None:
    odd = _fn("frobnicate", {"label": {"type": "string"}, "count": {"type": "integer"},
                             "mode": {"type": "string", "enum": ["fast", "slow"]}, "flag": {"type": "boolean"}},
              ["label", "count", "mode"])
    (call,) = ask(client, user("Do the thing"), [odd]).choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "frobnicate" and args["count"] == 1 and args["mode"] == "fast"
    assert isinstance(args["label"], str) and "flag" not in args
    memory_schema = {"type": "object", "required": ["action", "target"], "properties": {
        "action": {"type": "string", "enum": ["add", "remove"]}, "target": {"type": "string", "enum": ["memory"]},
        "content": {"type": "string"}}}
    fitted = conform({"action": "add", "content": "x", "bogus": 1}, memory_schema, "remember")
    assert fitted == {"action": "add", "content": "x", "target": "memory"}


def test_multiple_rounds_and_rotation(client: openai.OpenAI) -> None:
    messages = user("Write a file and then read it back [sim:tools=2]")
    names = []
    for _ in range(2):
        message = ask(client, messages, ALL_TOOLS).choices[0].message
        names.append(message.tool_calls[0].function.name)
        add_round(messages, message)
    assert names == ["write_file", "read_file"]
    final = ask(client, messages, ALL_TOOLS).choices[0]
    assert final.finish_reason == "stop" and "`write_file`" in final.message.content


def test_reasoning_directives(client: openai.OpenAI) -> None:
    none = ask(client, user("hi [sim:no-reasoning]")).choices[0].message
    assert not (none.model_extra or {}) and "<think>" not in none.content
    inline = ask(client, user("hi [sim:think-inline]"), [TERMINAL]).choices[0].message
    assert inline.content.startswith("<think>") and "</think>" in inline.content and not (inline.model_extra or {})
    assert inline.tool_calls
    plain = ask(client, user("hi [sim:reasoning-field=reasoning]")).choices[0].message
    assert extra(plain, "reasoning") and extra(plain, "reasoning_content") is None
    details = ask(client, user("hi [sim:reasoning-field=reasoning_details]")).choices[0].message
    assert extra(details, "reasoning_details")[0]["type"] == "reasoning.text"
    streamed = collect_stream(client, user("hi [sim:reasoning-field=reasoning_details]"))
    assert streamed["reasoning"] == {"reasoning_details": extra(details, "reasoning_details")[0]["text"]}


def test_hallucinate_then_recover(client: openai.OpenAI) -> None:
    messages = user("run ls [sim:hallucinate]")
    bad = ask(client, messages, [TERMINAL]).choices[0].message
    assert bad.tool_calls[0].function.name == "quantum_teleport"
    assert json.loads(bad.tool_calls[0].function.arguments) == {"target": "mars"}
    add_round(messages, bad, '{"error": "Unknown tool quantum_teleport"}')
    good = ask(client, messages, [TERMINAL]).choices[0].message
    assert good.tool_calls[0].function.name == "terminal"
    add_round(messages, good)
    assert ask(client, messages, [TERMINAL]).choices[0].finish_reason == "stop"


def test_hallucinate_always(client: openai.OpenAI) -> None:
    messages = user("run ls [sim:hallucinate-always]")
    for _ in range(3):
        message = ask(client, messages, [TERMINAL]).choices[0].message
        assert message.tool_calls[0].function.name == "quantum_teleport"
        add_round(messages, message, '{"error": "unknown tool"}')


def test_malformed_args_then_valid(client: openai.OpenAI) -> None:
    messages = user("run ls [sim:malformed-args]")
    bad = ask(client, messages, [TERMINAL]).choices[0].message
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad.tool_calls[0].function.arguments)
    add_round(messages, bad, '{"error": "invalid JSON arguments"}')
    good = ask(client, messages, [TERMINAL]).choices[0].message
    assert "command" in json.loads(good.tool_calls[0].function.arguments)


def test_rate_limit_then_success(server: SimulatedModelServer) -> None:
    body = {"model": "m", "messages": user("hi [sim:rate-limit=2] [sim:retry-after=0.01]")}
    url = f"{server.base_url}/chat/completions"
    for _ in range(2):
        response = httpx.post(url, json=body)
        assert response.status_code == 429 and response.headers["retry-after"] == "0.01"
        assert response.json()["error"]["type"] == "rate_limit_error"
    assert httpx.post(url, json=body).status_code == 200
    # The openai client honours Retry-After and succeeds within its retry budget.
    retrying = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=3)
    reply = retrying.chat.completions.create(model="m", messages=user("yo [sim:rate-limit=2]"))
    assert reply.choices[0].finish_reason == "stop"


def test_error_directives(client: openai.OpenAI, server: SimulatedModelServer) -> None:
    with pytest.raises(openai.InternalServerError):
        ask(client, user("hi [sim:error-500=1]"))
    assert ask(client, user("hi [sim:error-500=1]")).choices[0].finish_reason == "stop"
    for _ in range(3):
        with pytest.raises(openai.InternalServerError):
            ask(client, user("hi [sim:always-fail]"))
        with pytest.raises(openai.BadRequestError):
            ask(client, user("hi [sim:error=400]"))
    with pytest.raises(openai.NotFoundError):
        ask(client, user("hi [sim:error=404]"))
    url = f"{server.base_url}/chat/completions"
    malformed = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert malformed.status_code == 400 and "message" in malformed.json()["error"]
    assert httpx.post(url, json={"model": "m"}).status_code == 400


def test_loop_until_summary(client: openai.OpenAI) -> None:
    messages = user("run ls [sim:loop]")
    for _ in range(6):
        message = ask(client, messages, ALL_TOOLS).choices[0].message
        assert message.tool_calls
        add_round(messages, message)
    messages.append({"role": "user", "content": "Please summarize what you did so far."})
    final = ask(client, messages, ALL_TOOLS).choices[0]
    assert final.finish_reason == "stop" and not final.message.tool_calls
    assert final.message.content.startswith("Summary")


def test_parallel_calls(client: openai.OpenAI) -> None:
    message = ask(client, user("run ls [sim:parallel]"), ALL_TOOLS).choices[0].message
    assert len(message.tool_calls) == 2 and len({c.id for c in message.tool_calls}) == 2
    single = ask(client, user("run ls [sim:parallel]"), [TERMINAL]).choices[0].message
    args = [c.function.arguments for c in single.tool_calls]
    assert len(args) == 2 and args[0] != args[1]
    streamed = collect_stream(client, user("run ls [sim:parallel]"), ALL_TOOLS)
    assert [c["arguments"] for c in streamed["calls"].values()] == [c.function.arguments for c in message.tool_calls]


def test_no_tools_directive_and_latency(client: openai.OpenAI) -> None:
    assert not ask(client, user("run ls [sim:no-tools]"), [TERMINAL]).choices[0].message.tool_calls
    start = time.monotonic()
    ask(client, user("hi [sim:latency=0.3]"))
    assert time.monotonic() - start >= 0.3


def test_policy_is_pure() -> None:
    body = {"messages": user("run ls"), "tools": [TERMINAL]}
    assert respond(body, 1) == respond(body, 7)


def test_concurrent_requests_overlap() -> None:
    # Plain asyncio HTTP/1.1: httpx's own per-request overhead (~7 ms here, same process and GIL
    # as the server) would dominate the wall time and hide what the server does.
    async def post(port: int, index: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"model": "m", "messages": user(f"question {index}")}).encode()
        head = "POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
        writer.write(f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        response = await reader.read()
        writer.close()
        return response.split(b"\r\n", 1)[0]

    async def burst(port: int) -> list[bytes]:
        return await asyncio.gather(*(post(port, i) for i in range(200)))

    with SimulatedModelServer(latency=0.2) as slow:
        start = time.monotonic()
        status_lines = asyncio.run(burst(slow.port))
        elapsed = time.monotonic() - start
    assert status_lines == [b"HTTP/1.1 200 OK"] * 200
    assert 0.2 <= elapsed < 3.0, f"200 requests at 0.2 s took {elapsed:.2f} s: not concurrent"


def test_cli_writes_port_file(tmp_path: Path) -> None:
    port_file = tmp_path / "sim.port"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_core.endpoints.simulated", "--host", "127.0.0.1", "--port", "0",
         "--latency", "0.0", "--port-file", str(port_file)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert port_file.exists(), proc.stderr.read().decode() if proc.poll() is not None else "no port file"
        port = int(port_file.read_text())
        health = None
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert health is not None and health.json() == {"status": "ok", "simulated": True}
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
