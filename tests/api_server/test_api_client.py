"""Issue 19, item 7: the API server's Hermes surface. `hermes-agent-api-client==0.3.3` (a typed client
written by others for the original Hermes Agent's server, in its own Python 3.13 venv) drives a real
`hermes-foundry serve`; sessions, status headers, eviction and expiry are checked over plain HTTP; a
chat frontend's housekeeping request is answered without tools."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_core.api_server import ApiServer, SettingsError, load_settings
from hermes_core.sandbox.bubblewrap import session_leftovers
from procs import processes_with, sandbox_sessions, wait_until
from api_servers import AUTH, KEY, sandbox_root, server, start_server, user  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("api_client_driver.py")
SECRET = "kept-secret-4711"
WRITE = f"Please run this [sim:each-turn] [sim:command=echo {SECRET} > kept.txt]"
READ = "Please run this [sim:command=cat kept.txt]"
FRESH_READ = "Please run this [sim:each-turn] [sim:command=cat kept.txt]"  # READ as a conversation's first turn


@pytest.fixture(scope="module")
def client_python() -> str:
    """The Python of the client's venv (built once, cached like the oracle's)."""
    built = subprocess.run(["bash", str(ROOT / "scripts" / "api_client_venv.sh")], capture_output=True, text=True,
                           timeout=600)
    if built.returncode != 0:
        if "no Python 3.13" in built.stderr:
            pytest.skip(built.stderr.strip())
        pytest.fail(built.stderr.strip())
    return built.stdout.strip().splitlines()[-1]


@pytest.fixture()
def served(tmp_path: Path, sim_server: Any) -> Any:
    """A real `hermes-foundry serve` process on a free 127.0.0.1 port, with its own sandbox state root."""
    state = tmp_path / "sandboxes"
    env = {**os.environ, "API_SERVER_KEY": KEY, "HERMES_BASE_URL": sim_server.base_url, "API_SERVER_PORT": "0",
           "HERMES_ENV_FILE": str(tmp_path / "none.env"), "HERMES_SANDBOX_STATE_ROOT": str(state),
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([str(Path(sys.executable).with_name("hermes-foundry")), "serve", "--host", "127.0.0.1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline()
        assert "Hermes API server on http://127.0.0.1:" in banner, proc.stderr.read() if proc.poll() else banner
        yield banner.split(" on ", 1)[1].split()[0].removesuffix("/v1"), proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) in (0, -signal.SIGTERM)
    assert session_leftovers(state) == [], "sandboxes left after shutdown"


def drive(python: str, base_url: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    done = subprocess.run([python, str(DRIVER), base_url], input=json.dumps({"turns": turns}), capture_output=True,
                          text=True, timeout=180, env={**os.environ, "HERMES_TEST_API_KEY": KEY})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "delta")


def post(base_url: str, text: str, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    return httpx.post(f"{base_url}/chat/completions", json={"model": "hermes-agent", "messages": user(text), **body},
                      headers={**AUTH, **(headers or {})}, timeout=60)


def session(session_id: str, key: str | None = None) -> dict[str, str]:
    return {"X-Hermes-Session-Id": session_id, **({"X-Hermes-Session-Key": key} if key else {})}


def test_the_typed_client_probes_and_streams_a_session(client_python: str, served: Any) -> None:
    base_url, server_pid = served
    report = drive(client_python, base_url, [
        {"prompt": WRITE, "session_id": "chat-one"},
        {"prompt": READ, "session_id": "chat-one"},
        {"prompt": FRESH_READ, "session_id": "chat-two"},  # another session
    ])
    assert report["capabilities"] == {
        "object": "hermes.api_server.capabilities", "platform": "hermes-agent", "model": "hermes-agent",
        "auth_type": "bearer", "auth_required": True, "chat_completions": True, "chat_completions_streaming": True}
    first, second, other = report["turns"]
    for events in (first, second):
        assert [e["status"] for e in events if e["type"] == "tool"] == ["running", "completed"]
        assert {e["tool"] for e in events if e["type"] == "tool"} == {"terminal"}
        assert events[-1] == {"type": "terminal", "outcome": "success", "partial": False}
        assert any(e["type"] == "usage" and e["total_tokens"] > 0 for e in events)
        assert "🔧" not in text_of(events)  # a Hermes-aware client (session header) gets named events only
    assert SECRET not in text_of(first)  # the first turn only wrote the file...
    assert SECRET in text_of(second)  # ...the second turn read it from the same sandbox
    assert "No such file" in text_of(other) and SECRET not in text_of(other)  # another session, another sandbox
    assert len(sandbox_sessions(server_pid)) == 2  # both sessions keep theirs until they expire or the server stops


def test_capabilities_and_toolsets_documents(server: ApiServer) -> None:
    caps = httpx.get(f"{server.base_url}/capabilities", headers=AUTH).json()
    original_keys = {"object", "platform", "model", "auth", "runtime", "features", "endpoints"}
    assert set(caps) == original_keys and caps["auth"] == {"type": "bearer", "required": True}
    features = caps["features"]
    assert {name for name, on in features.items() if on is True} == {
        "chat_completions", "chat_completions_streaming", "tool_progress_events", "cors"}
    assert features["responses_api"] is False and features["session_continuity_header"] == "X-Hermes-Session-Id"
    for endpoint in caps["endpoints"].values():  # every endpoint listed is served
        if endpoint["method"] == "GET":
            assert httpx.get(server.url(endpoint["path"]), headers=AUTH).status_code == 200
    sets = httpx.get(f"{server.base_url}/toolsets", headers=AUTH).json()
    assert sets["object"] == "list" and sets["platform"] == "api_server"
    by_name = {entry["name"]: entry for entry in sets["data"]}
    assert by_name["terminal"]["tools"] == ["process", "terminal"] and by_name["terminal"]["enabled"] is True
    assert set(by_name["file"]) == {"name", "label", "description", "enabled", "configured", "tools"}
    for path in ("/capabilities", "/toolsets"):
        assert httpx.get(server.base_url + path).status_code == 401


def test_session_history_headers_and_key(start_server: Any, sim_server: Any) -> None:
    srv = start_server()
    first = post(srv.base_url, "My name is Ada [sim:no-tools]", session("s-1", "secret-key"))
    assert first.status_code == 200 and first.headers["x-hermes-session-id"] == "s-1"
    assert "x-hermes-session-key" not in first.headers and "x-hermes-completed" not in first.headers  # a secret
    # A known session's history is the server's: the second request's body holds only the new message.
    post(srv.base_url, "Summarize what I told you, session s-1", session("s-1", "secret-key"))
    sent = sim_server.log.bodies_mentioning("Summarize what I told you, session s-1")[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"] and "Ada" in sent[0]["content"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # one turn at a time per session
        slow = pool.submit(post, srv.base_url, "Hello [sim:latency=1] [sim:no-tools]", session("s-2"))
        assert wait_until(lambda: srv.active_runs == 1)
        busy = post(srv.base_url, "hi", session("s-2"))
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "session_busy"
        assert slow.result().status_code == 200
    for headers in (session("s-1", "wrong-key"), session("s-1")):  # a wrong or missing key is refused
        refused = post(srv.base_url, "hi", headers)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "session_key_mismatch"
    for bad in ("../etc", "a" * 257):
        refused = post(srv.base_url, "hi", session(bad))
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "X-Hermes-Session-Id"


def test_completion_status_headers(start_server: Any, client_python: str) -> None:
    srv = start_server(max_iterations=1)
    limited = post(srv.base_url, "run ls [sim:loop]")
    assert limited.status_code == 200 and limited.json()["choices"][0]["finish_reason"] == "length"
    assert (limited.headers["x-hermes-completed"], limited.headers["x-hermes-partial"]) == ("false", "false")
    assert limited.json()["hermes"]["error_code"] == "output_truncated"
    failed = post(srv.base_url, "Hi [sim:always-fail]")
    assert failed.status_code == 502 and failed.headers["x-hermes-completed"] == "false"
    assert "500" in failed.headers["x-hermes-error"] and failed.json()["error"]["hermes"]["failed"] is True
    streamed = post(srv.base_url, "Hi [sim:always-fail]", stream=True)  # status in the last chunk, not in headers
    last = json.loads([line for line in streamed.text.split("\n") if line.startswith("data: {")][-1][6:])
    assert last["choices"][0]["finish_reason"] == "error" and last["hermes"]["failed"] is True
    typed = drive(client_python, srv.url(""), [{"prompt": "Hi [sim:always-fail]"}])["turns"][0]
    assert typed[-1] == {"type": "terminal", "outcome": "upstream_error", "partial": False}  # not a broken stream


def test_sessions_are_evicted_and_expire_closing_their_sandboxes(start_server: Any, sandbox_root: Path) -> None:
    srv = start_server(max_sessions=1, session_idle_s=1.5)
    sessions = srv.app.state.sessions
    assert post(srv.base_url, WRITE, session("old")).status_code == 200
    old = set(sandbox_sessions(os.getpid()))
    assert len(old) == 1
    assert post(srv.base_url, WRITE, session("new")).status_code == 200  # room for one: "old" is evicted
    assert list(sessions.sessions) == ["new"] and sessions.closed == 1
    assert wait_until(lambda: not old & set(sandbox_sessions(os.getpid())), 10)
    assert wait_until(lambda: len(sessions) == 0 and not sandbox_sessions(os.getpid()), 10)  # idle: expired
    assert sessions.closed == 2
    # Once an id's tombstone has expired too (another idle TTL), the id is free for a new session.
    assert wait_until(lambda: not sessions.tombstones, 10)  # the sweeper forgets them
    fresh = post(srv.base_url, FRESH_READ, session("old"))
    assert fresh.status_code == 200 and SECRET not in fresh.json()["choices"][0]["message"]["content"]


def test_housekeeping_requests_run_without_tools_or_run_slots(start_server: Any, sim_server: Any) -> None:
    srv = start_server(max_concurrent_runs=1)
    marker = f"sleep {int(time.time() * 1000) % 1_000_000 + 1_000_000}"
    task = (f"### Task:\nGenerate a concise title summarizing the chat history.\n### Chat History:\n<chat_history>\n"
            f"USER: Please run this [sim:command={marker}]\n</chat_history>")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        chat = pool.submit(post, srv.base_url, "Hello [sim:latency=1] [sim:no-tools]")
        assert wait_until(lambda: srv.active_runs == 1)  # the only run slot is taken by the chat
        title = post(srv.base_url, task)
        assert chat.result().status_code == 200
    assert title.status_code == 200 and "simulated response" in title.json()["choices"][0]["message"]["content"]
    assert len(sim_server.log.bodies_mentioning(marker)) == 1  # one model call, no tool round
    assert not processes_with(marker)
    rag = "### Task:\nRespond to the user query using the provided context.\n<context>doc</context>\n" + marker
    assert "Done. I used" in post(srv.base_url, rag + " [sim:command=echo rag-ran]").json()["choices"][0][
        "message"]["content"]  # Open WebUI's RAG template wraps a real question: the agent answers it


def test_session_and_progress_settings(tmp_path: Path) -> None:
    env = {"API_SERVER_KEY": KEY, "HERMES_BASE_URL": "http://127.0.0.1:9/v1", "HERMES_ENV_FILE": str(tmp_path / "no")}
    defaults = load_settings(None, env)
    assert (defaults.inline_progress, defaults.max_sessions, defaults.session_idle_s) == ("auto", 32, 1800.0)
    assert defaults.max_session_history_bytes == 4 * 1024 * 1024
    tuned = load_settings(None, {**env, "API_SERVER_INLINE_PROGRESS": "false", "API_SERVER_MAX_SESSIONS": "2",
                                 "API_SERVER_SESSION_IDLE_SECONDS": "0.5", "API_SERVER_MAX_SESSION_HISTORY_BYTES": "9"})
    assert (tuned.inline_progress, tuned.max_sessions, tuned.session_idle_s) == (False, 2, 0.5)
    assert tuned.max_session_history_bytes == 9
    for name, value, says in (("API_SERVER_INLINE_PROGRESS", "sometimes", "expected auto, true or false"),
                              ("API_SERVER_MAX_SESSIONS", "0", "max_sessions must be at least 1"),
                              ("API_SERVER_SESSION_IDLE_SECONDS", "-1", "session_idle_s must be positive"),
                              ("API_SERVER_MAX_SESSION_HISTORY_BYTES", "0", "max_session_history_bytes must be at least 1")):
        with pytest.raises(SettingsError, match=says):
            load_settings(None, {**env, name: value})
