"""The parent side of a slot's zygote (zygote.c): one bubblewrap per `local` sandbox slot, started at
the slot's first session, that makes every later session of the slot with a fork and a few mounts.

A session gets what a bubblewrap of its own gave it: fresh mount, pid, ipc, uts and cgroup namespaces,
a root rebuilt from the host's read-only system folders, its own /proc, /dev, /tmp and working
directory (one size-capped tmpfs), a user namespace of its own mapped 1:1 onto the slot's unprivileged
ids, no capabilities. Its control socket is an exec server's (exec_server.py) once ready. Closing that
socket ends its pid 1 and with it, by the kernel, every process of the session; the zygote then says
'E', the proof that the slot is empty and may take the next session.

Everything here comes from our own zygote, but it runs beside the sessions: an answer other than the
protocol's (or none in time) fails the slot, which is then destroyed rather than reused.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import subprocess
from array import array
from pathlib import Path
from typing import Callable

from hermes_core.sandbox.base import SandboxFailed
from hermes_core.sandbox.exec_server import KILL_TIMEOUT_S, START_TIMEOUT_S, kill_launched, start_server, start_turn

_REQUEST = struct.Struct("=QI")  # disk bytes, ids mapped; then the working directory, NUL-terminated
_CREDENTIALS = struct.Struct("=iII")  # struct ucred: the sender's pid as this process sees it, uid, gid
MAX_FAILURE_BYTES = 1024


class Zygote:
    """A slot's zygote: `open` a session, `wait_ended` after closing it, `stop` with the slot."""

    def __init__(self, argv: Callable[[int, int], list[str]], binary: Path, log_dir: Path, env: dict[str, str],
                 pass_fds: tuple[int, ...]) -> None:
        log = log_dir / f".zygote-{secrets.token_hex(4)}.log"  # its own: slots start at once
        try:
            self._ctl, self.proc = start_server(argv, binary, log_dir, env, pass_fds, log)
        finally:
            log.unlink(missing_ok=True)  # it says nothing once started
        self.pending = False  # a session was asked for and its end not seen yet

    def open(self, cwd: str, disk_bytes: int, ids: int) -> tuple[socket.socket, int]:
        """A new session in `cwd`: its exec server's control socket (ready) and its pid 1's host pid.
        Sessions start in turns like bubblewraps: a round of 1,024 sessions opening together on 2 cores
        (their mounts and pivot_root queue in the kernel) left some past the start timeout."""
        with start_turn():
            return self._open(cwd, disk_bytes, ids)

    def _open(self, cwd: str, disk_bytes: int, ids: int) -> tuple[socket.socket, int]:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the kernel tells who answers, in our pids
        try:
            self._ctl.sendmsg([_REQUEST.pack(disk_bytes, ids) + cwd.encode("utf-8", "surrogateescape") + b"\0"],
                              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", [theirs.fileno()]))])
            self.pending = True
        except OSError as exc:
            mine.close()
            raise SandboxFailed(f"could not start the sandbox: its slot's zygote is gone ({exc})") from exc
        finally:
            theirs.close()
        mine.settimeout(START_TIMEOUT_S)
        try:
            answer, ancillary, _, _ = mine.recvmsg(MAX_FAILURE_BYTES, socket.CMSG_SPACE(_CREDENTIALS.size))
        except OSError:  # a timeout too
            answer, ancillary = b"", []
        pids = [_CREDENTIALS.unpack(data[:_CREDENTIALS.size])[0] for level, kind, data in ancillary
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS]
        if answer == b"R" and pids and pids[0] > 0:
            mine.settimeout(None)
            return mine, pids[0]
        mine.close()
        why = answer[1:].decode(errors="replace") if answer.startswith(b"F") else \
            f"its session was not ready within {START_TIMEOUT_S:.0f} s"
        raise SandboxFailed(f"could not start the sandbox: {why}")

    def wait_ended(self, timeout: float = KILL_TIMEOUT_S) -> bool:
        """Whether the session asked for last has ended (every process of it gone) within `timeout`."""
        if not self.pending:
            return True
        self._ctl.settimeout(timeout)
        try:
            ended = self._ctl.recv(1) == b"E"
        except OSError:
            ended = False
        self.pending = not ended
        return ended

    def hang_up(self) -> None:
        """Tell the zygote to end (`stop` waits for it)."""
        self._ctl.close()

    def stop(self) -> None:
        """End the zygote, and with it (pid 1 of the slot's bubblewrap) everything it made."""
        self.hang_up()
        try:
            self.proc.wait(timeout=KILL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_launched(self.proc)


def joined_argv(launcher: Path, procs_files: list[Path], pidfd: int, cwd: str, argv: list[str]) -> list[str]:
    """What runs `argv` inside the session whose pid 1 `pidfd` refers to (a background command), from
    the host: in the slot's cgroup, the session's namespaces, a pid namespace of its own, no capabilities."""
    cgroups = [item for path in procs_files for item in ("--cgroup", str(path))]
    return [str(launcher), "--join", *cgroups, str(pidfd), cwd, "--", *argv]


def session_pidfd(pid: int) -> int:
    """A pidfd of the session's pid 1 (the target of `joined_argv`), taken while it is known alive."""
    try:
        return os.pidfd_open(pid)
    except OSError as exc:
        raise SandboxFailed(f"the sandbox's session is gone ({exc})") from exc
