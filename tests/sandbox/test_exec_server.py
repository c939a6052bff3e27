"""The `local` backend's exec server (hermes_core/sandbox/exec_server.py + exec_server.c): one bubblewrap
per session, commands forked inside it. Exit codes, caps, timeouts, cwd/env, what commands can do to
the server, a server that dies or lies, and the per-command fallback."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from hermes_core.sandbox import SandboxError, SandboxSettings
from hermes_core.sandbox.base import SandboxFailed
from hermes_core.sandbox.bubblewrap import BubblewrapBackend, session_leftovers
from hermes_core.sandbox import exec_server
from hermes_core.sandbox.exec_server import ExecServer, server_binary
from hermes_core.sandbox.zygote import Zygote
from procs import ignoring, marker, open_fds, process_folders, processes_with, wait_until

pytestmark = pytest.mark.skipif(server_binary() is None, reason="no C compiler: commands run one bubblewrap each")


@pytest.fixture
def settings(tmp_path: Path) -> SandboxSettings:
    return SandboxSettings(state_root=tmp_path / "state")


@pytest.fixture
def backend(settings: SandboxSettings) -> Iterator[BubblewrapBackend]:
    with BubblewrapBackend(settings) as local:
        yield local
    assert session_leftovers(settings.state_root) == []


def test_commands_share_one_sandbox_and_report_exit_codes(backend: BubblewrapBackend) -> None:
    with backend.open("codes", cwd="/srv/app") as box:
        assert box.exec("exit 0").exit_code == 0 and box.exec("exit 3").exit_code == 3
        assert box.exec("kill -TERM $$").exit_code == 128 + 15  # killed by a signal: shell convention
        assert box.exec("no-such-command-here").exit_code == 127
        first = box.exec("echo $$; cat /proc/1/comm").output.split()
        second = box.exec("echo $$; cat /proc/1/comm").output.split()
        assert first[1] == second[1] == "exec-server" and first[0] != second[0]  # one server, new processes
        assert box._server is not None and box._server.alive()
        env = dict(line.split("=", 1) for line in box.exec("env").output.splitlines() if "=" in line)
        assert env["HOME"] == "/srv/app" and env["TERM"] == "dumb" and box.exec("pwd").output == "/srv/app\n"
        assert box.exec("cd /tmp; pwd").output == "/tmp\n" and box.exec("pwd").output == "/srv/app\n"
        started = time.monotonic()
        assert box.exec("cat; echo done", timeout=10).output == "done\n" and time.monotonic() - started < 5


def test_host_secrets_do_not_reach_commands(backend: BubblewrapBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    with backend.open("env") as box:
        assert "sk-secret" not in box.exec("env; cat /proc/1/environ").output


def test_output_is_capped_head_and_tail(settings: SandboxSettings) -> None:
    with BubblewrapBackend(dataclasses.replace(settings, output_cap_bytes=1000)) as local, local.open("cap") as box:
        result = box.exec("seq 1 200000; echo err >&2")
        assert result.truncated and result.exit_code == 0 and len(result.output.encode()) < 1100
        assert result.output.startswith("1\n2\n3\n") and result.output.endswith("200000\nerr\n")
        big = os.urandom(3 << 20)  # files are not capped, both ways
        box.write_file("big.bin", big)
        assert box.read_file("big.bin") == big


def test_timeout_kills_the_whole_tree(backend: BubblewrapBackend) -> None:
    tag = marker()
    with backend.open("timeout") as box:
        started = time.monotonic()
        result = box.exec(f"trap '' TERM; (setsid sh -c 'sleep {tag}' &); (sleep {tag} &); sleep {tag}", timeout=1)
        assert result.timed_out and result.exit_code is None and time.monotonic() - started < 5
        assert wait_until(lambda: not processes_with(f"sleep {tag}"), timeout=3), processes_with(f"sleep {tag}")
        assert box.exec("echo still here").output == "still here\n"
        # Left behind by a command that ended normally: they end with it, as in a pid namespace of its own.
        assert box.exec(f"sleep {tag}1 > /dev/null 2>&1 & setsid sleep {tag}2 > /dev/null 2>&1 & echo ok").output == "ok\n"
        assert wait_until(lambda: not processes_with(f"sleep {tag}"), timeout=3)


def test_parallel_commands_and_file_operations(backend: BubblewrapBackend) -> None:
    """execute_code runs a program while another thread reads and writes the channel's files."""
    with backend.open("parallel") as box:
        results: list[str] = []
        slow = threading.Thread(target=lambda: results.append(box.exec("sleep 0.5; cat late.txt").output))
        slow.start()
        box.write_file("late.txt", b"written meanwhile\n")
        outputs = [box.exec(f"echo {n}").output for n in range(20)]
        slow.join()
        assert outputs == [f"{n}\n" for n in range(20)] and results == ["written meanwhile\n"]


