"""Commands inside a docker sandbox: `docker exec` with a timeout, capped output and reliable kills.

The engine has no exec timeout and no way to kill an exec, so every exec is tagged
(`hermes_core.sandbox.tagged`): killing an exec means killing every process of the container that
carries its tag, from a second exec running as the same user.
"""

from __future__ import annotations

import os
import select
import struct
import time
import uuid
from dataclasses import dataclass

from docker import APIClient

from hermes_core.sandbox.output import CappedBuffer, log_text
from hermes_core.sandbox.processes import DRAIN_GRACE_S
from hermes_core.sandbox.tagged import kill_argv, kill_tree, parent_pid, tag_marker, tagged_env

INSPECT_EVERY_S = 0.1  # how often to ask the engine whether the command has exited
KILL_TIMEOUT_S = 10.0

# bash when the image has it (what models expect), else POSIX sh; stderr joins stdout in order.
RUN_SCRIPT = 'exec 2>&1; if [ -x /bin/bash ]; then exec /bin/bash -c "$1"; fi; exec /bin/sh -c "$1"'

# Background command: output to a log, exit code to a file once it ends (renamed: never read half-written).
SPAWN_SCRIPT = ('d=$1; n=$2; shift 2; "$@" > "$d/$n.log" 2>&1 < /dev/null; '
                'echo $? > "$d/$n.exit.tmp"; mv -f "$d/$n.exit.tmp" "$d/$n.exit"')
# Status line ("exit N" | "running" | "gone"), log size, then the log (head and tail only when too big).
# $4: the tag's marker (`tag_marker`).
POLL_SCRIPT = r"""
d=$1; n=$2; cap=$3; marker=$4
if [ -s "$d/$n.exit" ]; then echo "exit $(cat "$d/$n.exit")"
elif grep -qzxF -- "$marker" /proc/[0-9]*/environ 2>/dev/null; then echo running
elif [ -s "$d/$n.exit" ]; then echo "exit $(cat "$d/$n.exit")"
else echo gone; fi
size=$(wc -c < "$d/$n.log" 2>/dev/null || echo 0); echo "$size"
if [ "$size" -le "$cap" ]; then cat "$d/$n.log" 2>/dev/null
else head -c $((cap / 2)) "$d/$n.log"; tail -c $((cap - cap / 2)) "$d/$n.log"; fi
"""


def new_tag() -> str:
    return uuid.uuid4().hex[:16]


def user_argv(command: str) -> list[str]:
    return ["/bin/sh", "-c", RUN_SCRIPT, "sh", command]


@dataclass
class ExecOutcome:
    buffer: CappedBuffer
    exit_code: int | None  # None when the command timed out
    timed_out: bool
    stragglers: bool  # background children held the output open after the command exited


class _Frames:
    """Payloads of the engine's multiplexed stream: 8-byte headers (stream, 0, 0, 0, big-endian size)."""

    def __init__(self) -> None:
        self.pending = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self.pending += data
        payloads = []
        while len(self.pending) >= 8:
            size = struct.unpack(">I", self.pending[4:8])[0]
            if len(self.pending) < 8 + size:
                break
            payloads.append(bytes(self.pending[8:8 + size]))
            del self.pending[:8 + size]
        return payloads


def _running(api: APIClient, exec_id: str) -> tuple[bool, int | None]:
    info = api.exec_inspect(exec_id)
    return bool(info.get("Running")), info.get("ExitCode")


def _close(sock: object) -> None:
    for target in (getattr(sock, "_response", None), sock):
        try:
            target.close()  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - best effort: the connection is being abandoned
            pass


