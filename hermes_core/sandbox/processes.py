"""The process toolkit shared by the plain and the bubblewrap backends: commands in their own process
group with a sanitized environment, capped output and a timeout that kills the whole group,
background jobs with log files, /proc checks of whether a process (group) is still alive, owner
files that tell the reaper whether a session's creator is gone, and pinned namespaces."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from hermes_core.sandbox.base import DEFAULT_OUTPUT_CAP_BYTES, ExecResult, ProcessStatus, SandboxError, find_job
from hermes_core.sandbox.output import STRAGGLER_NOTE, CappedBuffer, pump_to_log, read_capped_file

KILL_GRACE_S = 1.0  # between SIGTERM and SIGKILL of a process group
DRAIN_GRACE_S = 0.5  # how long leftover children may hold the output open after the shell exited
STALE_STATE_S = 60.0  # a session state folder without a readable owner file is only reaped after this long
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SHELL = shutil.which("bash") or shutil.which("sh") or "/bin/sh"


def shell_argv(command: str) -> list[str]:
    return [_SHELL, "-c", command]


def sanitized_env(home: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment: nothing of the host's (API keys, tokens) leaks into commands."""
    env = {"PATH": os.environ.get("PATH") or DEFAULT_PATH, "HOME": home, "LANG": os.environ.get("LANG") or "C.UTF-8",
           "TERM": "dumb",  # no colours or pagers in captured output
           "PYTHONUNBUFFERED": "1"}  # so output written before a timeout kill is not lost
    return {**env, **(extra or {})}


