"""The local sandbox backend, with real processes and real files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hermes_core.sandbox import (
    DEFAULT_COMMAND_TIMEOUT_S,
    LocalBackend,
    LocalSandbox,
    SandboxError,
    get_backend,
    known_backends,
    truncate_output,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="process checks read /proc")


def live_members(pgid: int) -> list[int]:
    """Pids of the non-zombie processes of a process group."""
    members = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry))
    return members


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(state_root=tmp_path / "sandboxes")


@pytest.fixture
def sandbox(backend: LocalBackend):
    with backend.open("session-1") as box:
        yield box


def test_exec_merges_output_and_reports_exit_code(sandbox: LocalSandbox) -> None:
    result = sandbox.exec("echo out; echo err >&2; exit 3")
    assert result.output == "out\nerr\n"
    assert result.exit_code == 3
    assert not result.timed_out and not result.truncated
    assert sandbox.exec("kill -TERM $$").exit_code == 128 + 15  # killed by a signal: shell convention


def test_workdir_is_private_and_home(sandbox: LocalSandbox, backend: LocalBackend) -> None:
    assert sandbox.workdir.is_dir()
    assert sandbox.workdir.parent == backend.state_root.resolve()
    assert sandbox.workdir.name.startswith("session-1-")
    assert sandbox.exec("pwd").output.strip() == str(sandbox.workdir)
    assert sandbox.exec("echo $HOME").output.strip() == str(sandbox.workdir)


def test_stdin_is_closed(sandbox: LocalSandbox) -> None:
    started = time.monotonic()
    result = sandbox.exec("cat; echo done", timeout=10)
    assert result.output == "done\n" and time.monotonic() - started < 5


def test_timeout_kills_the_whole_process_tree(sandbox: LocalSandbox) -> None:
    started = time.monotonic()
    result = sandbox.exec("echo $$ > pgid; sleep 100 & sleep 100", timeout=1)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.exit_code is None
    assert elapsed < 3.5
    pgid = int((sandbox.workdir / "pgid").read_text())
    assert wait_until(lambda: not live_members(pgid), timeout=2), live_members(pgid)
    # The session is still usable.
    after = sandbox.exec("echo still here")
    assert after.output == "still here\n" and after.exit_code == 0


def test_timeout_escalates_to_sigkill(sandbox: LocalSandbox) -> None:
    started = time.monotonic()
    result = sandbox.exec("echo $$ > pgid; trap '' TERM; sleep 100 & sleep 100", timeout=1)
    assert result.timed_out and time.monotonic() - started < 5
    pgid = int((sandbox.workdir / "pgid").read_text())
    assert wait_until(lambda: not live_members(pgid), timeout=2)


def test_children_holding_the_pipe_do_not_block(sandbox: LocalSandbox) -> None:
    started = time.monotonic()
    result = sandbox.exec("echo $$ > pgid; sleep 100 & echo started", timeout=30)
    assert time.monotonic() - started < 5
    assert result.exit_code == 0 and not result.timed_out
    assert result.output.startswith("started\n") and "background" in result.output
    pgid = int((sandbox.workdir / "pgid").read_text())
    assert wait_until(lambda: not live_members(pgid), timeout=2)


def test_detached_children_survive_until_close(backend: LocalBackend) -> None:
    box = backend.open("detached")
    result = box.exec("echo $$ > pgid; sleep 100 > /dev/null 2>&1 & echo ok")
    assert result.output == "ok\n"
    pgid = int((box.workdir / "pgid").read_text())
    assert live_members(pgid)  # a server started with `&` keeps running between commands
    box.close()
    assert wait_until(lambda: not live_members(pgid), timeout=3)


def test_output_cap_keeps_head_and_tail(backend: LocalBackend) -> None:
    capped = LocalBackend(state_root=backend.state_root, output_cap=1000)
    with capped.open("cap") as box:
        result = box.exec("seq 1 100000")
    assert result.truncated and result.exit_code == 0
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("99999\n100000\n")
    assert "...[output truncated: " in result.output
    assert len(result.output.encode()) < 1100


def test_default_output_cap(sandbox: LocalSandbox) -> None:
    result = sandbox.exec("head -c 1000000 /dev/zero | tr '\\0' a")
    assert result.truncated
    head, tail = result.output.split("\n...[output truncated: 934464 bytes omitted]...\n")
    assert head == tail == "a" * (32 * 1024)


def test_truncate_output() -> None:
    assert truncate_output(b"short", 10) == ("short", False)
    text, truncated = truncate_output(b"0123456789abcdefghij", 10)
    assert truncated and text.startswith("01234") and text.endswith("fghij")
    assert "[output truncated: 10 bytes omitted]" in text


def test_environment_is_sanitized(backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("HERMES_TEST_TOKEN", "secret-token")
    with backend.open("env") as box:
        env = dict(line.split("=", 1) for line in box.exec("env").output.splitlines() if "=" in line)
    assert not [name for name in env if name.endswith("_API_KEY")]
    assert "secret" not in "".join(env.values())
    assert env["HOME"] == str(box.workdir)
    assert env["TERM"] == "dumb" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"] and env["LANG"]


def test_cwd_is_honoured_inside_the_workdir(backend: LocalBackend) -> None:
    with backend.open("cwd", cwd="/app") as box:
        assert box.cwd == str(box.workdir / "app")
        assert box.exec("pwd").output.strip() == str(box.workdir / "app")
        written = box.write_file("main.py", b"print(1)\n")
        assert written == str(box.workdir / "app" / "main.py")
        assert box.read_file(str(box.workdir / "app" / "main.py")) == b"print(1)\n"
    with backend.open("relative", cwd="src/pkg") as box:
        assert box.cwd == str(box.workdir / "src" / "pkg")
    with pytest.raises(SandboxError):
        backend.open("escape", cwd="../../etc")


def test_cwd_recreated_when_deleted(backend: LocalBackend) -> None:
    with backend.open("gone", cwd="/app") as box:
        box.exec(f"rm -rf {box.cwd}")
        assert box.exec("pwd").output.strip() == box.cwd


def test_read_write_round_trip(sandbox: LocalSandbox) -> None:
    path = sandbox.write_file("deep/folder/file.txt", "héllo\n".encode())
    assert Path(path) == sandbox.workdir / "deep" / "folder" / "file.txt"
    assert sandbox.read_file("deep/folder/file.txt") == "héllo\n".encode()
    assert sandbox.exec("cat deep/folder/file.txt").output == "héllo\n"
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("missing.txt")
    with pytest.raises(SandboxError):
        sandbox.read_file("deep")


@pytest.mark.parametrize("path", ["../outside.txt", "a/../../outside.txt", "/etc/passwd", "/tmp/hermes-escape.txt"])
def test_path_escapes_are_refused(sandbox: LocalSandbox, path: str) -> None:
    with pytest.raises(SandboxError):
        sandbox.write_file(path, b"x")
    with pytest.raises(SandboxError):
        sandbox.read_file(path)
    assert not (sandbox.workdir.parent / "outside.txt").exists()


def test_symlink_escape_is_refused(sandbox: LocalSandbox, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    sandbox.exec(f"ln -s {outside} link")
    with pytest.raises(SandboxError):
        sandbox.write_file("link/evil.txt", b"x")
    assert not (outside / "evil.txt").exists()


def test_background_spawn_poll_kill(sandbox: LocalSandbox) -> None:
    first = sandbox.spawn("echo hello; sleep 100")
    second = sandbox.spawn("echo done; exit 4")
    assert first != second
    assert wait_until(lambda: "hello" in sandbox.poll(first).output)
    assert sandbox.poll(first).running and sandbox.poll(first).exit_code is None
    assert wait_until(lambda: not sandbox.poll(second).running)
    status = sandbox.poll(second)
    assert status.exit_code == 4 and status.output == "done\n" and status.command == "echo done; exit 4"
    assert [s.process_id for s in sandbox.processes()] == [first, second]
    pgid = sandbox._background[first].proc.pid
    killed = sandbox.kill(first)
    assert not killed.running and killed.exit_code == 128 + 15
    assert wait_until(lambda: not live_members(pgid), timeout=2)
    # Logs live outside the workdir, so the task's files are not polluted.
    assert not list(sandbox.workdir.iterdir())
    with pytest.raises(SandboxError):
        sandbox.poll(99)


def test_close_kills_background_and_removes_workdir(backend: LocalBackend) -> None:
    box = backend.open("closing")
    process_id = box.spawn("sleep 100")
    pgid = box._background[process_id].proc.pid
    workdir, state_dir = box.workdir, box.state_dir
    box.close()
    assert not workdir.exists() and not state_dir.exists()
    assert wait_until(lambda: not live_members(pgid), timeout=2)
    box.close()  # idempotent
    with pytest.raises(SandboxError):
        box.exec("true")


def test_reap_removes_leftovers_of_dead_owners(backend: LocalBackend) -> None:
    script = textwrap.dedent(f"""
        import os
        from hermes_core.sandbox.local import LocalBackend
        box = LocalBackend(state_root={str(backend.state_root)!r}).open("orphan")
        box.write_file("left.txt", b"behind")
        print(box.workdir)
        os._exit(0)  # dies without closing its sandbox
    """)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, check=True)
    orphan = Path(done.stdout.strip())
    assert orphan.is_dir()
    with backend.open("alive") as mine:
        assert backend.reap() == 1
        assert not orphan.exists() and not orphan.with_name(orphan.name + ".state").exists()
        assert mine.workdir.is_dir()  # the owner (this process) is alive
        assert backend.reap() == 0


def test_preflight_and_images(backend: LocalBackend) -> None:
    assert backend.preflight(set()) == []
    problems = backend.preflight({"python:3.11", "ubuntu:24.04"})
    assert len(problems) == 2
    assert all("no image support yet" in problem for problem in problems)
    assert "'python:3.11'" in problems[0]
    with pytest.raises(SandboxError):
        backend.open("with-image", image="python:3.11")


def test_get_backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HERMES_TERMINAL_BACKEND", raising=False)
    assert isinstance(get_backend(), LocalBackend)
    assert get_backend(state_root=tmp_path).state_root == tmp_path
    monkeypatch.setenv("HERMES_TERMINAL_BACKEND", "local")
    assert get_backend().name == "local"
    monkeypatch.setenv("HERMES_TERMINAL_BACKEND", "nope")
    with pytest.raises(ValueError, match="local"):
        get_backend()
    with pytest.raises(ValueError, match="known backends"):
        get_backend("warp-drive")
    assert "local" in known_backends()


def test_default_timeout_comes_from_the_backend(tmp_path: Path) -> None:
    assert LocalBackend(state_root=tmp_path).command_timeout == DEFAULT_COMMAND_TIMEOUT_S
    with LocalBackend(state_root=tmp_path, command_timeout=1).open("short") as box:
        started = time.monotonic()
        assert box.exec("sleep 100").timed_out
        assert time.monotonic() - started < 3.5
