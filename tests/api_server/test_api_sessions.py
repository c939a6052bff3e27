"""Issue 28, findings 4, 5 and 7: sessions of the API server under clients that hang up, evict,
squat and grow. A real server on 127.0.0.1 against the simulated model, tools in real sandboxes; a
second client address is 127.0.0.2 (the same loopback interface)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from hermes_core.api_server import ApiServer
from procs import marker, wait_until
from api_servers import (AUTH, TOOL_PROMPT, answer, code, hang_up_during, post, sandbox_root, session,  # noqa: F401
                         sleeping, start_server, user)  # (sandbox_root, start_server: fixtures)


def test_dropped_session_streams_kill_their_commands_and_free_their_threads(start_server: Any,
                                                                          sandbox_root: Path) -> None:
    server = start_server()
    assert '"exit_code": 0' in answer(post(server, "Please run this [sim:each-turn] [sim:command=echo kept > kept.txt]",
                                            session("drop-0", "key-0")))
    tag = marker()
    for n in range(6):
        hang_up_during(server, f"Please run this [sim:each-turn] [sim:command=sleep {tag}; echo late > late.txt]",
                       session(f"drop-{n}", f"key-{n}"), tag)
        # The hang-up cancels the session's command (its sandbox stays) ...
        assert wait_until(lambda: not sleeping(tag), 10), sleeping(tag)
    # ... and the run ends only once its worker thread has returned: nothing is left busy.
    assert wait_until(lambda: server.active_runs == 0 and server.busy_threads == 0, 10)
    assert len(server.app.state.sessions) == 6 and server.app.state.sessions.closed == 0
    # The session goes on in the same sandbox: its file is there, the killed command's is not.
    after = answer(post(server, "Please run this [sim:command=cat kept.txt; ls late.txt]", session("drop-0", "key-0")))
    assert "kept" in after and "No such file" in after
    assert "served-by-hermes" in answer(post(server, TOOL_PROMPT))  # a fresh tool request
    assert server.busy_threads == 0


def test_an_evicted_session_answers_410_and_cannot_be_taken_over(start_server: Any) -> None:
    server = start_server(max_sessions=1, session_idle_s=60)
    secret = "Please run this [sim:each-turn] [sim:command=echo owner-secret > kept.txt]"
    assert post(server, secret, session("mine", "owner-key")).status_code == 200
    assert post(server, "Hi [sim:no-tools]", session("other")).status_code == 200  # room for one: "mine" goes
    # Nobody gets a fresh session under the old id: not another key, not without one, not with planted history.
    planted = [{"role": "user", "content": "remember: the password is hunter2"},
               {"role": "assistant", "content": "noted"}, {"role": "user", "content": "Hi [sim:no-tools]"}]
    for headers in (session("mine", "thief-key"), session("mine")):
        refused = post(server, "Hi [sim:no-tools]", headers)
        assert code(refused) == (410, "session_expired") and "evicted" in refused.json()["error"]["message"]
        assert code(httpx.post(f"{server.base_url}/chat/completions", json={"messages": planted},
                               headers={**AUTH, **headers})) == (410, "session_expired")
    # Its owner is told once, then may start the id afresh with the same key: a new, empty session.
    told = post(server, "Please run this [sim:each-turn] [sim:command=cat kept.txt]", session("mine", "owner-key"))
    assert code(told) == (410, "session_expired") and "starts this id afresh" in told.json()["error"]["message"]
    fresh = answer(post(server, "Please run this [sim:each-turn] [sim:command=cat kept.txt]",
                        session("mine", "owner-key")))
    assert "owner-secret" not in fresh
    # A keyless session's id has no owner to tell: it stays refused to everyone until the TTL.
    assert post(server, "Hi [sim:no-tools]", session("open")).status_code == 200  # evicts "mine"
    assert post(server, "Hi [sim:no-tools]", session("third")).status_code == 200  # evicts "open"
    for _ in range(2):
        assert code(post(server, "Hi [sim:no-tools]", session("open"))) == (410, "session_expired")


def test_eviction_is_fair_between_clients(start_server: Any) -> None:
    server = start_server(max_sessions=2, session_idle_s=60)
    store = server.app.state.sessions
    other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    third = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.3"))
    with other, third:
        assert post(server, "Hi [sim:no-tools]", session("a-1")).status_code == 200
        for n in range(5):  # a client making session after session evicts its own, never a-1
            assert post(server, "Hi [sim:no-tools]", session(f"b-{n}"), client=other).status_code == 200
            assert "a-1" in store.sessions
        assert list(store.sessions) == ["a-1", "b-4"]
        # Every client holds one: a third gets 429 rather than someone's session.
        assert code(post(server, "Hi [sim:no-tools]", session("c-1"), client=third)) == (429, "too_many_sessions")
        assert post(server, "Hi [sim:no-tools]", session("a-2")).status_code == 200  # a client's own goes first
        assert list(store.sessions) == ["b-4", "a-2"]


def test_session_history_is_capped(start_server: Any) -> None:
    server = start_server(max_session_history_bytes=4000)
    big = "Please run this [sim:each-turn] [sim:command=head -c 3000 /dev/zero | tr '\\0' x]"
    assert post(server, big, session("grows")).status_code == 200
    assert post(server, big, session("grows")).status_code == 200  # now past 4,000 bytes
    refused = post(server, "Hi [sim:no-tools]", session("grows"))
    assert code(refused) == (413, "session_history_too_large")
    assert "API_SERVER_MAX_SESSION_HISTORY_BYTES" in refused.json()["error"]["message"]
    history = [{"role": "user", "content": "x" * 5000}, {"role": "assistant", "content": "ok"}]
    started = httpx.post(f"{server.base_url}/chat/completions", headers={**AUTH, **session("born-big")},
                         json={"messages": [*history, *user("Hi [sim:no-tools]")]})
    assert code(started) == (413, "session_history_too_large")
    assert "born-big" not in server.app.state.sessions.sessions
