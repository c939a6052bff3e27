"""The OpenAI-compatible API server (SPEC §11), over real HTTP on 127.0.0.1, against the simulated
model, with tools running in real sandboxes; driven by the official `openai` client and raw httpx."""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hermes_core.api_server import ApiServer, SettingsError, load_settings, serve_main
from hermes_core.api_server.app import parse_chat_request
from hermes_core.sandbox.bubblewrap import ETC_COPY_PREFIX
from procs import processes_with, wait_until
from leftover_trees import BUILD_COMMAND, no_deep_tree_left  # noqa: F401 (fixture)
from api_servers import (ALLOWED, AUTH, KEY, TOOL_PROMPT, client, sandbox_root, server, settings,  # noqa: F401
                         start_server, user)  # (fixtures)



def raw_stream(server: ApiServer, text: str, headers: dict[str, str] | None = None) -> tuple[list, list[str]]:
    """(events as (event name, data), comments) of a streamed completion, read as raw SSE."""
    body = {"model": "hermes-agent", "stream": True, "messages": user(text)}
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, headers={**AUTH, **(headers or {})},
                          timeout=60)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events, comments = [], []
    for block in response.text.split("\n\n"):
        lines = [line for line in block.split("\n") if line]
        comments += [line for line in lines if line.startswith(":")]
        name = next((line[7:] for line in lines if line.startswith("event: ")), None)
        data = "\n".join(line[6:] for line in lines if line.startswith("data: "))
        if data:
            events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events, comments


def content_of(events: list) -> str:
    return "".join(d["choices"][0]["delta"].get("content") or "" for n, d in events if n is None and d != "[DONE]"
                   and d.get("choices"))


def command_running(marker: str) -> bool:
    """The command itself runs (not just the wrapper that moves into the sandbox's cgroup and execs bwrap):
    closing a bubblewrap sandbox while a command is still being launched can miss it (a sandbox-layer race)."""
    return any(found.startswith(marker) for found in processes_with(marker))


def test_health_models_and_security_headers(server: ApiServer, client: openai.OpenAI) -> None:
    health = httpx.get(server.url("/health"))  # no key needed, and it says nothing else
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    for name, value in (("x-content-type-options", "nosniff"), ("referrer-policy", "no-referrer"),
                        ("x-frame-options", "DENY"), ("cache-control", "no-store")):
        assert health.headers[name] == value
    assert [m.id for m in client.models.list().data] == ["hermes-agent"]