def test_commands_cannot_reach_or_stop_the_server(backend: BubblewrapBackend) -> None:
    with backend.open("probe") as box:
        out = box.exec("readlink /proc/1/fd/3 || echo no-link; cat /proc/1/fd/0; cat /proc/1/exe | head -c 4; "
                       "cat /proc/1/maps | head -1; kill -9 1; grep CapEff /proc/self/status").output
        assert "no-link" in out and "socket" not in out and out.count("Permission denied") >= 3, out
        assert "ELF" not in out and "CapEff:\t0000000000000000" in out
        assert box.exec("echo alive").output == "alive\n"  # pid 1 ignores signals from its namespace
        assert not [name for name in box.exec("ls -A /").output.split() if "exec" in name]  # no file of it inside


def test_a_server_killed_mid_command_fails_the_sandbox_clearly(backend: BubblewrapBackend) -> None:
    tag = marker()
    box = backend.open("killed")
    assert box.exec("true").exit_code == 0
    box.spawn(f"sleep {tag}")  # background jobs are bubblewraps of their own
    launcher = box._server.proc
    if launcher is None:  # a session the slot's zygote made: its pid 1 is the server
        killer = threading.Timer(0.5, lambda: os.kill(box._session_pid, signal.SIGKILL))
    else:
        killer = threading.Timer(0.5, lambda: os.killpg(launcher.pid, signal.SIGKILL))
    killer.start()
    started = time.monotonic()
    with pytest.raises(SandboxError, match="the sandbox failed: its exec server"):
        box.exec(f"sleep {tag}", timeout=30)
    assert time.monotonic() - started < 10
    with pytest.raises(SandboxError, match="the sandbox failed"):
        box.exec("echo again")
    box.close()
    assert wait_until(lambda: not processes_with(f"sleep {tag}"), timeout=3)
    with backend.open("next sample") as following:  # the next sample (the slot reused) is unaffected
        assert following.exec("echo fine").output == "fine\n" and following.read_file("/etc/hostname")


def _lying_server(tmp_path: Path, behaviour: str) -> ExecServer:
    """An ExecServer whose 'sandbox' is a Python script that answers commands wrongly."""
    script = tmp_path / "liar.py"
    script.write_text(
        "import os, socket, sys, time\n"
        "ctl = socket.socket(fileno=int(sys.argv[1]))\n"
        "ctl.send(b'R')\n"
        "while True:\n"
        "    msg, fds, _, _ = socket.recv_fds(ctl, 1, 4)\n"
        "    if not msg: break\n"
        "    sock = socket.socket(fileno=fds[0])\n"
        f"    behaviour = {behaviour!r}\n"
        "    if behaviour == 'garbage': sock.sendall(b'X' * 4096)\n"
        "    elif behaviour == 'silent': time.sleep(60)\n"
        "    elif behaviour == 'hangup': sock.close()\n")
    argv = lambda ctl, exe: [sys.executable, str(script), str(ctl)]  # noqa: E731
    return ExecServer(argv, Path(sys.executable), tmp_path, dict(os.environ), ())


@pytest.mark.parametrize("behaviour, message", [("garbage", "malformed"), ("silent", "did not stop"),
                                                # a hang-up may come before the request is sent
                                                ("hangup", "stopped while running|did not take the command")])
