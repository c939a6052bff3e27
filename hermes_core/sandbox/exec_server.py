"""The parent side of a `local` sandbox's exec server (exec_server.c): one bubblewrap per session
instead of one per command.

The server is started at a session's first command, as pid 1 of a bubblewrap sandbox with exactly the
layout, namespaces, cgroup and dropped capabilities a per-command bubblewrap had. Each command is then
a message on a socket to it, carrying the command's own socket and its stdin, stdout and stderr; the
server forks a supervisor that runs the command and answers with its wait status. Output never passes
through the server: the command writes into pipes this process reads, capped as before.

Everything the sandbox sends is untrusted: a status is exactly 5 bytes, anything else (or silence
past the timeout, or an end of file) is a SandboxError, and a dead server fails the sandbox for good
(SandboxFailed): the server is then ended, and every process of the sandbox with it. A request the
server would refuse (over MAX_REQUEST) is refused here, so a long command cannot fail the sandbox.
Without a C compiler the backend keeps one bubblewrap per command.
"""

from __future__ import annotations

import hashlib
import os
import selectors
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import Callable

from hermes_core.config import usable_cores
from hermes_core.sandbox.base import SandboxError, SandboxFailed
from hermes_core.sandbox.processes import popen_lasting

SOURCES = [Path(__file__).with_name(name) for name in ("exec_server.c", "zygote.c")]
HEADER = Path(__file__).with_name("exec_server.h")
START_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 5.0  # from asking for a kill to the status: the supervisor only has to SIGKILL and reap
DRAIN_AFTER_EXIT_S = 0.5  # output still open after the status: someone escaped the supervisor
_STATUS = struct.Struct("=ci")
MAX_REQUEST = 8 << 20  # the server's own cap on a command's request (MAX_REQUEST in exec_server.c)
# Sandboxes starting at once per process (a bubblewrap, or a session of a slot's zygote): 1,024 sessions
# starting together on 2 cores would each take longer than START_TIMEOUT_S; in turns, each start takes
# milliseconds and the timeout means a fault.
STARTS_AT_ONCE = 4 * usable_cores()
_starting = threading.BoundedSemaphore(STARTS_AT_ONCE)
_build_lock = threading.Lock()
_built: dict[str, Path | None] = {}
_digest: str | None = None


def _reset_after_fork() -> None:
    global _starting
    _starting = threading.BoundedSemaphore(STARTS_AT_ONCE)  # a start in another thread never ends here


os.register_at_fork(after_in_child=_reset_after_fork)


def start_turn() -> threading.BoundedSemaphore:
    """One of this process's STARTS_AT_ONCE turns to start a sandbox: hold it (`with`) while starting."""
    return _starting


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hermes-foundry"


def server_binary() -> Path | None:
    """The compiled server (static, cached per source hash in a folder only this user may write:
    sandboxes run it), or None when there is no C compiler or it fails (one bubblewrap per command)."""
    global _digest
    with _build_lock:
        if _digest is None:  # the sources of this process's code (read once: every sandbox asks)
            _digest = hashlib.sha256(b"".join(path.read_bytes() for path in (*SOURCES, HEADER))).hexdigest()[:16]
        digest = _digest
        if digest in _built:
            return _built[digest]
        _built[digest] = _build(digest)
        return _built[digest]


def _build(digest: str) -> Path | None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    folder = _cache_dir()
    target = folder / f"exec-server-{digest}"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = folder.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            return None  # others could replace what runs in every sandbox
        if target.is_file():
            return target
        if compiler is None:
            return None
        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            built = Path(scratch) / "exec-server"
            done = subprocess.run([compiler, "-static", "-O2", "-Wall", "-o", str(built), *map(str, SOURCES)],
                                  capture_output=True, timeout=120)
            if done.returncode != 0:
                return None
            built.chmod(0o555)
            os.replace(built, target)  # atomic: another process may be building it too
        return target
    except (OSError, subprocess.SubprocessError):
        return None


def _request(argv: list[str], cwd: str, env: dict[str, str]) -> bytes:
    items = [cwd, *argv, *(f"{key}={value}" for key, value in env.items())]
    if any("\0" in item for item in items):
        raise SandboxError("commands, paths and environment values cannot contain NUL bytes")
    body = struct.pack("=II", len(argv), len(env)) + b"".join(item.encode("utf-8", "surrogateescape") + b"\0"
                                                              for item in items)
    if len(body) > MAX_REQUEST:
        raise SandboxError(f"the command is too long: {len(body):,} bytes with its environment, the most is "
                           f"{MAX_REQUEST >> 20} MiB; pass large data through a file")
    return struct.pack("=I", len(body)) + body


