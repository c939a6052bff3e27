"""Finding processes on the host by command line (to prove sandboxes left nothing running), waiting,
and free ports."""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path
from typing import Callable


def marker() -> str:
    """A sleep duration no other process on the machine uses, to find leftovers by command line."""
    return f"{4000 + uuid.uuid4().int % 5000}.{uuid.uuid4().int % 1000:03d}"


def process_folders() -> list[Path]:
    """/proc/<pid> of every process now. Not `Path("/proc").glob("[0-9]*/cmdline")`: pathlib's glob
    raises ProcessLookupError for a process that exits while it looks."""
    return [Path("/proc") / name for name in os.listdir("/proc") if name.isdigit()]


def processes_with(text: str) -> list[str]:
    """Command lines of live (non-zombie) host processes that contain `text`."""
    found = []
    for cmdline in (folder / "cmdline" for folder in process_folders()):
        try:
            raw = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in raw and "State:\tZ" not in (cmdline.parent / "status").read_text():
                found.append(raw)
        except OSError:
            continue
    return found


def host_uid_of(command: str) -> int | None:
    """The host uid of the live process whose command line is `command` (arguments space-separated)."""
    for cmdline in (folder / "cmdline" for folder in process_folders()):
        try:
            if cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace").strip() == command:
                status = (cmdline.parent / "status").read_text()
                return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        except OSError:
            continue
    return None


def ignoring(signals: str, argv: list[str]) -> list[str]:
    """`argv` started with `signals` (e.g. "INT TERM") ignored, as a script's background job starts."""
    return ["bash", "-c", f'trap "" {signals}; exec "$@"', "bash", *argv]


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (free to bind, or closed to connect to)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def open_fds() -> int:
    """How many file descriptors this process holds."""
    return len(os.listdir("/proc/self/fd"))


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `predicate` until it holds or `timeout` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


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


def sandbox_sessions(ancestor: int) -> list[int]:
    """Host pids of the live sandbox sessions under process `ancestor`: each session's exec server is
    pid 1 of its own pid namespace (`local` backend), whether a slot's zygote or a bubblewrap made it."""
    parents, servers = {}, []
    for entry in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{entry}/status").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        if not status:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        parents[int(entry)] = int(fields.get("PPid", "0"))
        if fields.get("Name") == "exec-server" and fields.get("NSpid", "").split()[-1:] == ["1"] \
                and not fields.get("State", "").startswith("Z"):
            servers.append(int(entry))

    def under(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == ancestor:
                return True
        return False

    return [pid for pid in servers if under(pid)]
