"""A session's background commands (`terminal(background=true)`) and its running `exec` commands, which
interrupt() and close() stop, for the backends whose commands are host processes (plain, bubblewrap,
singularity); BackgroundJobsMixin gives such a sandbox its process methods and its close."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from hermes_core.sandbox.base import ExecResult, ProcessStatus, SandboxError, find_job
from hermes_core.sandbox.output import LogBudget, pump_to_log, read_capped_file
from hermes_core.sandbox.processes import (DRAIN_GRACE_S, group_alive, kill_process_group, popen_lasting, run_command,
                                           shell_exit_code, stop_groups)


@dataclass
class _Job:
    command: str
    proc: subprocess.Popen
    log: Path
    stdin: BinaryIO | None  # the pipe to its stdin, or the master side of its pseudo-terminal
    pump: threading.Thread  # copies its output (a pipe or the terminal) into the log, within the budget
    pty: bool = False


class BackgroundJobs:
    """A session's background commands: each in its own process group, output to a log file kept
    outside the sandbox's files, numbered 1, 2, ... (small ids, easy for a model to quote)."""

    def __init__(self, log_dir: Callable[[], Path], cap: int, log_limit: int) -> None:
        self.log_dir, self.cap = log_dir, cap  # asked for (and made) at the first job: most sessions start none
        self.budget = LogBudget(log_limit)  # every job's log on the host, together
        self.jobs: dict[int, _Job] = {}
        self.exec_groups: set[int] = set()  # groups of `exec` commands that left processes behind
        self._lock = threading.Lock()  # a model may start several in parallel tool calls
        # Commands running right now, and whether the session is closing: close() may come from
        # another thread (a cancelled request) while an exec is starting, and must not miss it.
        self._running: set[int] = set()
        self._inflight = 0
        self._interrupts = 0  # interrupt() also stops the commands still starting when it came
        self.closed = False

    def run(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float, cap: int,
            pass_fds: tuple[int, ...] = ()) -> tuple[ExecResult, int]:
        """`run_command` for the session's `exec`: refused once closing; killed by `kill_all`."""
        with self._lock:
            if self.closed:
                raise SandboxError("the sandbox is closed")
            self._inflight += 1
            interrupts = self._interrupts
        pgid = None
        try:
            result, pgid = run_command(argv, cwd, env, timeout, cap, pass_fds,
                                       on_start=lambda started: self._started(started, interrupts))
        finally:
            with self._lock:
                self._inflight -= 1
                self._running.discard(pgid)
        if group_alive(pgid):  # e.g. `server > log 2>&1 &` outlives the command; close() stops it
            self.exec_groups.add(pgid)
        return result, pgid

    def _started(self, pgid: int, interrupts: int) -> None:
        with self._lock:
            self._running.add(pgid)
            stopping = self.closed or self._interrupts != interrupts
        if stopping:  # close() or interrupt() came while this command was starting
            stop_groups([pgid])

    def start(self, command: str, argv: list[str], cwd: str, env: dict[str, str],
              pass_fds: tuple[int, ...] = (), pty: bool = False) -> int:
        """Start a job whose stdin stays open for `write_stdin` (a pipe, or with `pty` a pseudo-terminal
        that is also its stdout and stderr, for programs that behave differently on a terminal)."""
        with self._lock:
            if self.closed:
                raise SandboxError("the sandbox is closed")
            job_id = len(self.jobs) + 1
            log_dir = self.log_dir()
            log_dir.mkdir(exist_ok=True)
            log = log_dir / f"process-{job_id}.log"
            log.write_bytes(b"")
            # Never the log file itself as its output: a pump keeps the log within the budget.
            master, slave = os.openpty() if pty else os.pipe()
            streams = dict(stdin=slave, stdout=slave, stderr=slave) if pty else dict(
                stdin=subprocess.PIPE, stdout=slave, stderr=subprocess.STDOUT)
            try:
                proc = popen_lasting(argv, cwd=cwd, env=env, start_new_session=True, pass_fds=pass_fds,
                                     **streams)  # type: ignore[call-overload]
            except OSError as exc:
                os.close(master)
                raise SandboxError(f"could not start command: {exc}") from exc
            finally:
                os.close(slave)
            # A terminal's input is its master side, opened before the pump may close `master`.
            writer = open(os.dup(master), "wb", buffering=0) if pty else proc.stdin
            pump = threading.Thread(target=pump_to_log, args=(master, log, self.budget), daemon=True)
            pump.start()
            self.jobs[job_id] = _Job(command, proc, log, writer, pump, pty)
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
        if job.pty:
            self.write_stdin(job_id, b"\x04")
        elif job.stdin is not None:
            _close_quietly(job.stdin)

    def poll(self, job_id: int) -> ProcessStatus:
        job = find_job(self.jobs, job_id)
        returncode = job.proc.poll()
        if returncode is not None:
            job.pump.join(timeout=DRAIN_GRACE_S)  # its last output, before reporting the exit
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
        """Kill the `exec` commands running or starting now (their calls return as killed); background jobs stay."""
        with self._lock:
            self._interrupts += 1
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
