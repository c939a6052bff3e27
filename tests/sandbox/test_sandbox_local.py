"""The explicit, unisolated `plain` backend with real processes and files (the bubblewrap `local`
backend has its own file: test_sandbox_bubblewrap.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hermes_core.sandbox import DEFAULT_COMMAND_TIMEOUT_S, SandboxError, SandboxSettings, get_backend, known_backends
from hermes_core.sandbox import jobs
from hermes_core.sandbox.bubblewrap import BubblewrapBackend
from hermes_core.sandbox.local import PlainBackend, PlainSandbox
from hermes_core.sandbox.output import truncate_output
from procs import live_members, marker, processes_with, wait_until

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="process checks read /proc")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def backend(tmp_path: Path) -> PlainBackend:
    return PlainBackend(SandboxSettings(state_root=tmp_path / "sandboxes"))


@pytest.fixture
def sandbox(backend: PlainBackend):
    with backend.open("session-1") as box:
        yield box


def test_plain_is_explicitly_unisolated(backend: PlainBackend) -> None:
    assert backend.name == "plain" and backend.isolated is False
    assert BubblewrapBackend(SandboxSettings()).isolated is True


def test_exec_merges_output_and_reports_exit_code(sandbox: PlainSandbox) -> None:
    result = sandbox.exec("echo out; echo err >&2; exit 3")
    assert result.output == "out\nerr\n" and result.exit_code == 3
    assert not result.timed_out and not result.truncated
    assert sandbox.exec("kill -TERM $$").exit_code == 128 + 15  # killed by a signal: shell convention


def test_workdir_is_private_and_home(sandbox: PlainSandbox, backend: PlainBackend) -> None:
    assert sandbox.workdir.parent == backend.state_root.resolve() and sandbox.workdir.name.startswith("session-1-")
    assert sandbox.exec("pwd").output.strip() == str(sandbox.workdir)
    assert sandbox.exec("echo $HOME").output.strip() == str(sandbox.workdir)


def test_stdin_is_closed(sandbox: PlainSandbox) -> None:
    started = time.monotonic()
    assert sandbox.exec("cat; echo done", timeout=10).output == "done\n" and time.monotonic() - started < 5


def test_timeout_kills_the_whole_process_tree(sandbox: PlainSandbox) -> None:
    started = time.monotonic()
    result = sandbox.exec("echo $$ > pgid; trap '' TERM; sleep 100 & sleep 100", timeout=1)
    assert result.timed_out and result.exit_code is None and time.monotonic() - started < 5
    pgid = int((sandbox.workdir / "pgid").read_text())
    assert wait_until(lambda: not live_members(pgid), timeout=2), live_members(pgid)
    assert sandbox.exec("echo still here").output == "still here\n"


def test_an_interrupt_while_a_command_starts_still_stops_it(sandbox: PlainSandbox,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server interrupts when a client hangs up, which may fall between the command's process
    starting and the session noting it as running: that command is stopped too, not left to its timeout."""
    real_run = jobs.run_command

    def interrupted_while_starting(*args, on_start, **kwargs):
        def started(pgid: int) -> None:
            assert sandbox.interrupt()  # the process exists; the session has not noted it yet
            on_start(pgid)
        return real_run(*args, on_start=started, **kwargs)

    monkeypatch.setattr(jobs, "run_command", interrupted_while_starting)
    tag, started = marker(), time.monotonic()
    result = sandbox.exec(f"trap '' TERM; sleep {tag}; echo survived", timeout=60)
    assert result.exit_code != 0 and "survived" not in result.output and time.monotonic() - started < 10
    assert wait_until(lambda: not processes_with(f"sleep {tag}"), timeout=2)
    monkeypatch.undo()
    assert sandbox.exec("echo still here").output == "still here\n"


def test_children_holding_the_pipe_do_not_block(sandbox: PlainSandbox) -> None:
    started = time.monotonic()
    result = sandbox.exec("echo $$ > pgid; sleep 100 & echo started", timeout=30)
    assert time.monotonic() - started < 5 and result.exit_code == 0
    assert result.output.startswith("started\n") and "background" in result.output
    assert wait_until(lambda: not live_members(int((sandbox.workdir / "pgid").read_text())), timeout=2)


def test_detached_children_survive_until_close(backend: PlainBackend) -> None:
    box = backend.open("detached")
    assert box.exec("echo $$ > pgid; sleep 100 > /dev/null 2>&1 & echo ok").output == "ok\n"
    pgid = int((box.workdir / "pgid").read_text())
    assert live_members(pgid)
    box.close()
    assert wait_until(lambda: not live_members(pgid), timeout=3)


