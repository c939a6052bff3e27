"""Capped command output, shared by every backend: the head and tail of a stream or log around a
truncation marker, and the note for commands whose background children kept their output open."""

from __future__ import annotations

import os
import select
import threading
from pathlib import Path

from hermes_core.sandbox.base import DEFAULT_OUTPUT_CAP_BYTES

STRAGGLER_NOTE = ("\n[note: processes left running in the background kept this command's output open and were "
                  "stopped when the command finished; start long-running commands as background processes]")


def join_head_tail(head: bytes, tail: bytes, omitted: int) -> str:
    """Text of `head` and `tail` around a marker saying how many bytes between them were left out."""
    marker = f"\n...[output truncated: {omitted} bytes omitted]...\n"
    return head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


class CappedBuffer:
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
        return join_head_tail(bytes(self.head), bytes(self.tail), omitted), True


def truncate_output(data: bytes, cap: int = DEFAULT_OUTPUT_CAP_BYTES) -> tuple[str, bool]:
    """Text of `data`, keeping its head and tail around a marker when it exceeds `cap` bytes."""
    buffer = CappedBuffer(cap)
    buffer.add(data)
    return buffer.render()


def log_text(data: bytes, size: int, cap: int) -> tuple[str, bool]:
    """Text of a log of `size` bytes, read whole when `size` is at most `cap`, else as its first
    cap // 2 and last cap - cap // 2 bytes (`data`, e.g. `head -c` then `tail -c`)."""
    if size <= cap:
        return truncate_output(data, cap)  # capped even if the log grew since its size was taken
    return join_head_tail(data[: cap // 2], data[cap // 2:], size - len(data)), True


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
    return join_head_tail(head, tail, size - len(head) - len(tail)), True


LOG_FULL_NOTE = (b"\n[hermes: this session's background output reached its limit (the sandbox's disk quota, "
                 b"HERMES_SANDBOX_DISK_MB); nothing more is read, so the command now waits on its output]\n")
HOST_FULL_NOTE = (b"\n[hermes: the host's disk that holds sandbox state is nearly full; nothing more of this output "
                  b"is read, so the command now waits on its output]\n")
HOST_RESERVE_FRACTION = 10  # 1/10 of the file system the logs are on stays free ...
HOST_RESERVE_MAX = 2 << 30  # ... or 2 GiB, whichever is less


class LogBudget:
    """What a session's background commands may still write to their logs on the host, together: the
    session's disk quota. Their output is a model's, so it must not fill the host's disk (`yes` wrote
    2.7 GB there in 2 s)."""

    def __init__(self, limit: int) -> None:
        self.left, self._lock = limit, threading.Lock()

    def take(self, wanted: int) -> int:
        """How many of `wanted` bytes may be written (all, some, or none once the budget is spent)."""
        with self._lock:
            granted = min(wanted, self.left)
            self.left -= granted
            return granted


def host_room(fd: int) -> int:
    """Bytes the file system of `fd` can still take before its free space falls below the reserve that
    sandbox logs never touch (HOST_RESERVE_*): a run's many sessions, each within its own quota,
    must not fill the host's disk (or, on a tmpfs /tmp, its memory) together."""
    fs = os.fstatvfs(fd)
    reserve = min(fs.f_blocks * fs.f_frsize // HOST_RESERVE_FRACTION, HOST_RESERVE_MAX)
    return fs.f_bavail * fs.f_frsize - reserve


def pump_to_log(fd: int, log: Path, budget: LogBudget) -> None:
    """Append what arrives on `fd` (a pipe, or a pseudo-terminal's master side) to `log` until every
    writer is gone, then close `fd`. Runs in its own thread. Past `budget`, or once the host's file
    system is down to its reserve, nothing more is read: the writers block on their output as on a
    full disk (no host disk, no CPU spent on them), and `fd` is held until they are gone, so none of
    them dies of a closed pipe."""
    with open(log, "ab", buffering=0) as out:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: every process holding the terminal is gone
                break
            if not chunk:
                break
            granted = budget.take(len(chunk))
            full = LOG_FULL_NOTE if granted < len(chunk) else None
            try:
                if host_room(out.fileno()) < granted:
                    granted, full = 0, HOST_FULL_NOTE
                out.write(chunk[:granted])
            except OSError:  # ENOSPC or a quota: full all the same
                full = HOST_FULL_NOTE
            if full:
                try:
                    out.write(full)
                except OSError:
                    pass  # no room even for the note: the log ends where it is
                _wait_for_hangup(fd)
                break
    os.close(fd)


def _wait_for_hangup(fd: int) -> None:
    """Block until every writer of `fd` is gone, reading nothing."""
    watch = select.poll()
    watch.register(fd, 0)  # no events asked for: only a hang-up or an error is reported
    while not any(events & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, events in watch.poll()):
        pass
