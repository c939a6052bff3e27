"""The process toolkit shared by the plain and the bubblewrap backends: commands in their own process
group with a sanitized environment, capped output and a timeout that kills the whole group, /proc
checks of whether a process (group) is still alive, state folders whose names tell the reaper whether
a session's creator is gone, and pinned namespaces. Background jobs are in jobs.py."""

from __future__ import annotations

import concurrent.futures
import ctypes
import fcntl
import functools
import os
import re
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from hermes_core.sandbox.base import DEFAULT_OUTPUT_CAP_BYTES, ExecResult, SandboxError
from hermes_core.sandbox.output import STRAGGLER_NOTE, CappedBuffer

KILL_GRACE_S = 1.0  # between SIGTERM and SIGKILL of a process group
DRAIN_GRACE_S = 0.5  # how long leftover children may hold the output open after the shell exited
STALE_STATE_S = 60.0  # a state folder whose name says no owner is only reaped after this long
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SHELL = shutil.which("bash") or shutil.which("sh") or "/bin/sh"


_forker: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None
_forker_lock = threading.Lock()


def popen_lasting(argv: list[str], **options) -> subprocess.Popen:
    """`subprocess.Popen` for a process that must outlive the calling thread (a session's exec server,
    a background job). Linux sends a parent-death signal (bubblewrap's --die-with-parent, the
    launcher's PR_SET_PDEATHSIG) when the *thread* that forked the child exits, not the process: a
    sandbox started from a short-lived thread (`asyncio.run`'s executor, a one-off pool) died with it.
    Such processes are forked by the main thread, or by one thread that lives as long as the process."""
    global _forker
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(argv, **options)
    with _forker_lock:
        if _forker is None or _forker[0] != os.getpid():  # a forked child has no copy of the thread
            _forker = (os.getpid(), concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hermes-forker"))
        forker = _forker[1]
    return forker.submit(subprocess.Popen, argv, **options).result()


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
        if signalled:
            time.sleep(0.05)


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


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the name (state, ppid, ...; a name may hold spaces and
    parentheses, so it is cut at the last ")"), None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start_time(pid: int) -> str | None:
    """Kernel start time of `pid`, to tell the owner apart from a later process reusing its pid."""
    fields = stat_fields(pid)
    return fields[19].decode() if fields and len(fields) > 19 else None


def owner_alive(pid: int | str, start: str | None) -> bool:
    """Whether process `pid` still runs and is the one that started at `start` (its kernel start time;
    None, "" or "0" when it was not known), not a later process reusing its pid."""
    pid = int(pid)
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    return start in (None, "", "0") or process_start_time(pid) in (None, start)


def owner_tag(separator: str) -> str:
    """This process as the owner of what it names (`<pid><separator><start time>`, 0 when unknown), so a
    reused pid does not count: a state folder's name (`owned_folder`) and a slot's cgroup's."""
    pid = os.getpid()
    return f"{pid}{separator}{_own_start_time(pid) or 0}"


@functools.lru_cache(maxsize=4)
def _own_start_time(pid: int) -> str | None:  # keyed by pid: a forked worker has its own
    return process_start_time(pid)


def owned_folder(parent: Path, session_id: str, suffix: str = "") -> Path:
    """A new private folder in `parent` for a session's state, named for the session (folder-name-safe,
    bounded) and its owner (`owner_tag`) for `orphaned`. No owner file: creating an inode is the costly
    part of a session's host files where the file system is ext4 without a journal, which skips every
    inode deleted in the last minutes to find a free one (at 1,024 sessions, ~1 ms of kernel time each)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", session_id)[:48] or "session"
    return Path(tempfile.mkdtemp(prefix=f"{name}-o{owner_tag('.')}-", suffix=suffix, dir=parent))


class StateFolder:
    """A session's `owned_folder`, made at its first use: a session of a slot's zygote needs one only
    for background logs, and most start none (one host inode less per sample, ~0.4 ms of kernel time
    at 1,024 sessions on ext4 without a journal)."""

    def __init__(self, parent: Path, session_id: str) -> None:
        self._parent, self._session_id = parent, session_id
        self._path: Path | None = None
        self._removed = False
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        """The folder, made now if need be; refused once removed (its session is closed)."""
        with self._lock:
            if self._removed:
                raise SandboxError(f"sandbox {self._session_id!r} is closed")
            if self._path is None:
                self._path = owned_folder(self._parent, self._session_id)
            return self._path

    def take(self) -> Path | None:
        """The folder if it was made, for its owner to remove: no later use makes it again."""
        with self._lock:
            self._removed = True
            return self._path


_OWNED = re.compile(r"-o(\d+)\.(\d+)-[a-z0-9_]+(?:\.[a-z]+)?$")  # what owned_folder names


def orphaned(state_dir: Path) -> bool:
    """Whether a session state folder belongs to a dead process (and so may be reaped); one whose name
    says no owner only once it is stale."""
    if match := _OWNED.search(state_dir.name):
        return not owner_alive(match[1], match[2])
    try:
        return time.time() - state_dir.stat().st_mtime >= STALE_STATE_S
    except OSError:
        return False


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


_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sh22x"  # struct ifreq: the interface name, then its flags (40 bytes on Linux)


def loopback_namespace(bwrap: str) -> int:
    """An fd that pins a new network namespace whose only interface, loopback, is up (`pin_namespace`).

    As root, a thread of its own makes it (unshare is per thread, and that thread ends in it, so no
    other thread ever runs there): ~0.9 ms of CPU against ~4 ms for a bubblewrap and a shell that
    do the same, and the same namespace (owned by the host's user namespace, as bubblewrap run by
    root makes it). Otherwise bubblewrap makes it, in a user namespace of its own."""
    if os.geteuid() != 0:
        return pin_namespace([bwrap, "--unshare-net", "--die-with-parent", "--cap-drop", "ALL", "--ro-bind", "/",
                              "/", "--", "/bin/sh", "-c", "echo $$; read x"], "net")  # bwrap brings loopback up
    made: list[int | OSError] = []

    def make() -> None:
        try:
            if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET) != 0:
                number = ctypes.get_errno()
                raise OSError(number, os.strerror(number))
            fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:  # a socket of the new namespace
                    flags = struct.unpack(_IFREQ, fcntl.ioctl(control, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0)))[1]
                    fcntl.ioctl(control, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))
            except OSError:
                os.close(fd)
                raise
            made.append(fd)
        except OSError as exc:
            made.append(exc)

    thread = threading.Thread(target=make, name="hermes-netns")
    thread.start()
    thread.join()
    if isinstance(made[0], OSError):
        raise SandboxError(f"could not create a net namespace: {made[0]}")
    return made[0]
