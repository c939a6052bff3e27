"""The local backend: every session runs on the host, unisolated, in a private temporary folder.

Isolated backends (bubblewrap, containers) come later and reuse the process helpers here:
`run_command` (capped output, a timeout that kills the whole process group), `kill_process_group`,
`sanitized_env` and `shell_argv`; a subclass of `LocalSandbox` only has to wrap `_argv`.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hermes_core.sandbox.base import (DEFAULT_COMMAND_TIMEOUT_S, DEFAULT_OUTPUT_CAP_BYTES, ExecResult, ProcessStatus,
                                      Sandbox, SandboxBackend, SandboxError)

KILL_GRACE_S = 1.0  # between SIGTERM and SIGKILL of a process group
DRAIN_GRACE_S = 0.5  # how long leftover children may hold the output open after the shell exited
STALE_STATE_S = 60.0  # a session folder without an owner file is only reaped after this long
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SHELL = shutil.which("bash") or shutil.which("sh") or "/bin/sh"
NO_IMAGE_SUPPORT = "the local backend has no image support yet; configure a sandbox backend that runs images"
_STRAGGLER_NOTE = ("\n[note: processes left running in the background kept this command's output open and were "
                   "stopped when the command finished; start long-running commands as background processes]")


def shell_argv(command: str) -> list[str]:
    return [_SHELL, "-c", command]


def sanitized_env(home: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment: nothing of the host's (API keys, tokens) leaks into commands."""
    env = {"PATH": os.environ.get("PATH") or _DEFAULT_PATH, "HOME": home, "LANG": os.environ.get("LANG") or "C.UTF-8",
           "TERM": "dumb",  # no colours or pagers in captured output
           "PYTHONUNBUFFERED": "1"}  # so output written before a timeout kill is not lost
    return {**env, **(extra or {})}


def _join(head: bytes, tail: bytes, omitted: int) -> str:
    marker = f"\n...[output truncated: {omitted} bytes omitted]...\n"
    return head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


class _CappedBuffer:
    """Head and tail of a stream of unknown length, never holding more than `cap` bytes."""

    def __init__(self, cap: int) -> None:
        self.head_limit, self.tail_limit = cap // 2, cap - cap // 2
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = max(0, self.head_limit - len(self.head))
        self.head += chunk[:room]
        self.tail += chunk[room:]
        del self.tail[: max(0, len(self.tail) - self.tail_limit)]

    def render(self) -> tuple[str, bool]:
        omitted = self.total - len(self.head) - len(self.tail)
        if omitted <= 0:
            return bytes(self.head + self.tail).decode("utf-8", "replace"), False
        return _join(bytes(self.head), bytes(self.tail), omitted), True


def truncate_output(data: bytes, cap: int = DEFAULT_OUTPUT_CAP_BYTES) -> tuple[str, bool]:
    """Text of `data`, keeping its head and tail around a marker when it exceeds `cap` bytes."""
    buffer = _CappedBuffer(cap)
    buffer.add(data)
    return buffer.render()