def start_server(argv: Callable[[int, int], list[str]], binary: Path, cwd: Path, env: dict[str, str],
                 pass_fds: tuple[int, ...], log_path: Path | None = None) -> tuple[socket.socket, subprocess.Popen]:
    """Start a process of `binary` (the launcher runs what `argv(ctl fd, exe fd)` says) and wait for its
    ready byte; its control socket and process, or SandboxFailed (a sandbox that cannot start is broken:
    its sample is never kept as data). Its stderr is `log_path` (default `cwd`/exec-server.log)."""
    with start_turn():
        return _start(argv, binary, cwd, env, pass_fds, log_path or cwd / "exec-server.log")


def _start(argv: Callable[[int, int], list[str]], binary: Path, cwd: Path, env: dict[str, str],
           pass_fds: tuple[int, ...], log_path: Path) -> tuple[socket.socket, subprocess.Popen]:
    ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    exe = os.open(binary, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with open(log_path, "wb") as log:
            proc = popen_lasting(argv(theirs.fileno(), exe), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=log, cwd=cwd, env=env, start_new_session=True,
                                 pass_fds=(theirs.fileno(), exe, *pass_fds))
    except OSError as exc:
        ctl.close()
        raise SandboxFailed(f"could not start bubblewrap: {exc}") from exc
    finally:
        theirs.close()
        os.close(exe)
    ctl.settimeout(START_TIMEOUT_S)
    try:
        ready = ctl.recv(1)
    except TimeoutError:
        ready = None
    except OSError:
        ready = b""
    if ready == b"R":
        return ctl, proc
    ctl.close()
    kill_launched(proc)  # not ready: nothing in it to wait for
    logged = log_path.read_text(errors="replace").strip()[-2000:]
    if ready is None:
        why = f"it was not ready within {START_TIMEOUT_S:.0f} s" + (f": {logged}" if logged else "")
    else:
        why = logged or f"it exited (status {proc.returncode}) before it was ready"
    raise SandboxFailed(f"could not start the sandbox: {why}")


def kill_launched(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of a launcher started by `start_server`, and reap it."""
    try:
        os.killpg(proc.pid, 9)
    except OSError:
        pass
    proc.wait()


class ExecServer:
    """One sandbox's server: started by `argv` (the launcher process it runs), or `attached` to one a
    zygote started; `call` runs a command through it, `stop` ends it and with it every process of the
    sandbox."""

    def __init__(self, argv: Callable[[int, int], list[str]], binary: Path, cwd: Path, env: dict[str, str],
                 pass_fds: tuple[int, ...]) -> None:
        self._setup()
        self._ctl, self.proc = start_server(argv, binary, cwd, env, pass_fds)

    @classmethod
    def attached(cls, ctl: socket.socket) -> "ExecServer":
        """The server on `ctl`, ready, started by a zygote (zygote.py): no process of ours to wait for."""
        server = cls.__new__(cls)
        server._setup()
        server._ctl, server.proc = ctl, None
        return server

    def _setup(self) -> None:
        self._lock = threading.RLock()  # _send fails the sandbox (and takes it again) while holding it
        self.failure: str | None = None
        self._interrupts = 0  # interrupt() calls so far: a command running across one is killed
        self._ctl: socket.socket | None = None
        self.proc: subprocess.Popen | None = None

    def _fail(self, why: str) -> SandboxFailed:
        """The sandbox is unusable from now on: every later command gets the same error. The server is
        ended (and with it, pid 1, everything in the sandbox), so no command waits on for nothing."""
        with self._lock:
            if self._ctl is None:
                return SandboxFailed("the sandbox was closed while the command ran")
            if self.failure is None:
                self.failure = f"the sandbox failed: its exec server {why}; the sample's sandbox has to be recreated"
                try:
                    self._ctl.shutdown(socket.SHUT_RDWR)  # its end of file; stop() still closes it
                except OSError:
                    pass  # already gone
            return SandboxFailed(self.failure)

    def _send(self, fds: list[int]) -> None:
        with self._lock:
            if self.failure:
                raise SandboxFailed(self.failure)
            if self._ctl is None:
                raise SandboxFailed("the sandbox is closed")
            try:
                self._ctl.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))])
            except OSError as exc:
                raise self._fail(f"is gone ({exc.strerror or exc})") from exc

    def call(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float, stdin: bytes | None,
             out: Callable[[bytes], None], err: Callable[[bytes], None] | None) -> int | None:
        """Run `argv`; its stdout goes to `out`, its stderr to `err` (None: to `out`, interleaved).
        Returns the raw wait status, or None when `timeout` passed and the command's tree was killed."""
        request = _request(argv, cwd, env)
        # Every fd is closed on every path (a failed sandbox refuses each call: leaked, they ran out)
        # and exactly once: a second close could hit a number another thread has just been given (a
        # concurrent command's pipe), which then fails with EBADF.
        readers: dict[int, Callable[[bytes], None]] = {}
        writer: list[int] = []  # stdin's write end: _follow closes it once all of stdin is written
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        given: list[int] = []  # the command's ends: closed here once the server has its copies
        try:
            try:
                out_r, out_w = os.pipe()
                readers[out_r], err_w = out, out_w
                given.append(out_w)
                if err:
                    err_r, err_w = os.pipe()
                    readers[err_r] = err
                    given.append(err_w)
                if stdin is None:
                    in_r = os.open(os.devnull, os.O_RDONLY)
                else:
                    in_r, in_w = os.pipe()
                    writer.append(in_w)
                given.append(in_r)
                self._send([theirs.fileno(), in_r, out_w, err_w])
            finally:
                theirs.close()
                for fd in given:
                    os.close(fd)
            return self._follow(mine, request, readers, writer, stdin or b"", timeout)
        finally:
            mine.close()
            for fd in [*readers, *writer]:
                os.close(fd)

    def _follow(self, mine: socket.socket, request: bytes, readers: dict[int, Callable[[bytes], None]],
                writer: list[int], data: bytes, timeout: float) -> int | None:
        in_w = writer[0] if writer else -1
        mine.settimeout(START_TIMEOUT_S)
        try:
            mine.sendall(request)
        except OSError as exc:
            raise self._fail(f"did not take the command ({exc})") from exc
        mine.setblocking(False)
        status, killed, drain_until = b"", False, None
        deadline, interrupts = time.monotonic() + timeout, self._interrupts
        with selectors.DefaultSelector() as selector:
            selector.register(mine, selectors.EVENT_READ)
            for fd in readers:
                selector.register(fd, selectors.EVENT_READ)
            if in_w >= 0:
                os.set_blocking(in_w, False)
                selector.register(in_w, selectors.EVENT_WRITE)
            while True:
                now = time.monotonic()
                if len(status) == _STATUS.size:
                    drain_until = drain_until or now + DRAIN_AFTER_EXIT_S
                    if not set(readers) & set(selector.get_map()) or now >= drain_until:
                        break
                elif (now >= deadline or self._interrupts != interrupts) and not killed:
                    killed, deadline = True, now + KILL_TIMEOUT_S
                    try:
                        mine.send(b"K")
                    except OSError:
                        pass  # the supervisor is gone: the end of file below says so
                elif now >= deadline:
                    raise self._fail(f"did not stop a command within {KILL_TIMEOUT_S:.0f} s of its timeout")
                wait = (drain_until if drain_until else deadline) - now
                for key, _ in selector.select(timeout=max(0.0, min(wait, 0.5))):
                    fd = key.fd
                    if fd == in_w:
                        try:
                            written = os.write(in_w, data[:65536])
                        except OSError:  # the command stopped reading
                            written, data = 0, b""
                        data = data[written:]
                        if not data:
                            selector.unregister(in_w)
                            os.close(writer.pop())
                            in_w = -1
                    elif key.fileobj is mine:
                        try:
                            chunk = mine.recv(_STATUS.size - len(status) + 1)
                        except OSError:  # reset: the other end is gone
                            chunk = b""
                        if not chunk:
                            selector.unregister(mine)
                            if len(status) < _STATUS.size:
                                raise self._fail("stopped while running a command (killed, or out of memory)")
                            continue
                        status += chunk
                        if len(status) > _STATUS.size or (len(status) == _STATUS.size and status[:1] != b"S"):
                            raise self._fail("sent a malformed answer")
                    else:
                        chunk = os.read(fd, 65536)
                        if chunk:
                            readers[fd](chunk)
                        else:
                            selector.unregister(fd)
        return None if killed else _STATUS.unpack(status)[1]

    def interrupt(self) -> None:
        """Kill the commands running now as their timeouts would (within one turn of `_follow`'s
        loop, at most 0.5 s); the server and its background processes stay."""
        with self._lock:
            self._interrupts += 1

    def alive(self) -> bool:
        return self.failure is None and self._ctl is not None and (self.proc is None or self.proc.poll() is None)

    def stop(self) -> None:
        """Close the control socket: the server, pid 1 of the sandbox, exits and the kernel ends every
        process of the sandbox. Idempotent."""
        with self._lock:
            ctl, self._ctl = self._ctl, None
        if ctl is not None:
            ctl.close()
        if self.proc is None:
            return  # a zygote's session: the zygote says when it has ended
        try:
            self.proc.wait(timeout=KILL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_launched(self.proc)
