"""One contract, every backend: what a sample's sandbox must guarantee (SPEC §6)."""

from __future__ import annotations

import concurrent.futures
import importlib
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from contract_backends import BACKENDS
from hermes_core.sandbox import SandboxBackend, SandboxError
from procs import marker, open_fds, processes_with, wait_until


def _contract(name: str):
    return importlib.import_module(f"contract_backends.{name}")


@pytest.fixture(params=BACKENDS)
def contract(request):
    return _contract(request.param)


@pytest.fixture()
def make(contract, tmp_path):
    """make(**settings) -> an opened sandbox with the contract image; closed at teardown."""
    opened, backends = [], []

    def open_sandbox(cwd: str | None = None, image: str | None = "default", **settings):
        backend: SandboxBackend = contract.make_backend(tmp_path, **settings)
        backends.append(backend)
        sandbox = backend.open(f"contract-{uuid.uuid4().hex[:8]}", contract.IMAGE if image == "default" else image, cwd)
        opened.append(sandbox)
        return sandbox

    def close_all() -> None:
        for sandbox in opened:
            sandbox.close()
        for backend in backends:
            backend.close()  # what a backend keeps between sessions (the local backend's slots)

    open_sandbox.close_all = close_all
    yield open_sandbox
    close_all()




def test_exec_reports_output_and_exit_code(make):
    sandbox = make()
    ok = sandbox.exec("echo hello && echo oops >&2")
    assert ok.exit_code == 0 and "hello" in ok.output and "oops" in ok.output
    assert sandbox.exec("exit 3").exit_code == 3


def test_a_sandbox_made_ready_early_runs_commands_and_files_alike(make):
    sandbox = make()
    sandbox.start()  # what the agent does while the model writes its first reply
    sandbox.start()
    assert sandbox.exec("echo ready").output.strip() == "ready"
    sandbox.write_file("note.txt", b"kept")
    assert sandbox.read_file("note.txt") == b"kept"


def test_network_is_unreachable_by_default(make):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # the kernel completes a connection into the backlog: no accept needed
    port = listener.getsockname()[1]
    try:
        result = make().exec(
            f"python3 -c \"import socket; s=socket.socket(); s.settimeout(2); s.connect(('127.0.0.1', {port})); print('CONNECTED')\""
        )
    finally:
        listener.close()
    assert "CONNECTED" not in result.output and result.exit_code != 0