def test_request_mapping_system_history_and_last_user() -> None:
    chat = parse_chat_request({"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"}, {"role": "developer", "content": [{"type": "text", "text": "Rule"}]},
        {"role": "user", "content": [{"type": "text", "text": "second"}]}], "max_completion_tokens": 50})
    assert (chat.system, chat.user_message, chat.stream) == ("Be brief.\n\nRule", "second", False)
    assert chat.history == [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"}]
    assert chat.options == {"max_tokens": 50}


def test_our_inline_progress_lines_are_not_read_back_as_the_assistants_words() -> None:
    # What a chat frontend sends back on the next message: our streamed reply, progress lines included.
    streamed = "`🔧 terminal {\"command\": \"ls\"}`\n`🔧 read_file notes.txt`\n\nThe folder has notes.txt."
    chat = parse_chat_request({"messages": [
        {"role": "user", "content": "what is here?"}, {"role": "assistant", "content": streamed},
        {"role": "user", "content": "`🔧 x` is what I typed"}]})
    assert chat.history[1] == {"role": "assistant", "content": "The folder has notes.txt."}
    assert chat.user_message == "`🔧 x` is what I typed"  # a user's text is never touched


def test_non_stream_answer_with_usage(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "You are Hermes."}, *user("What is 6 * 7? [sim:no-tools]")]
    reply = client.chat.completions.create(model="hermes-agent", messages=messages)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == "hermes-agent"
    assert choice.finish_reason == "stop" and "42" in choice.message.content
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_a_reply_without_tools_opens_no_sandbox(start_server: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """A request's sandbox opens at its first tool call: a plain reply starts none (on docker, a container)."""
    boxes = tmp_path / "boxes"
    monkeypatch.setenv("HERMES_SANDBOX_STATE_ROOT", str(boxes))
    api = openai.OpenAI(base_url=start_server().base_url, api_key=KEY, max_retries=0, timeout=60)
    plain = api.chat.completions.create(model="hermes-agent", messages=user("What is 6 * 7? [sim:no-tools]"))
    assert "42" in plain.choices[0].message.content
    assert not boxes.exists()  # no session folder: nothing was opened
    tooled = api.chat.completions.create(model="hermes-agent", messages=user(TOOL_PROMPT))
    assert "served-by-hermes" in tooled.choices[0].message.content
    assert boxes.is_dir() and not any(boxes.iterdir())  # that one opened (and closed)


def test_tool_use_stream_assembled_by_the_openai_client(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="hermes-agent", messages=user(TOOL_PROMPT)).choices[0].message
    assert "served-by-hermes" in plain.content  # the agent ran the command server-side
    content, finish, usage, chunks = "", None, None, 0
    for chunk in client.chat.completions.create(model="hermes-agent", messages=user(TOOL_PROMPT), stream=True):
        chunks += 1
        content += chunk.choices[0].delta.content or ""  # the naive pattern: progress events must not break it
        finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    # A plain chat client gets the progress line inline by default (auto), then the same answer.
    assert content == f"`🔧 terminal {{\"command\": \"echo served-by-hermes\"}}`\n\n{plain.content}"
    assert finish == "stop" and chunks >= 5
    assert usage is not None and usage.total_tokens > 0


def test_stream_carries_named_progress_events(server: ApiServer) -> None:
    events, _ = raw_stream(server, TOOL_PROMPT, {"X-Hermes-Progress": "events"})
    progress = [data for name, data in events if name == "hermes.tool.progress"]
    assert [p["status"] for p in progress] == ["running", "completed"]
    assert {p["tool"] for p in progress} == {"terminal"} and len({p["toolCallId"] for p in progress}) == 1
    assert "echo served-by-hermes" in progress[0]["label"]
    assert events[0][1]["choices"][0]["delta"]["role"] == "assistant"
    final = events[-2][1]
    assert final["choices"][0]["finish_reason"] == "stop" and final["usage"]["total_tokens"] > 0
    assert events[-1] == (None, "[DONE]")
    content = content_of(events)
    assert "served-by-hermes" in content and "🔧" not in content  # the client asked for the named events only


def test_inline_progress_per_request_and_by_setting(server: ApiServer, start_server: Any) -> None:
    events, _ = raw_stream(server, TOOL_PROMPT)  # auto: a plain chat client sees the tools run
    assert content_of(events).startswith("`🔧 terminal {\"command\": \"echo served-by-hermes\"}`\n")
    events, _ = raw_stream(server, TOOL_PROMPT, {"X-Hermes-Session-Key": "channel-1"})  # Hermes-aware: events only
    assert "🔧" not in content_of(events) and any(name == "hermes.tool.progress" for name, _ in events)
    inline_server = start_server(inline_progress=True)
    events, _ = raw_stream(inline_server, TOOL_PROMPT, {"X-Hermes-Session-Key": "channel-1"})
    assert "`🔧 terminal" in content_of(events) and "served-by-hermes\\n" in content_of(events)
    assert any(name == "hermes.tool.progress" for name, _ in events)  # the named events stay
    events, _ = raw_stream(start_server(inline_progress=False), TOOL_PROMPT)
    assert "🔧" not in content_of(events)


def test_keepalive_comments_while_the_agent_works(start_server: Any) -> None:
    events, comments = raw_stream(start_server(keepalive_s=0.2), "Hello [sim:latency=1] [sim:no-tools]")
    assert ": ping" in comments and events[-1] == (None, "[DONE]")


def test_iteration_limit_reports_length(start_server: Any) -> None:
    srv = start_server(max_iterations=1)
    client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(model="hermes-agent", messages=user("run ls [sim:loop]"))
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content


def test_missing_or_wrong_key_is_401(server: ApiServer) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789"}, {"Authorization": f"Basic {KEY}"}):
        for method, path in (("GET", "/models"), ("POST", "/chat/completions")):
            response = httpx.request(method, server.base_url + path, headers=headers, json={"messages": user("hi")})
            assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=server.base_url, api_key="wrong-key-0123456789", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="hermes-agent", messages=user("hi"))


def test_refuses_to_start_without_a_proper_key_or_when_disabled(tmp_path: Path, monkeypatch: Any,
                                                                capsys: Any, sim_server: Any) -> None:
    env = {"HERMES_BASE_URL": sim_server.base_url, "HERMES_ENV_FILE": str(tmp_path / "missing.env")}
    with pytest.raises(SettingsError, match="at least 16 characters"):
        load_settings(environ={**env, "API_SERVER_KEY": "short"})
    with pytest.raises(SettingsError, match="at least 16"):
        load_settings(environ=env)
    with pytest.raises(SettingsError, match="disabled"):
        load_settings(environ={**env, "API_SERVER_KEY": KEY, "API_SERVER_ENABLED": "false"})
    with pytest.raises(SettingsError, match="explicit origin"):
        load_settings(environ={**env, "API_SERVER_KEY": KEY, "API_SERVER_CORS_ORIGINS": "*"})
    for name, value in {**env, "API_SERVER_KEY": "too-short"}.items():
        monkeypatch.setenv(name, value)
    assert serve_main(["--port", "0"]) == 2
    assert "refusing to start" in capsys.readouterr().err