def read_capped_file(path: Path, cap: int = DEFAULT_OUTPUT_CAP_BYTES) -> tuple[str, bool]:
    """Head and tail of a (possibly growing, possibly huge) log file without reading all of it."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size <= cap:
                return truncate_output(handle.read(), cap)
            head = handle.read(cap // 2)
            handle.seek(size - (cap - cap // 2))
            tail = handle.read(cap - cap // 2)
    except FileNotFoundError:
        return "", False
    return _join(head, tail, size - len(head) - len(tail)), True


def _group_alive(pgid: int) -> bool:
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
    if _signal_group(pgid, signal.SIGTERM):
        _signal_group(pgid, signal.SIGCONT)  # stopped processes only act on SIGTERM once resumed
        deadline = time.monotonic() + grace
        while _group_alive(pgid):
            if leader is not None:
                leader.poll()  # reap the leader: without /proc, its zombie would count as alive
            if time.monotonic() >= deadline:
                _signal_group(pgid, signal.SIGKILL)
                break
            time.sleep(0.05)
    if leader is not None:
        try:
            leader.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # shell convention for killed commands


def run_command(argv: list[str], cwd: str, env: dict[str, str], timeout: float,
                cap: int = DEFAULT_OUTPUT_CAP_BYTES) -> tuple[ExecResult, int]:
    """Run `argv` in a new process group with merged, capped output; returns the result and the pgid.

    Reading stops at EOF, at the timeout (the whole group is killed, `exit_code` None), or shortly
    after the shell exited while children still hold the pipe (those are killed too: they would
    otherwise block the caller until the timeout, or die of SIGPIPE later)."""
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        raise SandboxError(f"could not start command: {exc}") from exc
    pgid = proc.pid  # start_new_session makes the shell the leader of a fresh group
    buffer, deadline = _CappedBuffer(cap), time.monotonic() + timeout
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
    result = ExecResult(output=output + (_STRAGGLER_NOTE if stragglers else ""), truncated=truncated,
                        exit_code=None if timed_out else _exit_code(proc.returncode), timed_out=timed_out)
    return result, pgid


def _remove_tree(path: Path) -> None:
    def retry(func, target, _exc):  # type: ignore[no-untyped-def]
        try:  # a command may have made folders read-only
            os.chmod(os.path.dirname(target), 0o700)
            func(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


@dataclass
class _Background:
    command: str
    proc: subprocess.Popen
    log: Path


class LocalSandbox(Sandbox):
    """A session on the host: commands run in `workdir` (a private temporary folder) as this user."""

    def __init__(self, session_id: str, workdir: Path, state_dir: Path, cwd: str | None = None,
                 command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S, output_cap: int = DEFAULT_OUTPUT_CAP_BYTES) -> None:
        self.session_id, self.workdir, self.state_dir = session_id, workdir.resolve(), state_dir
        self.command_timeout, self.output_cap = command_timeout, output_cap
        # The dataset's cwd (often absolute, like "/app") becomes a folder inside the workdir.
        target = (self.workdir / (cwd or "").lstrip("/")).resolve()
        if not target.is_relative_to(self.workdir):
            raise SandboxError(f"cwd {cwd!r} escapes the sandbox working directory")
        target.mkdir(parents=True, exist_ok=True)
        self.cwd = str(target)
        self.env = sanitized_env(str(self.workdir))
        self._background: dict[int, _Background] = {}
        self._exec_groups: set[int] = set()  # groups of `exec` commands that left processes behind
        self._closed = False

    def _argv(self, command: str) -> list[str]:
        return shell_argv(command)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.session_id!r} is closed")
        Path(self.cwd).mkdir(parents=True, exist_ok=True)  # a command may have deleted it

    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        self._check_open()
        timeout = self.command_timeout if timeout is None else float(timeout)
        if timeout <= 0:
            raise SandboxError("timeout must be positive")
        result, pgid = run_command(self._argv(command), self.cwd, self.env, timeout, self.output_cap)
        if _group_alive(pgid):  # e.g. `server > log 2>&1 &` outlives the command; close() stops it
            self._exec_groups.add(pgid)
        return result

    def spawn(self, command: str) -> int:
        self._check_open()
        process_id = len(self._background) + 1  # small ids, easy for a model to quote
        log = self.state_dir / f"process-{process_id}.log"  # outside the workdir: commands can't clobber it
        with open(log, "wb") as out:
            try:
                proc = subprocess.Popen(self._argv(command), cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                raise SandboxError(f"could not start command: {exc}") from exc
        self._background[process_id] = _Background(command, proc, log)
        return process_id

    def _get(self, process_id: int) -> _Background:
        if process_id not in self._background:
            known = ", ".join(map(str, self._background)) or "none"
            raise SandboxError(f"no background process {process_id} (known: {known})")
        return self._background[process_id]

    def poll(self, process_id: int) -> ProcessStatus:
        background = self._get(process_id)
        returncode = background.proc.poll()
        output, truncated = read_capped_file(background.log, self.output_cap)
        return ProcessStatus(process_id=process_id, command=background.command, running=returncode is None,
                             exit_code=None if returncode is None else _exit_code(returncode),
                             output=output, truncated=truncated)

    def kill(self, process_id: int) -> ProcessStatus:
        background = self._get(process_id)
        kill_process_group(background.proc.pid, background.proc)
        return self.poll(process_id)

    def processes(self) -> list[ProcessStatus]:
        return [self.poll(process_id) for process_id in sorted(self._background)]

    def _resolve(self, path: str) -> Path:
        self._check_open()
        # resolve() follows symlinks, so a link inside the workdir can't lead a read or write outside.
        resolved = (Path(self.cwd) / path).resolve()
        if not resolved.is_relative_to(self.workdir):
            raise SandboxError(f"path {path!r} is outside the sandbox working directory {self.workdir}")
        if resolved.is_dir():
            raise SandboxError(f"{path!r} is a directory")
        return resolved

    def read_file(self, path: str) -> bytes:
        return self._resolve(path).read_bytes()

    def write_file(self, path: str, data: bytes) -> str:
        resolved = self._resolve(path)
        resolved.parent.mkdir(parents=True, exist_ok=True)
        resolved.write_bytes(data)
        return str(resolved)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for background in self._background.values():
            kill_process_group(background.proc.pid, background.proc)
        for pgid in self._exec_groups:
            if _group_alive(pgid):
                kill_process_group(pgid)
        _remove_tree(self.workdir)
        _remove_tree(self.state_dir)


def _start_time(pid: int) -> str | None:
    """Kernel start time of `pid`, to tell the owner apart from a later process reusing its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _owner_alive(owner: dict) -> bool:
    pid = int(owner["pid"])
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    return owner.get("start") is None or _start_time(pid) in (None, owner["start"])