def test_output_cap_keeps_head_and_tail(tmp_path: Path) -> None:
    with PlainBackend(SandboxSettings(state_root=tmp_path, output_cap_bytes=1000)).open("cap") as box:
        result = box.exec("seq 1 100000")
    assert result.truncated and result.exit_code == 0
    assert result.output.startswith("1\n2\n3\n") and result.output.endswith("99999\n100000\n")
    assert "...[output truncated: " in result.output and len(result.output.encode()) < 1100
    assert truncate_output(b"short", 10) == ("short", False)
    assert "[output truncated: 10 bytes omitted]" in truncate_output(b"0123456789abcdefghij", 10)[0]


def test_environment_is_sanitized(backend: PlainBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    with backend.open("env") as box:
        env = dict(line.split("=", 1) for line in box.exec("env").output.splitlines() if "=" in line)
    assert "secret" not in "".join(env.values()) and env["HOME"] == str(box.workdir)
    assert env["TERM"] == "dumb" and env["PYTHONUNBUFFERED"] == "1" and env["PATH"] and env["LANG"]


def test_cwd_is_honoured_inside_the_workdir(backend: PlainBackend) -> None:
    with backend.open("cwd", cwd="/app") as box:
        assert box.cwd == str(box.workdir / "app") and box.exec("pwd").output.strip() == box.cwd
        assert box.write_file("main.py", b"print(1)\n") == str(box.workdir / "app" / "main.py")
        box.exec(f"rm -rf {box.cwd}")
        assert box.exec("pwd").output.strip() == box.cwd  # recreated
    with pytest.raises(SandboxError):
        backend.open("escape", cwd="../../etc")


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "/tmp/hermes-escape.txt"])
def test_path_escapes_are_refused(sandbox: PlainSandbox, path: str) -> None:
    with pytest.raises(SandboxError):
        sandbox.write_file(path, b"x")
    with pytest.raises(SandboxError):
        sandbox.read_file(path)
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("missing.txt")


def test_symlink_escape_is_refused(sandbox: PlainSandbox, tmp_path: Path) -> None:
    sandbox.exec(f"ln -s {tmp_path} link")
    with pytest.raises(SandboxError):
        sandbox.write_file("link/evil.txt", b"x")
    assert not (tmp_path / "evil.txt").exists()


def test_background_spawn_poll_kill(sandbox: PlainSandbox) -> None:
    first, second = sandbox.spawn("echo hello; sleep 100"), sandbox.spawn("echo done; exit 4")
    assert wait_until(lambda: "hello" in sandbox.poll(first).output) and sandbox.poll(first).running
    assert wait_until(lambda: not sandbox.poll(second).running)
    assert sandbox.poll(second).exit_code == 4 and sandbox.poll(second).output == "done\n"
    pgid = sandbox.jobs.jobs[first].proc.pid
    assert sandbox.kill(first).exit_code == 128 + 15 and wait_until(lambda: not live_members(pgid), timeout=2)
    assert [s.process_id for s in sandbox.processes()] == [first, second]
    assert not list(sandbox.workdir.iterdir())  # logs live outside the workdir
    with pytest.raises(SandboxError):
        sandbox.poll(99)


def test_plain_close_and_reap(backend: PlainBackend) -> None:
    script = textwrap.dedent(f"""
        import os
        from hermes_core.sandbox import SandboxSettings
        from hermes_core.sandbox.local import PlainBackend
        box = PlainBackend(SandboxSettings(state_root={str(backend.state_root)!r})).open("orphan")
        print(box.workdir)
        os._exit(0)  # dies without closing its sandbox
    """)
    orphan = Path(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                                 check=True).stdout.strip())
    with backend.open("alive") as mine:
        pgid = mine.jobs.jobs[mine.spawn("sleep 100")].proc.pid
        assert backend.reap() == 1 and not orphan.exists() and mine.workdir.is_dir()
        assert backend.reap() == 0
    assert not mine.workdir.exists() and wait_until(lambda: not live_members(pgid), timeout=2)
    mine.close()  # idempotent
    with pytest.raises(SandboxError):
        mine.exec("true")


def test_plain_preflight_and_get_backend(backend: PlainBackend, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    assert backend.preflight(set()) == []
    assert all("has no images" in problem for problem in backend.preflight({"python:3.11", "ubuntu:24.04"}))
    with pytest.raises(SandboxError):
        backend.open("with-image", image="python:3.11")
    monkeypatch.delenv("HERMES_TERMINAL_BACKEND", raising=False)
    assert isinstance(get_backend(), BubblewrapBackend) and get_backend().name == "local"
    plain = get_backend("plain", SandboxSettings(state_root=tmp_path, command_timeout_s=1))
    assert isinstance(plain, PlainBackend) and plain.state_root == tmp_path
    assert PlainBackend().settings.command_timeout_s == DEFAULT_COMMAND_TIMEOUT_S
    with plain.open("short") as box:
        assert box.exec("sleep 100").timed_out
    assert {"local", "plain"} <= set(known_backends())


