"""The `terminal` and `process` tools against real bubblewrap sandboxes: workdir, background
processes keyed by session_id, and every `process` action on real sandboxed programs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from hermes_core.sandbox import SandboxSettings
from hermes_core.sandbox.bubblewrap import BubblewrapBackend
from hermes_core.sandbox.local import PlainBackend
from hermes_core.tools import ToolContext, registry, result_failed


@pytest.fixture
def ctx(tmp_path: Path):
    with BubblewrapBackend(SandboxSettings(state_root=tmp_path / "sandboxes")).open("terminal", cwd="/app") as box:
        yield ToolContext(sandbox=box, task_id="task-1")


def call(ctx: ToolContext, name: str, **arguments: Any) -> Any:
    return json.loads(registry.call(name, arguments, ctx))


def eventually(check: Callable[[], Any], within: float = 10.0) -> Any:
    deadline = time.monotonic() + within
    while not (result := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return result


def test_workdir_runs_the_command_there(ctx: ToolContext) -> None:
    assert call(ctx, "terminal", command="mkdir -p sub/deeper")["exit_code"] == 0
    assert call(ctx, "terminal", command="pwd", workdir="sub/deeper")["output"] == "/app/sub/deeper\n"
    assert call(ctx, "terminal", command="pwd", workdir="/tmp")["output"] == "/tmp\n"
    assert call(ctx, "terminal", command="pwd")["output"] == "/app\n"  # the next call is back in the cwd
    missing = call(ctx, "terminal", command="pwd", workdir="/nowhere; echo injected")
    assert missing["exit_code"] != 0 and "injected" not in missing["output"].replace("echo injected", "")
    started = call(ctx, "terminal", command="pwd", workdir="sub", background=True)
    assert call(ctx, "process", action="wait", session_id=started["session_id"])["output"] == "/app/sub\n"
    assert call(ctx, "process", action="list")["processes"][0]["cwd"] == "/app/sub"


def test_background_returns_a_session_id_and_list_shows_it(ctx: ToolContext) -> None:
    started = call(ctx, "terminal", command="echo serving; sleep 100", background=True)
    assert started["session_id"] == "proc_1" and started["exit_code"] == 0 and started["error"] is None
    assert eventually(lambda: "serving" in call(ctx, "process", action="poll", session_id="proc_1")["output_preview"])
    polled = call(ctx, "process", action="poll", session_id="proc_1")
    assert polled["status"] == "running" and "exit_code" not in polled
    assert polled["command"] == "echo serving; sleep 100"
    call(ctx, "terminal", command="exit 3", background=True)
    assert call(ctx, "process", action="wait", session_id="proc_2")["exit_code"] == 3
    listed = call(ctx, "process", action="list")["processes"]
    assert [(p["session_id"], p["status"], p.get("exit_code")) for p in listed] == [
        ("proc_1", "running", None), ("proc_2", "exited", 3)]
    assert listed[0]["cwd"] == "/app" and listed[0]["output_preview"] == "serving\n"
    assert listed[0]["uptime_seconds"] >= 0 and listed[0]["started_at"].startswith("20")


def test_write_then_submit_feeds_a_program_waiting_on_stdin(ctx: ToolContext) -> None:
    sid = call(ctx, "terminal", command="read x; echo got $x; read y; echo then $y", background=True)["session_id"]
    assert call(ctx, "process", action="write", session_id=sid, data="hel") == {"status": "ok", "bytes_written": 3}
    assert call(ctx, "process", action="submit", session_id=sid, data="lo") == {"status": "ok", "bytes_written": 3}
    assert eventually(lambda: "got hello" in call(ctx, "process", action="poll", session_id=sid)["output_preview"])
    assert call(ctx, "process", action="poll", session_id=sid)["status"] == "running"  # waits for its 2nd line
    call(ctx, "process", action="submit", session_id=sid, data="bye")
    assert call(ctx, "process", action="wait", session_id=sid, timeout=10)["exit_code"] == 0
    log = call(ctx, "process", action="log", session_id=sid)
    assert log["output"] == "got hello\nthen bye" and log["total_lines"] == 2 and log["status"] == "exited"
    late = call(ctx, "process", action="submit", session_id=sid, data="more")
    assert late["status"] == "already_exited" and result_failed(json.dumps(late))


def test_close_sends_end_of_file(ctx: ToolContext) -> None:
    sid = call(ctx, "terminal", command="wc -l", background=True)["session_id"]
    call(ctx, "process", action="submit", session_id=sid, data="one")
    call(ctx, "process", action="submit", session_id=sid, data="two")
    assert call(ctx, "process", action="poll", session_id=sid)["status"] == "running"
    assert call(ctx, "process", action="close", session_id=sid) == {"status": "ok", "message": "stdin closed"}
    done = call(ctx, "process", action="wait", session_id=sid, timeout=10)
    assert done["status"] == "exited" and done["output"].strip() == "2"


def test_pty_gives_the_program_a_terminal(ctx: ToolContext) -> None:
    plain = call(ctx, "terminal", command="test -t 0 && echo tty || echo notty", background=True)["session_id"]
    assert call(ctx, "process", action="wait", session_id=plain)["output"] == "notty\n"
    sid = call(ctx, "terminal", command="test -t 1 && echo tty; read x; echo got $x", background=True, pty=True)
    assert "pty_note" not in sid
    sid = sid["session_id"]
    assert eventually(lambda: "tty" in call(ctx, "process", action="poll", session_id=sid)["output_preview"])
    call(ctx, "process", action="submit", session_id=sid, data="typed")
    assert "got typed" in call(ctx, "process", action="wait", session_id=sid, timeout=10)["output"]


def test_wait_returns_at_its_timeout_or_with_the_exit_code(ctx: ToolContext) -> None:
    sid = call(ctx, "terminal", command="echo begun; sleep 100", background=True)["session_id"]
    began = time.monotonic()
    waited = call(ctx, "process", action="wait", session_id=sid, timeout=1)
    assert 0.9 <= time.monotonic() - began < 5
    assert waited["status"] == "timeout" and "still running" in waited["timeout_note"]
    assert call(ctx, "process", action="poll", session_id=sid)["status"] == "running"
    ending = call(ctx, "terminal", command="sleep 1; echo finished; exit 7", background=True)["session_id"]
    done = call(ctx, "process", action="wait", session_id=ending, timeout=30)
    assert done == {"status": "exited", "command": "sleep 1; echo finished; exit 7", "exit_code": 7,
                    "output": "finished\n"}


def test_kill_stops_the_process(ctx: ToolContext) -> None:
    sid = call(ctx, "terminal", command="echo up; sleep 100", background=True)["session_id"]
    assert eventually(lambda: "up" in call(ctx, "process", action="poll", session_id=sid)["output_preview"])
    killed = call(ctx, "process", action="kill", session_id=sid)
    assert killed["status"] == "killed" and killed["session_id"] == sid and "up" in killed["output"]
    polled = call(ctx, "process", action="poll", session_id=sid)
    assert polled["status"] == "exited" and polled["exit_code"] != 0
    assert call(ctx, "process", action="kill", session_id=sid)["status"] == "already_exited"


def test_log_pages_by_lines(ctx: ToolContext) -> None:
    sid = call(ctx, "terminal", command="seq 1 500", background=True)["session_id"]
    call(ctx, "process", action="wait", session_id=sid)
    last = call(ctx, "process", action="log", session_id=sid)
    assert last["total_lines"] == 500 and last["showing"] == "200 lines" and last["output"].startswith("301\n")
    page = call(ctx, "process", action="log", session_id=sid, offset=10, limit=3)
    assert page["output"] == "11\n12\n13" and page["showing"] == "3 lines"


def test_unknown_session_ids_and_missing_arguments_are_clear_errors(ctx: ToolContext) -> None:
    call(ctx, "terminal", command="sleep 100", background=True)
    for action in ("poll", "log", "wait", "kill", "write", "submit", "close"):
        text = registry.call("process", {"action": action, "session_id": "proc_42"}, ctx)
        assert result_failed(text)
        assert json.loads(text) == {"status": "not_found", "error": "No process with ID proc_42 (known: proc_1)"}
        missing = registry.call("process", {"action": action}, ctx)
        assert json.loads(missing) == {"error": f"session_id is required for {action}"}
    assert "at least 1" in call(ctx, "process", action="wait", session_id="proc_1", timeout=0)["error"]


def test_notification_flags_are_recorded_and_reported(ctx: ToolContext) -> None:
    both = call(ctx, "terminal", command="echo ready; sleep 100", background=True, notify_on_complete=True,
                watch_patterns=["ready"])
    assert both["notify_on_complete"] is True and "watch_patterns_ignored" in both and "poll" in both["note"]
    watched = call(ctx, "terminal", command="echo ready; sleep 100", background=True, watch_patterns=["ready", "x"])
    assert watched["watch_patterns"] == ["ready", "x"]
    assert eventually(lambda: call(ctx, "process", action="list")["processes"][1].get("watch_hit"))
    first, second = call(ctx, "process", action="list")["processes"]
    assert first["notify_on_complete"] is True and "watch_patterns" not in first
    assert second["watch_patterns"] == ["ready", "x"] and "notify_on_complete" not in second
    assert "note" not in call(ctx, "terminal", command="true", background=True)


def test_the_plain_backend_takes_input_and_gives_terminals_too(tmp_path: Path) -> None:
    with PlainBackend(SandboxSettings(state_root=tmp_path / "plain")).open("plain", cwd="/app") as box:
        ctx = ToolContext(sandbox=box, task_id="task-1")
        sid = call(ctx, "terminal", command="read x; echo got $x; cat", background=True)["session_id"]
        call(ctx, "process", action="submit", session_id=sid, data="one")
        call(ctx, "process", action="write", session_id=sid, data="rest")
        call(ctx, "process", action="close", session_id=sid)
        assert call(ctx, "process", action="wait", session_id=sid, timeout=10)["output"] == "got one\nrest"
        tty = call(ctx, "terminal", command="test -t 0 && echo tty", background=True, pty=True)["session_id"]
        assert call(ctx, "process", action="wait", session_id=tty, timeout=10)["output"].strip() == "tty"