def run_exec(api: APIClient, container_id: str, argv: list[str], *, user: str, workdir: str | None,
             env: dict[str, str], tag: str, timeout: float, cap: int, kill_leftovers: bool = True) -> ExecOutcome:
    """Run `argv` tagged with `tag`; reading stops at EOF, at the timeout (every tagged process is
    killed) or shortly after the command exited while children still hold its output."""
    exec_id = api.exec_create(container_id, argv, stdout=True, stderr=True, user=user, workdir=workdir,
                              environment=tagged_env(tag, env))["Id"]
    sock = api.exec_start(exec_id, socket=True)
    buffer, frames = CappedBuffer(cap), _Frames()
    started = time.monotonic()
    deadline, drain_until, next_inspect = started + timeout, None, started + INSPECT_EVERY_S
    exit_code: int | None = None
    timed_out = stragglers = eof = False
    fileno = sock.fileno()
    try:
        while True:
            now = time.monotonic()
            if drain_until is None and now >= next_inspect:
                running, exit_code = _running(api, exec_id)
                # Quick at first (short commands with background children), then gentler on the engine.
                next_inspect = now + (INSPECT_EVERY_S if now - started < 5 else 5 * INSPECT_EVERY_S)
                if not running:
                    drain_until = min(deadline, now + DRAIN_GRACE_S)
            if now >= (deadline if drain_until is None else drain_until):
                timed_out, stragglers = drain_until is None, drain_until is not None
                break
            ready, _, _ = select.select([fileno], [], [], max(0.0, min(0.05, deadline - now)))
            if ready:
                try:
                    chunk = os.read(fileno, 65536)
                except BlockingIOError:  # the socket has a timeout, so it is non-blocking: spurious wake-up
                    continue
                if not chunk:
                    eof = True
                    break
                for payload in frames.feed(chunk):
                    buffer.add(payload)
    finally:
        _close(sock)
    if eof:  # the output is closed, but the command itself may still run (e.g. `exec >&-; sleep 9`)
        while True:
            running, exit_code = _running(api, exec_id)
            if not running:
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(0.05)
    if (timed_out or stragglers) and kill_leftovers:
        kill_tagged(api, container_id, tag, user)
    return ExecOutcome(buffer, None if timed_out else exit_code, timed_out, stragglers)


def start_detached(api: APIClient, container_id: str, argv: list[str], *, user: str, workdir: str | None,
                   env: dict[str, str], tag: str) -> None:
    """Start `argv` tagged with `tag` and return at once (background commands)."""
    exec_id = api.exec_create(container_id, argv, stdout=False, stderr=False, user=user, workdir=workdir,
                              environment=tagged_env(tag, env))["Id"]
    api.exec_start(exec_id, detach=True)


def kill_tagged(api: APIClient, container_id: str, tag: str, user: str) -> None:
    """SIGKILL every process of the container carrying `tag` (run as the commands' own user, which
    needs no capability). If the container cannot start even that exec (e.g. its pids limit is
    exhausted), fall back to killing from the host, where the engine runs on this machine."""
    try:
        outcome = run_exec(api, container_id, kill_argv(tag), user=user, workdir="/",
                           env={}, tag=new_tag(), timeout=KILL_TIMEOUT_S, cap=4096, kill_leftovers=False)
        if outcome.exit_code == 0:
            return
    except Exception:  # noqa: BLE001 - the fallback below covers every failure of the in-container kill
        pass
    _kill_tagged_from_host(api, container_id, tag)


def _kill_tagged_from_host(api: APIClient, container_id: str, tag: str) -> None:
    marker = tag_marker(tag).encode()
    for _ in range(20):
        try:
            top = api.top(container_id, ps_args="-eo pid")
            pids = [int(row[0]) for row in top.get("Processes") or []]
        except Exception:  # noqa: BLE001 - engine elsewhere or container gone: nothing more to do here
            return
        parents: dict[int, int] = {}
        for pid in pids:
            try:
                with open(f"/proc/{pid}/environ", "rb") as handle:
                    if marker not in handle.read().split(b"\0"):
                        continue
            except OSError:  # not on this machine, not ours to read, or already gone
                continue
            if (parent := parent_pid(pid)) is not None:
                parents[pid] = parent
        if not parents:
            return
        kill_tree(parents)


def parse_poll(raw: bytes, cap: int) -> tuple[bytes, str, bool] | None:
    """(status line, capped output, truncated) from POLL_SCRIPT's output; None when malformed."""
    status, size, payload = (raw.split(b"\n", 2) + [b"", b""])[:3]
    if not size.strip().isdigit():
        return None
    return status, *log_text(payload, int(size), cap)