def test_host_files_are_invisible_and_unwritable(make, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("TOP-SECRET")
    sandbox = make()
    assert "TOP-SECRET" not in sandbox.exec(f"cat {secret}").output
    probe = f"/usr/hermes-probe-{uuid.uuid4().hex[:6]}"
    sandbox.exec(f"echo x > {probe}; touch /etc/hermes-probe")
    assert not Path(probe).exists() and not Path("/etc/hermes-probe").exists()


def test_cwd_is_honoured_without_an_image(make):
    sandbox = make(cwd="/app", image=None) if _supports_no_image(make) else make(cwd="/app")
    assert sandbox.exec("pwd").output.strip() == "/app"
    assert sandbox.cwd == "/app"


def _supports_no_image(make) -> bool:
    try:
        make(image=None).close()
        return True
    except SandboxError:
        return False


def test_cwd_is_honoured_with_an_image(make, contract):
    if contract.IMAGE is None:
        pytest.skip("this backend's contract runs without an image")
    sandbox = make(cwd="/srv/project")
    assert sandbox.exec("pwd").output.strip() == "/srv/project"
    assert "bookworm" in sandbox.exec("cat /etc/os-release").output  # inside the image's userland


def test_files_written_by_tools_are_visible_to_commands_and_back(make):
    sandbox = make(cwd="/work")
    sandbox.write_file("notes/a.txt", b"from the tool\n")
    assert sandbox.exec("cat notes/a.txt").output.strip() == "from the tool"
    sandbox.exec("echo from the shell > b.txt")
    assert sandbox.read_file("b.txt") == b"from the shell\n"
    assert sandbox.read_file("/work/notes/a.txt") == b"from the tool\n"
    with pytest.raises((FileNotFoundError, SandboxError)):
        sandbox.read_file("missing.txt")


@pytest.mark.timeout(120)  # a FIFO read blocked until the file timeout, or forever on the host
def test_read_file_reads_regular_files_only_and_at_most_its_limit(make):
    """A FIFO without a writer would hold the read, a device stream forever: neither is opened; a file
    over the limit is refused without being read whole (execute_code's requests, read by the parent)."""
    sandbox = make(cwd="/work")
    made = sandbox.exec("mkfifo pipe && head -c 3000 /dev/zero > big && printf small > small && ln -s /dev/zero zero")
    assert made.exit_code == 0, made.output
    assert sandbox.read_file("small", limit=5) == b"small" and sandbox.read_file("big", limit=3000) == bytes(3000)
    with pytest.raises(SandboxError, match="'/?(work/)?big' is larger than 2,999 bytes"):
        sandbox.read_file("big", limit=2999)
    with pytest.raises(SandboxError, match="is not a regular file"):
        sandbox.read_file("pipe")
    with pytest.raises((SandboxError, FileNotFoundError)) as device:  # docker's archive API does not see /dev
        sandbox.read_file("zero")
    assert "larger than" not in str(device.value)  # refused, never streamed
    with pytest.raises(SandboxError, match="is a directory"):
        sandbox.read_file(".")
    assert sandbox.exec("echo usable").output.strip() == "usable"


def test_sessions_do_not_share_files(make):
    first, second = make(), make()
    first.exec("echo mine > private.txt")
    assert second.exec("cat private.txt").exit_code != 0


def test_timeout_kills_the_whole_tree_and_the_session_stays_usable(make):
    sandbox = make()
    tag = marker()
    started = time.monotonic()
    result = sandbox.exec(f"(setsid sh -c 'sleep {tag}' &); sleep {tag}", timeout=1)
    assert result.timed_out and time.monotonic() - started < 10
    time.sleep(0.5)
    assert processes_with(f"sleep {tag}") == []
    assert sandbox.exec("echo still here").output.strip() == "still here"


@pytest.mark.parametrize("exec_server", [True, False])
def test_interrupt_kills_running_commands_and_keeps_the_session(make, contract, exec_server):
    """What the API server does when a session's client hangs up mid-command (issue 28, finding 4)."""
    if not exec_server and contract.__name__ != "contract_backends.local":
        pytest.skip("one bubblewrap per command is the local backend's own mode")
    sandbox = make(exec_server=exec_server)
    running, background = marker(), marker()
    sandbox.write_file("kept.txt", b"kept")
    job = sandbox.spawn(f"sleep {background}")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        calls = [pool.submit(sandbox.exec, f"sleep {running}; echo {n} > finished-{n}") for n in range(2)]
        sleeping = lambda: [p for p in processes_with(f"sleep {running}") if p.startswith("sleep")]  # noqa: E731
        assert wait_until(lambda: len(sleeping()) == 2, 15), "the commands never started"
        assert sandbox.interrupt()
        results = [call.result(timeout=20) for call in calls]
    assert all(result.exit_code != 0 for result in results)  # killed, as a timeout kills
    assert wait_until(lambda: not processes_with(f"sleep {running}"), 5)
    assert sandbox.exec("ls finished-* 2>/dev/null | wc -l").output.strip() == "0"
    assert sandbox.poll(job).running and processes_with(f"sleep {background}")  # background processes stay
    assert sandbox.read_file("kept.txt") == b"kept" and sandbox.exec("echo still here").output.strip() == "still here"
    assert sandbox.interrupt()  # with nothing running: nothing to do


def test_interrupt_leaves_no_shell_of_a_wide_tree_to_run_its_next_step(make):
    """A hostile command: many shells, each waiting on a child, each writing a file the moment its child
    dies. An interrupt must stop them all before any child dies (one by one, a shell whose child went
    first ran on): no file is written, no process is left, and the host keeps no fd or thread of it once
    the session is closed.
    On Modal the exec agent (`nsenter` in the fake) stops itself when its child stops: the call must
    still return."""
    sandbox = make()
    tag = marker()
    sandbox.exec("true")  # the session's own fds and threads exist before the count
    before = (open_fds(), threading.active_count())
    tree = " ".join(f"(sleep {tag}; echo {n} > after-{n}) &" for n in range(12)) + f" sleep {tag}; echo x > after-main"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(sandbox.exec, tree)
        sleeping = lambda: [p for p in processes_with(f"sleep {tag}") if p.startswith("sleep")]  # noqa: E731
        assert wait_until(lambda: len(sleeping()) == 13, 15), f"the tree never started: {sleeping()}"
        assert sandbox.interrupt()
        assert call.result(timeout=20).exit_code != 0
    assert wait_until(lambda: not processes_with(tag), 5)
    assert sandbox.exec("ls after-* 2>/dev/null | wc -l").output.strip() == "0"
    make.close_all()  # whatever the interrupt left on the host must go with the session and its backend
    assert wait_until(lambda: open_fds() <= before[0] and threading.active_count() <= before[1], 5), (
        open_fds(), threading.active_count(), before)


def test_interrupt_kills_a_command_that_ignores_sigterm(make):
    """interrupt() asks with SIGTERM first (a runtime like apptainer cleans up only then): a hostile
    command that ignores it is still killed, by SIGKILL after the grace, and the session stays usable."""
    sandbox = make()
    tag = marker()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(sandbox.exec, f"trap '' TERM; sleep {tag}; echo survived")
        assert wait_until(lambda: processes_with(f"sleep {tag}"), 15), "the command never started"
        assert sandbox.interrupt()
        result = call.result(timeout=20)
    assert result.exit_code != 0 and "survived" not in result.output
    assert wait_until(lambda: not processes_with(f"sleep {tag}"), 5)
    assert sandbox.exec("echo still here").output.strip() == "still here"


def test_a_sandbox_outlives_the_thread_that_started_it(make):
    """Linux's parent-death signal follows the thread that forked a process: a session whose server or
    background job was started by a short-lived thread (asyncio.run's executor) died with that thread."""
    sandbox = make()
    tag = marker()
    starter = threading.Thread(target=lambda: (sandbox.exec("echo started > first.txt"), sandbox.spawn(f"sleep {tag}")))
    starter.start()
    starter.join()
    time.sleep(0.3)
    assert sandbox.exec("cat first.txt").output.strip() == "started"
    assert processes_with(f"sleep {tag}") and all(status.running for status in sandbox.processes())


def test_background_jobs_do_not_hang_exec(make):
    sandbox = make()
    tag = marker()
    started = time.monotonic()
    result = sandbox.exec(f"(sleep {tag} &); echo started")
    assert "started" in result.output and time.monotonic() - started < 5


def test_spawn_poll_kill(make):
    sandbox = make()
    process_id = sandbox.spawn("echo begun; sleep 60")
    deadline = time.monotonic() + 5
    while "begun" not in sandbox.poll(process_id).output and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox.poll(process_id).running and "begun" in sandbox.poll(process_id).output
    stopped = sandbox.kill(process_id)
    assert not stopped.running
    assert [p.process_id for p in sandbox.processes()] == [process_id]


def test_memory_limit_is_enforced(make):
    sandbox = make(memory_mb=128)
    result = sandbox.exec("python3 -c \"x = bytearray(512 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096]); print('ALLOCATED')\"")
    assert "ALLOCATED" not in result.output and result.exit_code != 0


def test_process_count_limit_is_enforced(make):
    sandbox = make(pids=32)
    # Python rather than a shell loop: bash retries a refused fork for ~15 s before giving up.
    script = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print('FORKED', n, flush=True)\n"
    )
    sandbox.write_file("forks.py", script.encode())
    result = sandbox.exec("python3 forks.py", timeout=20)
    forked = int(result.output.split("FORKED", 1)[1].split()[0])
    assert 0 < forked < 32


def test_nothing_is_left_behind_after_close(make, contract, tmp_path):
    sandbox = make()
    tag = marker()
    sandbox.spawn(f"sleep {tag}")
    sandbox.exec(f"(setsid sleep {tag} > /dev/null 2>&1 &); echo detached")
    time.sleep(0.3)
    sandbox.close()
    time.sleep(0.5)
    assert processes_with(f"sleep {tag}") == []
    sandbox.close()  # idempotent
    with pytest.raises(SandboxError):
        sandbox.exec("true")
    if hasattr(contract, "leftovers"):
        make.close_all()
        assert contract.leftovers(tmp_path) == []