class LocalBackend(SandboxBackend):
    """Sessions in `state_root/<session_id>-<random>`; their private state (owner pid, background
    logs) in the sibling folder `<session_id>-<random>.state`."""

    name = "local"

    def __init__(self, state_root: str | Path | None = None, command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S,
                 output_cap: int = DEFAULT_OUTPUT_CAP_BYTES) -> None:
        self.state_root = Path(state_root or Path(tempfile.gettempdir()) / "hermes-sandboxes")
        self.command_timeout, self.output_cap = command_timeout, output_cap

    def open(self, session_id: str, image: str | None = None, cwd: str | None = None) -> LocalSandbox:
        if image:
            raise SandboxError(f"image {image!r}: {NO_IMAGE_SUPPORT}")
        self.state_root.mkdir(parents=True, exist_ok=True)
        prefix = (re.sub(r"[^A-Za-z0-9_.-]+", "_", session_id)[:48] or "session") + "-"
        # The state folder (with the owner file) exists before the workdir, so reap() never finds
        # a workdir without an owner.
        state_dir = Path(tempfile.mkdtemp(prefix=prefix, suffix=".state", dir=self.state_root))
        owner = {"pid": os.getpid(), "start": _start_time(os.getpid()), "session_id": session_id}
        (state_dir / "owner.json").write_text(json.dumps(owner))
        workdir = state_dir.with_suffix("")
        workdir.mkdir(mode=0o700)
        try:
            return LocalSandbox(session_id, workdir, state_dir, cwd, self.command_timeout, self.output_cap)
        except BaseException:
            _remove_tree(workdir)
            _remove_tree(state_dir)
            raise

    def preflight(self, images: set[str]) -> list[str]:
        return [f"image {image!r}: {NO_IMAGE_SUPPORT}" for image in sorted(images)]

    def reap(self) -> int:
        removed = 0
        for state_dir in self.state_root.glob("*.state") if self.state_root.is_dir() else []:
            try:
                if _owner_alive(json.loads((state_dir / "owner.json").read_text())):
                    continue
            except (OSError, ValueError, TypeError, KeyError):
                try:  # no readable owner: maybe a session being created right now
                    if time.time() - state_dir.stat().st_mtime < STALE_STATE_S:
                        continue
                except OSError:
                    continue
            _remove_tree(state_dir.with_suffix(""))
            _remove_tree(state_dir)
            removed += 1
        return removed