def test_the_parent_trusts_nothing_the_server_sends(tmp_path: Path, behaviour: str, message: str) -> None:
    server = _lying_server(tmp_path, behaviour)
    try:
        started = time.monotonic()
        with pytest.raises(SandboxError, match=message):
            server.call(["/bin/true"], "/", {}, 0.5, None, lambda chunk: None, None)
        assert time.monotonic() - started < 15
        with pytest.raises(SandboxError, match="the sandbox failed"):
            server.call(["/bin/true"], "/", {}, 0.5, None, lambda chunk: None, None)
    finally:
        server.stop()


def test_a_failed_server_releases_every_fd_of_every_call(tmp_path: Path) -> None:
    """A failed sandbox refuses each later call: the fds each refused call opened (its socket and
    pipes) leaked, and an execute_code channel asking again and again ran the process out of fds."""
    server = _lying_server(tmp_path, "garbage")
    try:
        before = open_fds()
        with pytest.raises(SandboxError, match="malformed"):  # failed while following the command
            server.call(["/bin/true"], "/", {}, 5, b"input", lambda chunk: None, lambda chunk: None)
        for stdin, err in [(None, None), (b"input", None), (None, lambda chunk: None)] * 100:
            with pytest.raises(SandboxFailed, match="the sandbox failed"):  # refused before anything is sent
                server.call(["/bin/true"], "/", {}, 5, stdin, lambda chunk: None, err)
        assert open_fds() == before
    finally:
        server.stop()


def test_a_failed_sandbox_ends_what_still_runs_in_it(backend: BubblewrapBackend) -> None:
    """A command the server refuses (here: no argv) fails the sandbox for good; commands still running
    end with it at once instead of at their timeout (an execute_code program waiting for an answer the
    failed sandbox can never carry)."""
    tag = marker()
    with backend.open("failing") as box:
        outcome: list[BaseException] = []
        runner = threading.Thread(target=lambda: outcome.extend(_raised(lambda: box.exec(f"sleep {tag}", timeout=60))))
        runner.start()
        assert wait_until(lambda: processes_with(f"sleep {tag}"), timeout=10)
        with pytest.raises(SandboxFailed, match="the sandbox failed: its exec server stopped while running"):
            box._server.call([], "/", {}, 5, None, lambda chunk: None, None)
        runner.join(timeout=30)
        assert not runner.is_alive() and not processes_with(f"sleep {tag}")
        assert len(outcome) == 1 and "the sandbox failed" in str(outcome[0])
        with pytest.raises(SandboxFailed):
            box.read_file("/etc/hostname")


def _raised(call: Callable[[], object]) -> list[BaseException]:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - what the test looks at
        return [exc]
    return []


def test_a_command_over_the_servers_cap_is_refused_and_the_sandbox_stays_usable(backend: BubblewrapBackend) -> None:
    """The server drops a request over its 8 MiB cap: that failed the sandbox (a 9 MiB terminal call
    from an execute_code program broke it for good). It is refused here instead, with the cap named."""
    with backend.open("long") as box:
        with pytest.raises(SandboxError, match="the command is too long: .* the most is 8 MiB") as refused:
            box.exec("echo " + "x" * (9 << 20))
        assert not isinstance(refused.value, SandboxFailed)
        assert box.exec("echo still fine").output == "still fine\n"


def test_without_the_server_each_command_is_a_bubblewrap(settings: SandboxSettings) -> None:
    with BubblewrapBackend(dataclasses.replace(settings, exec_server=False)) as local, local.open("plain") as box:
        assert set(box.exec("ps -eo comm").output.split()) == {"COMMAND", "bwrap", "ps"}
        assert box.exec("exit 4").exit_code == 4 and box._server is None
        box.write_file("f", b"x")
        assert box.read_file("f") == b"x"