def test_env_file_values_under_the_process_environment(tmp_path: Path, sim_server: Any) -> None:
    env_file = tmp_path / "hermes.env"
    env_file.write_text(f"API_SERVER_KEY='{KEY}$notexpanded'\nAPI_SERVER_PORT=9999\nAPI_SERVER_TOOLSETS=terminal, file\n"
                        f"API_SERVER_CORS_ORIGINS={ALLOWED}/\nHERMES_BASE_URL={sim_server.base_url}\n")
    loaded = load_settings(env_file, {"API_SERVER_PORT": "8700"})
    assert (loaded.key, loaded.port, loaded.toolsets) == (KEY + "$notexpanded", 8700, ("terminal", "file"))
    assert loaded.cors_origins == (ALLOWED,) and loaded.endpoint.base_url == sim_server.base_url
    assert load_settings(env_file, {}, port=0, model="m").endpoint.model == "m"  # flags win
    with pytest.raises(SettingsError, match="unknown toolset"):
        load_settings(env_file, {"API_SERVER_TOOLSETS": "nope"})
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(tmp_path / "absent.env", {})
    with pytest.raises(SettingsError, match="/dev/null is not a regular file"):
        load_settings("/dev/null", {})


def test_cors_only_for_listed_origins(server: ApiServer) -> None:
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    denied = httpx.get(server.base_url + "/models", headers={**AUTH, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in denied.headers
    refused = httpx.options(server.base_url + "/chat/completions", headers={**preflight, "Origin": "https://evil.example"})
    assert refused.status_code in (400, 403) and "access-control-allow-origin" not in refused.headers
    granted = httpx.options(server.base_url + "/chat/completions", headers={**preflight, "Origin": ALLOWED})
    assert granted.status_code == 200 and granted.headers["access-control-allow-origin"] == ALLOWED
    assert "authorization" in granted.headers["access-control-allow-headers"].lower()
    allowed = httpx.get(server.base_url + "/models", headers={**AUTH, "Origin": ALLOWED})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ALLOWED


def test_oversized_body_is_413(server: ApiServer) -> None:
    big = json.dumps({"model": "hermes-agent", "messages": user("x" * 200_000)}).encode()
    response = httpx.post(server.base_url + "/chat/completions", content=big,
                          headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"

    def chunked() -> Any:  # no Content-Length: the streamed bytes are counted
        for _ in range(20):
            yield b"x" * 16_384

    response = httpx.post(server.base_url + "/chat/completions", content=chunked(), headers=AUTH)
    assert response.status_code == 413


def test_run_cap_answers_429_with_retry_after(start_server: Any) -> None:
    srv = start_server(max_concurrent_runs=1)
    body = {"model": "hermes-agent", "messages": user("Hello [sim:latency=1] [sim:no-tools]")}

    def post() -> httpx.Response:
        return httpx.post(srv.base_url + "/chat/completions", json=body, headers=AUTH, timeout=30)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(post)
        assert wait_until(lambda: srv.active_runs == 1)
        second = post()
        assert second.status_code == 429 and float(second.headers["Retry-After"]) > 0
        assert second.json()["error"]["type"] == "rate_limit_error"
        assert first.result().status_code == 200
    assert post().status_code == 200  # the slot is free again


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_cancels_the_run_and_its_sandbox(server: ApiServer, sandbox_root: Path, stream: bool) -> None:
    marker = f"sleep {random.randint(100_000, 999_999)}"
    body = {"model": "hermes-agent", "stream": stream, "messages": user(f"Run it [sim:command={marker}]")}
    if stream:
        with httpx.stream("POST", server.base_url + "/chat/completions", json=body, headers=AUTH, timeout=30) as resp:
            lines = resp.iter_lines()  # held: a dropped line iterator would close the connection at once
            assert any(line == "event: hermes.tool.progress" for line in lines)
            assert wait_until(lambda: command_running(marker), 15), "the tool never started"
    else:  # no response before the run ends: hang up on a raw connection while the tool runs
        payload = json.dumps(body).encode()
        with socket.create_connection(("127.0.0.1", server.port)) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                         + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
            assert wait_until(lambda: command_running(marker), 15), "the tool never started"
    # The client hung up mid-run: the run is cancelled and its sandbox closed, killing the command.
    assert wait_until(lambda: not processes_with(marker), 5), processes_with(marker)
    assert wait_until(lambda: server.active_runs == 0, 5)
    # Session state removed too (the backend's shared copy of /etc stays while the server runs).
    assert wait_until(lambda: not [p for p in sandbox_root.iterdir() if not p.name.startswith(ETC_COPY_PREFIX)], 5)


def test_stopping_the_server_ends_runs_cleanly(start_server: Any, sandbox_root: Path) -> None:
    srv = start_server()
    marker = f"sleep {random.randint(100_000, 999_999)}"

    def post(stream: bool) -> httpx.Response:
        body = {"model": "hermes-agent", "stream": stream, "messages": user(f"Run it [sim:command={marker}]")}
        return httpx.post(srv.base_url + "/chat/completions", json=body, headers=AUTH, timeout=30)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        streamed, plain = pool.submit(post, True), pool.submit(post, False)
        assert wait_until(lambda: [p.startswith(marker) for p in processes_with(marker)].count(True) == 2, 15)
        started = time.monotonic()
        srv.stop()
        assert time.monotonic() - started < 2  # runs are cancelled first: no wait for the graceful timeout
        assert plain.result().status_code == 503 and plain.result().json()["error"]["code"] == "shutting_down"
        lines = [line for line in streamed.result().text.split("\n") if line.startswith("data: ")]
        assert "shutting_down" in lines[-2] and lines[-1] == "data: [DONE]"
    assert not processes_with(marker)


def test_agent_failure_is_an_openai_error(client: openai.OpenAI, server: ApiServer) -> None:
    with pytest.raises(openai.APIStatusError) as failure:
        client.chat.completions.create(model="hermes-agent", messages=user("Hi [sim:always-fail]"))
    assert failure.value.status_code == 502
    error = failure.value.response.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "agent_run_failed" and "500" in error["message"]
    events, _ = raw_stream(server, "Hi [sim:always-fail]")
    assert "agent_run_failed" == events[-2][1]["error"]["code"] and events[-1] == (None, "[DONE]")
    with pytest.raises(openai.APIError, match="agent run failed"):
        for _ in client.chat.completions.create(model="hermes-agent", messages=user("Hi [sim:always-fail]"),
                                                stream=True):
            pass


def test_serve_main_in_a_process(tmp_path: Path, sim_server: Any, sandbox_root: Path) -> None:
    env = {**os.environ, "API_SERVER_KEY": KEY, "HERMES_BASE_URL": sim_server.base_url, "API_SERVER_PORT": "0",
           "HERMES_ENV_FILE": str(tmp_path / "none.env"), "PYTHONUNBUFFERED": "1"}
    code = "import sys; from hermes_core.api_server import serve_main; sys.exit(serve_main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "--toolsets", "terminal"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline()
        assert "Hermes API server on http://127.0.0.1:" in banner, proc.stderr.read() if proc.poll() else banner
        base_url = banner.split(" on ", 1)[1].split()[0]
        reply = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0).chat.completions.create(
            model="hermes-agent", messages=user(TOOL_PROMPT))
        assert "served-by-hermes" in reply.choices[0].message.content
    finally:
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it captured: exit status -SIGTERM.
        assert proc.wait(15) in (0, -signal.SIGTERM)
        assert "Finished server process" in proc.stderr.read()


def test_constrained_tool_call_mode_runs_tools_for_models_without_tool_calling(start_server: Any) -> None:
    server = start_server(tool_call_mode="constrained")
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=60)
    answer = client.chat.completions.create(model="hermes-agent", messages=user(TOOL_PROMPT)).choices[0].message.content
    assert "served-by-hermes" in answer and not answer.startswith("{")  # the tool ran; the JSON reply was unwrapped
    with pytest.raises(SettingsError, match="API_SERVER_TOOL_CALL_MODE"):
        load_settings(None, {"API_SERVER_KEY": KEY, "HERMES_BASE_URL": "http://127.0.0.1:9/v1",
                             "API_SERVER_TOOL_CALL_MODE": "json"})


@pytest.mark.parametrize("backend", ["local", "plain"])
def test_a_tool_building_a_deep_folder_is_answered_and_leaves_nothing(start_server: Any, tmp_path: Path,
                                                                      monkeypatch: Any, no_deep_tree_left: None,
                                                                      backend: str) -> None:
    """Issue 28: closing the request's sandbox crashed on a 1,200-deep folder (RecursionError): the
    request was answered 500 and the folder stayed in the state root."""
    boxes = tmp_path / "boxes"
    monkeypatch.setenv("HERMES_SANDBOX_STATE_ROOT", str(boxes))
    body = {"model": "hermes-agent", "messages": user(f"Build it [sim:command={BUILD_COMMAND}]")}
    response = httpx.post(start_server(sandbox_backend=backend).base_url + "/chat/completions", json=body,
                          headers=AUTH, timeout=60)
    assert response.status_code == 200 and "built" in response.json()["choices"][0]["message"]["content"]
    assert [p for p in boxes.iterdir() if not p.name.startswith(ETC_COPY_PREFIX)] == []  # (the backend's /etc)

# --- every history message checked against the chat-completions schema (issue 17, item 7) -------------
