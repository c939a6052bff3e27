"""Tagged commands, for backends that cannot signal a command's processes themselves (docker, modal).

Every command runs with `HERMES_EXEC=<tag>` in its environment, which every child inherits (also
double-forked, `setsid` ones). Stopping a command means killing every process of the sandbox whose
/proc/<pid>/environ holds the tag, from a second command in the same sandbox; the sandbox and its
other processes stay usable. `TaggedSandbox` holds what their sandboxes share. No SDK is imported here.
"""

from __future__ import annotations

import abc
import contextlib
import os
import posixpath
import signal
from collections.abc import Iterator
from typing import Any

from hermes_core.sandbox.base import ProcessStatus, Sandbox, SandboxError, find_job
from hermes_core.sandbox.processes import stat_fields

TAG_VAR = "HERMES_EXEC"

# Kill every process carrying the marker ($1); repeat until a scan finds none (children forked
# meanwhile). POSIX sh and grep, for images without bash; exits 1 if processes remain after every round.
# Killed one by one in /proc's order (by name: pid 10000 before 9999; and once pids wrap, a child's can
# be below its shell's), a shell whose child died first ran its next command (`sleep 9; echo done > f`
# wrote the file and returned 0 after an interrupt). So each round stops every process whose parent is
# tagged too, kills the others (the command's roots and orphans), then the stopped ones. The roots are
# never stopped: their parent is outside the command (an exec agent such as `nsenter`) and may be one
# that stops itself when its child stops, and stays stopped once the child is dead.
KILL_SCRIPT = r"""
marker=$1; round=0
while [ $round -lt 50 ]; do
  pids=
  for f in $(grep -lzxF -- "$marker" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; pids="$pids ${p%/environ}"
  done
  [ -n "$pids" ] || exit 0
  roots= inner=
  for p in $pids; do
    stat=; read -r stat 2>/dev/null < /proc/$p/stat
    set -- ${stat##*") "} -
    case " $pids " in
      *" $2 "*) inner="$inner $p" ;;
      *) roots="$roots $p" ;;
    esac
  done
  [ -z "$inner" ] || kill -STOP $inner 2>/dev/null
  [ -z "$roots" ] || kill -KILL $roots 2>/dev/null
  [ -z "$inner" ] || kill -KILL $inner 2>/dev/null
  round=$((round + 1))
done
exit 1
"""


def kill_tree(parents: dict[int, int]) -> None:
    """SIGKILL the processes of `parents` (pid -> parent pid) in KILL_SCRIPT's order, from the host:
    the ones whose parent is among them are stopped first, the others killed, then the stopped ones."""
    inner = [pid for pid, parent in parents.items() if parent in parents]
    for signal_number, pids in ((signal.SIGSTOP, inner), (signal.SIGKILL, [p for p in parents if p not in inner]),
                                (signal.SIGKILL, inner)):
        for pid in pids:
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours
                os.kill(pid, signal_number)


def parent_pid(pid: int) -> int | None:
    """The parent of `pid` from /proc (its name may hold spaces and parentheses), None once it is gone."""
    fields = stat_fields(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def tag_marker(tag: str) -> str:
    """The environment entry (`HERMES_EXEC=<tag>`) of a tagged command's processes."""
    return f"{TAG_VAR}={tag}"


def tagged_env(tag: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` for a command tagged with `tag`."""
    return {**(env or {}), TAG_VAR: tag}


def kill_argv(tag: str) -> list[str]:
    """The command that SIGKILLs every process tagged with `tag` (exit code 0 once none is left)."""
    return ["/bin/sh", "-c", KILL_SCRIPT, "sh", tag_marker(tag)]


class TaggedSandbox(Sandbox):
    """A session whose background commands are numbered in `jobs` and whose paths are POSIX paths
    inside the sandbox, resolved against `cwd`."""

    jobs: dict[int, Any]
    running: set[str]  # tags of the commands running now, for `interrupt`
    _closed: bool

    @abc.abstractmethod
    def _kill_tagged(self, tag: str) -> None:
        """SIGKILL every process of the sandbox carrying `tag`; raises SandboxError."""

    @contextlib.contextmanager
    def _foreground(self, tag: str) -> Iterator[None]:
        """While the command tagged `tag` runs, `interrupt` kills it."""
        self.running.add(tag)
        try:
            yield
        finally:
            self.running.discard(tag)

    def interrupt(self) -> bool:
        for tag in list(self.running):
            try:
                self._kill_tagged(tag)
            except SandboxError:
                pass  # that command runs on to its timeout
        return True

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.session_id!r} is closed")

    def _inside(self, path: str) -> str:
        self._check_open()
        return posixpath.normpath(posixpath.join(self.cwd, path))

    def _job(self, process_id: int) -> Any:
        self._check_open()
        return find_job(self.jobs, process_id)

    def processes(self) -> list[ProcessStatus]:
        return [self.poll(process_id) for process_id in sorted(self.jobs)]