def group_alive(pgid: int) -> bool:
    """Whether the group has a live (non-zombie) member. Zombies count as dead: in containers whose
    init never reaps orphans they linger forever, and `killpg(pgid, 0)` alone would say alive."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True
    for entry in os.scandir("/proc"):
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                return True
        except (OSError, IndexError, ValueError):
            continue
    return False


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def kill_process_group(pgid: int, leader: subprocess.Popen | None = None, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM every process of the group, then SIGKILL whatever is still alive after `grace`."""
    stop_groups([pgid], leader, grace)
    if leader is not None:
        try:
            leader.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def stop_groups(pgids: list[int], leader: subprocess.Popen | None = None, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the groups, then SIGKILL what is still alive after `grace`. The grace matters: a
    runtime leading a group (apptainer) removes its cgroups on SIGTERM, never on SIGKILL."""
    signalled = [pgid for pgid in pgids if _signal_group(pgid, signal.SIGTERM)]
    for pgid in signalled:
        _signal_group(pgid, signal.SIGCONT)  # stopped processes only act on SIGTERM once resumed
    deadline = time.monotonic() + grace
    while signalled:
        if leader is not None:
            leader.poll()  # reap the leader: without /proc, its zombie would count as alive
        signalled = [pgid for pgid in signalled if group_alive(pgid)]
        if signalled and time.monotonic() >= deadline:
            for pgid in signalled:
                _signal_group(pgid, signal.SIGKILL)
            break
        time.sleep(0.05 if signalled else 0)


def shell_exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # shell convention for killed commands


def run_command(argv: list[str], cwd: str, env: dict[str, str], timeout: float,
                cap: int = DEFAULT_OUTPUT_CAP_BYTES, pass_fds: tuple[int, ...] = (),
                on_start: Callable[[int], None] | None = None) -> tuple[ExecResult, int]:
    """Run `argv` in a new process group with merged, capped output; returns the result and the pgid.

    Reading stops at EOF, at the timeout (the whole group is killed, `exit_code` None), or shortly
    after the shell exited while children still hold the pipe (those are killed too: they would
    otherwise block the caller until the timeout, or die of SIGPIPE later)."""
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=pass_fds)
    except OSError as exc:
        raise SandboxError(f"could not start command: {exc}") from exc
    pgid = proc.pid  # start_new_session makes the shell the leader of a fresh group
    if on_start:
        on_start(pgid)
    buffer, deadline = CappedBuffer(cap), time.monotonic() + timeout
    drain_until: float | None = None
    timed_out = stragglers = False
    assert proc.stdout is not None
    with proc.stdout, selectors.DefaultSelector() as selector:
        selector.register(proc.stdout.fileno(), selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if drain_until is None and proc.poll() is not None:
                drain_until = min(deadline, now + DRAIN_GRACE_S)
            if now >= (deadline if drain_until is None else drain_until):
                timed_out, stragglers = drain_until is None, drain_until is not None
                break
            # Wake up at least every 0.1 s to notice the shell exiting while children hold the pipe.
            if selector.select(timeout=min(0.1, deadline - now)):
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                buffer.add(chunk)
    if not (timed_out or stragglers):
        try:  # EOF, but the shell may have closed its output and kept running
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out or stragglers:
        kill_process_group(pgid, proc)
    output, truncated = buffer.render()
    result = ExecResult(output=output + (STRAGGLER_NOTE if stragglers else ""), truncated=truncated,
                        exit_code=None if timed_out else shell_exit_code(proc.returncode), timed_out=timed_out)
    return result, pgid


def process_start_time(pid: int) -> str | None:
    """Kernel start time of `pid`, to tell the owner apart from a later process reusing its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def owner_alive(owner: dict) -> bool:
    pid = int(owner["pid"])
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    return owner.get("start") is None or process_start_time(pid) in (None, owner["start"])


def owner_record(session_id: str) -> dict:
    """Who created a session: this process, with its start time so a reused pid does not count."""
    return {"pid": os.getpid(), "start": process_start_time(os.getpid()), "session_id": session_id}


def write_owner(state_dir: Path, session_id: str) -> None:
    (state_dir / "owner.json").write_text(json.dumps(owner_record(session_id)))


def orphaned(state_dir: Path) -> bool:
    """Whether a session state folder belongs to a dead process (and so may be reaped)."""
    try:
        return not owner_alive(json.loads((state_dir / "owner.json").read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        try:  # no readable owner: maybe a session being created right now
            return time.time() - state_dir.stat().st_mtime >= STALE_STATE_S
        except OSError:
            return False


@dataclass
class _Job:
    command: str
    proc: subprocess.Popen
    log: Path
    stdin: BinaryIO | None  # the pipe to its stdin, or the master side of its pseudo-terminal
    pump: threading.Thread | None = None  # copies a pseudo-terminal's output into the log



class BackgroundJobs:
    """A session's background commands: each in its own process group, output to a log file kept
    outside the sandbox's files, numbered 1, 2, ... (small ids, easy for a model to quote)."""

    def __init__(self, log_dir: Path, cap: int = DEFAULT_OUTPUT_CAP_BYTES) -> None:
        self.log_dir, self.cap = log_dir, cap
        self.jobs: dict[int, _Job] = {}
        self.exec_groups: set[int] = set()  # groups of `exec` commands that left processes behind
        self._lock = threading.Lock()  # a model may start several in parallel tool calls
        # Commands running right now, and whether the session is closing: close() may come from
        # another thread (a cancelled request) while an exec is starting, and must not miss it.
        self._running: set[int] = set()
        self._inflight = 0
        self.closed = False

    def run(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float, cap: int,
            pass_fds: tuple[int, ...] = ()) -> tuple[ExecResult, int]:
        """`run_command` for the session's `exec`: refused once closing; killed by `kill_all`."""
        with self._lock:
            if self.closed:
                raise SandboxError("the sandbox is closed")
            self._inflight += 1
        pgid = None
        try:
            result, pgid = run_command(argv, cwd, env, timeout, cap, pass_fds, on_start=self._started)
        finally:
            with self._lock:
                self._inflight -= 1
                self._running.discard(pgid)
        if group_alive(pgid):  # e.g. `server > log 2>&1 &` outlives the command; close() stops it
            self.exec_groups.add(pgid)
        return result, pgid

    def _started(self, pgid: int) -> None:
        with self._lock:
            self._running.add(pgid)
            closing = self.closed
        if closing:  # close() began while this command was starting
            stop_groups([pgid])

    def start(self, command: str, argv: list[str], cwd: str, env: dict[str, str],
              pass_fds: tuple[int, ...] = (), pty: bool = False) -> int:
        """Start a job whose stdin stays open for `write_stdin` (a pipe, or with `pty` a pseudo-terminal
        that is also its stdout and stderr, for programs that behave differently on a terminal)."""
        with self._lock:
            if self.closed:
                raise SandboxError("the sandbox is closed")
            job_id = len(self.jobs) + 1
            log = self.log_dir / f"process-{job_id}.log"
            master, slave = os.openpty() if pty else (-1, -1)
            with open(log, "wb") as out:
                streams = dict(stdin=slave, stdout=slave, stderr=slave) if pty else dict(
                    stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)
                try:
                    proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True, pass_fds=pass_fds,
                                            **streams)  # type: ignore[call-overload]
                except OSError as exc:
                    if pty:
                        os.close(master)
                    raise SandboxError(f"could not start command: {exc}") from exc
                finally:
                    if pty:
                        os.close(slave)
            if not pty:
                self.jobs[job_id] = _Job(command, proc, log, proc.stdin)
                return job_id
            writer = open(os.dup(master), "wb", buffering=0)  # before the pump may close `master`
            pump = threading.Thread(target=pump_to_log, args=(master, log), daemon=True)
            pump.start()
            self.jobs[job_id] = _Job(command, proc, log, writer, pump)
            return job_id

    def write_stdin(self, job_id: int, data: bytes) -> None:
        job = find_job(self.jobs, job_id)
        if job.proc.poll() is not None:
            raise SandboxError(f"background process {job_id} has already finished")
        if job.stdin is None or job.stdin.closed:
            raise SandboxError(f"the input of background process {job_id} is closed")
        try:
            job.stdin.write(data)
            job.stdin.flush()
        except OSError as exc:  # e.g. the program closed its stdin
            raise SandboxError(f"could not write to background process {job_id}: {exc}") from exc

    def close_stdin(self, job_id: int) -> None:
        """End of input: the pipe is closed; a terminal gets its end-of-file character (Ctrl-D)."""
        job = find_job(self.jobs, job_id)
        if job.proc.poll() is not None:
            raise SandboxError(f"background process {job_id} has already finished")
        if job.pump is not None:
            self.write_stdin(job_id, b"\x04")
        elif job.stdin is not None:
            _close_quietly(job.stdin)

    def poll(self, job_id: int) -> ProcessStatus:
        job = find_job(self.jobs, job_id)
        returncode = job.proc.poll()
        if returncode is not None and job.pump is not None:
            job.pump.join(timeout=DRAIN_GRACE_S)  # the terminal's last output, before reporting the exit
        output, truncated = read_capped_file(job.log, self.cap)
        return ProcessStatus(process_id=job_id, command=job.command, running=returncode is None,
                             exit_code=None if returncode is None else shell_exit_code(returncode),
                             output=output, truncated=truncated)

    def kill(self, job_id: int) -> ProcessStatus:
        job = find_job(self.jobs, job_id)
        kill_process_group(job.proc.pid, job.proc)
        return self.poll(job_id)

    def statuses(self) -> list[ProcessStatus]:
        return [self.poll(job_id) for job_id in sorted(self.jobs)]

    def interrupt(self) -> None:
        """Kill the `exec` commands running now (their calls return as killed); background jobs stay."""
        with self._lock:
            running = list(self._running)
        stop_groups(running)

    def kill_all(self, wait_s: float = 10.0) -> None:
        """Refuse new commands; kill running `exec` commands (waiting until they have returned),
        every background command, and whatever `exec` commands left running (`exec_groups`)."""
        with self._lock:
            self.closed = True
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                running, inflight = list(self._running), self._inflight
            stop_groups(running)
            if not inflight or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        for job in self.jobs.values():
            kill_process_group(job.proc.pid, job.proc)
            if job.stdin is not None:
                _close_quietly(job.stdin)
        for pgid in self.exec_groups:
            if group_alive(pgid):
                kill_process_group(pgid)


def _close_quietly(stream: BinaryIO) -> None:
    try:
        stream.close()
    except OSError:  # a pipe whose reader is gone
        pass


class BackgroundJobsMixin:
    """`poll`, `kill`, `processes` and stdin of a sandbox whose background commands are `self.jobs`, and
    its idempotent `close`: every process of the session is killed before `_release` frees the rest."""

    jobs: BackgroundJobs
    _closed: bool

    def poll(self, process_id: int) -> ProcessStatus:
        return self.jobs.poll(process_id)

    def kill(self, process_id: int) -> ProcessStatus:
        return self.jobs.kill(process_id)

    def processes(self) -> list[ProcessStatus]:
        return self.jobs.statuses()

    def write_stdin(self, process_id: int, data: bytes) -> None:
        self.jobs.write_stdin(process_id, data)

    def close_stdin(self, process_id: int) -> None:
        self.jobs.close_stdin(process_id)

    def interrupt(self) -> bool:
        self.jobs.interrupt()
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.jobs.kill_all()
        self._release()

    def _release(self) -> None:
        """What the session holds besides its processes (folders, namespaces, cgroup)."""


def pin_namespace(argv: list[str], kind: str) -> int:
    """An fd that keeps a namespace alive without any process in it (closing it frees the namespace,
    and the kernel closes it when this process dies, so nothing outlives a crash).

    `argv` creates the namespace, prints the host pid of a process inside it once it is ready, then
    waits for its stdin to close."""
    try:
        helper = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
    except OSError as exc:
        raise SandboxError(f"could not create a {kind} namespace: {exc}") from exc
    assert helper.stdin is not None and helper.stdout is not None and helper.stderr is not None
    try:
        line = helper.stdout.readline()
        try:
            return os.open(f"/proc/{int(line)}/ns/{kind}", os.O_RDONLY)
        except (ValueError, OSError) as exc:
            helper.kill()
            detail = helper.stderr.read().decode(errors="replace").strip() or str(exc)
            raise SandboxError(f"could not create a {kind} namespace: {detail}") from exc
    finally:
        helper.stdin.close()
        helper.wait()
        helper.stdout.close()
        helper.stderr.close()