def test_concurrent_sessions_writing_files_and_running_commands_keep_their_pipes(backend: BubblewrapBackend) -> None:
    """Each fd closed once: a second close of a written stdin could close another session's fresh
    pipe, whose command then failed with EBADF (seen as one failed terminal call in `make demo`)."""
    failures: list[str] = []

    def session(number: int) -> None:
        with backend.open(f"busy {number}") as box:
            for round_ in range(25):
                try:
                    box.write_file(f"f{round_}", f"{number}:{round_}".encode())
                    result = box.exec(f"cat f{round_}")
                    if result.output != f"{number}:{round_}" or result.exit_code != 0:
                        failures.append(f"session {number} round {round_}: {result}")
                except (OSError, SandboxError) as exc:
                    failures.append(f"session {number} round {round_}: {exc!r}")

    threads = [threading.Thread(target=session, args=(number,)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_sandboxes_asked_for_at_once_start_a_few_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Starts in flight are capped per process: 1,024 sessions starting together on 2 cores each took
    longer than the start timeout, and a quarter of their first commands failed."""
    monkeypatch.setattr(exec_server, "_starting", threading.BoundedSemaphore(2))
    script, log = tmp_path / "slow.py", tmp_path / "times.log"
    script.write_text(  # a server that takes 0.2 s to get ready and logs when it started and was ready
        "import socket, sys, time\n"
        "started = time.monotonic(); time.sleep(0.2)\n"
        f"open({str(log)!r}, 'a').write(f'{{started}} {{time.monotonic()}}\\n')\n"
        "ctl = socket.socket(fileno=int(sys.argv[1])); ctl.send(b'R'); ctl.recv(1)\n")
    servers: list[ExecServer] = []

    def start() -> None:
        argv = lambda ctl, exe: [sys.executable, str(script), str(ctl)]  # noqa: E731
        servers.append(ExecServer(argv, Path(sys.executable), tmp_path, dict(os.environ), ()))

    threads = [threading.Thread(target=start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for server in servers:
        server.stop()
    assert len(servers) == 6
    assert most_at_once(log, 6) == 2


def test_sessions_of_zygotes_asked_for_at_once_start_a_few_at_a_time(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot's zygote makes its sessions in turns too: at 1,024 sessions on 2 cores, a round of sessions
    opening together (each a clone, a dozen mounts and a pivot_root) left some past the start timeout,
    and their samples failed ("its session was not ready within 10 s")."""
    script, log = tmp_path / "zygote.py", tmp_path / "times.log"
    script.write_text(  # a zygote whose every session takes 0.2 s to get ready, logging when it began and ended
        "import array, socket, sys, time\n"
        "ctl = socket.socket(fileno=int(sys.argv[1])); ctl.send(b'R')\n"
        "while True:\n"
        "    request, ancillary, _, _ = ctl.recvmsg(8192, socket.CMSG_SPACE(4))\n"
        "    if not request: break\n"
        "    session = socket.socket(fileno=array.array('i', ancillary[0][2])[0])\n"
        "    started = time.monotonic(); time.sleep(0.2)\n"
        f"    open({str(log)!r}, 'a').write(f'{{started}} {{time.monotonic()}}\\n')\n"
        "    session.send(b'R')\n")
    zygotes = [Zygote(lambda ctl, exe: [sys.executable, str(script), str(ctl)], Path(sys.executable), tmp_path,
                      dict(os.environ), ()) for _ in range(6)]
    monkeypatch.setattr(exec_server, "_starting", threading.BoundedSemaphore(2))
    opened: list[tuple[socket.socket, int]] = []
    threads = [threading.Thread(target=lambda zygote=zygote: opened.append(zygote.open("/", 1 << 20, 65536)))
               for zygote in zygotes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for ctl, _ in opened:
        ctl.close()
    for zygote in zygotes:
        zygote.stop()
    assert len(opened) == 6 and all(pid > 0 for _, pid in opened)
    assert most_at_once(log, 6) == 2


def most_at_once(log: Path, count: int) -> int:
    """The most starts in flight at one moment, from `count` lines of `started ready` times in `log`."""
    spans = [tuple(map(float, line.split())) for line in log.read_text().splitlines()]
    assert len(spans) == count
    return max(sum(begin <= moment < end for begin, end in spans) for moment, _ in spans)


@pytest.mark.parametrize("command, message", [("sleep 30", r"could not start the sandbox: it was not ready within 1 s"),
                                              ("exit 3", r"could not start the sandbox: it exited \(status 3\)")])
def test_a_server_that_never_gets_ready_is_named_for_what_happened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   command: str, message: str) -> None:
    monkeypatch.setattr(exec_server, "START_TIMEOUT_S", 1.0)
    started = time.monotonic()
    with pytest.raises(SandboxError, match=message):
        ExecServer(lambda ctl, exe: ["/bin/sh", "-c", command], Path("/bin/sh"), tmp_path, {}, ())
    assert time.monotonic() - started < 5


def _pid_running(argv: list[str]) -> int:
    wanted = b"".join(arg.encode() + b"\0" for arg in argv)
    for path in (folder / "cmdline" for folder in process_folders()):
        try:
            if path.read_bytes() == wanted:
                return int(path.parent.name)
        except OSError:
            continue  # exited meanwhile
    raise AssertionError(f"no process runs {argv}")


def test_the_launcher_puts_bubblewrap_in_the_slots_cgroup_and_network_or_fails_first(settings: SandboxSettings) -> None:
    """bubblewrap is started by the server binary's launcher mode (one process where a shell and
    nsenter took two): it and every command are in the slot's cgroup and network namespace; when the
    cgroup cannot be joined, nothing runs and the error says why."""
    with BubblewrapBackend(settings) as local:
        if local.hierarchy is None:
            pytest.skip("no cgroup hierarchy with memory and pids controllers here")
        with local.open("joins") as box:
            assert box.exec("true").exit_code == 0
            # as root it waits for bubblewrap, its child in the user namespace (the zygote's, as root)
            launcher = (box._server.proc or box._slot.zygote.proc).pid
            launched = int(Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()[0])
            assert Path(f"/proc/{launched}/comm").read_text().strip() == "bwrap"
            assert os.readlink(f"/proc/{launched}/ns/user") != os.readlink("/proc/self/ns/user")
            slot_net = os.readlink(f"/proc/self/fd/{box._fds['net']}")
            tag = marker()
            runner = threading.Thread(target=box.exec, args=(f"sleep {tag}",), kwargs={"timeout": 5})
            runner.start()
            assert wait_until(lambda: processes_with(f"sleep {tag}"), timeout=5)
            members = box.cgroup.pids()
            sleeper = _pid_running(["sleep", tag])
            assert {launched, sleeper} <= members
            assert os.readlink(f"/proc/{sleeper}/ns/net") == os.readlink(f"/proc/{launched}/ns/net") == slot_net
            assert os.readlink(f"/proc/{launched}/ns/net") != os.readlink("/proc/self/ns/net")
            os.kill(sleeper, signal.SIGKILL)
            runner.join()
    with BubblewrapBackend(settings) as local:  # a new slot: nothing of it runs yet
        box = local.open("no cgroup")
        box.cgroup.remove()  # gone before the first command: bubblewrap must not start outside it
        with pytest.raises(SandboxError, match="could not start the sandbox: exec-server: cannot join the cgroup"):
            box.exec("true")
        box.close()


def test_commands_get_default_signals_whatever_started_the_sandbox(tmp_path: Path) -> None:
    """A script's background job starts with SIGINT ignored (and a Dagster run maps SIGTERM onto it):
    dispositions the orchestrator inherited are not its commands'. `kill -TERM $$` still ends a command."""
    script = tmp_path / "run.py"
    script.write_text(
        "import sys\n"
        "from pathlib import Path\n"
        "from hermes_core.sandbox import SandboxSettings\n"
        "from hermes_core.sandbox.bubblewrap import BubblewrapBackend\n"
        "with BubblewrapBackend(SandboxSettings(state_root=Path(sys.argv[1]))) as local, local.open('s') as box:\n"
        "    print(box.exec('kill -TERM $$').exit_code, box.exec('kill -INT $$').exit_code)\n")
    done = subprocess.run(ignoring("INT TERM", [sys.executable, str(script), str(tmp_path / "state")]),
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["143", "130"], done.stderr
