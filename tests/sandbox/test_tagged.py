"""The kill order of tagged commands (docker, modal), on host processes: the in-sandbox script and the
host fallback each kill a hostile tree without letting any of its shells run on."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from hermes_core.sandbox.tagged import TAG_VAR, kill_argv, kill_tree, parent_pid, tag_marker
from procs import marker, processes_with, wait_until

# Shells that each write a file the moment their child dies; some rename themselves so that their
# /proc stat line holds ") S 1 " inside the name, where a naive parse finds a wrong parent.
HOSTILE_COMM = r"printf 'x) S 1 (' > /proc/self/comm 2>/dev/null;"


def hostile_tree(folder: Path, sleep: str) -> str:
    shells = " ".join(f"({HOSTILE_COMM if n % 2 else ''} sleep {sleep}; echo {n} > {folder}/after-{n}) &"
                      for n in range(12))
    return f"{shells} sleep {sleep}; echo x > {folder}/after-main"


def tagged_parents(tag: str) -> dict[int, int]:
    """pid -> parent pid of this host's live processes carrying `tag`."""
    found = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if tag_marker(tag).encode() not in handle.read().split(b"\0"):
                    continue
        except (OSError, ValueError):
            continue
        if (parent := parent_pid(int(entry))) is not None:
            found[int(entry)] = parent
    return found


@pytest.mark.parametrize("killer", ["script", "host"])
def test_a_hostile_tree_is_stopped_below_its_roots_then_killed_from_the_top(
        tmp_path: Path, killer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fast host no order loses the race; what must hold is the order itself: every process whose
    parent is tagged is stopped before anything is killed, the roots are killed (never stopped: their
    parent is the exec agent), then the stopped ones. Nothing is left and no shell wrote its file."""
    sleep, tag = marker(), f"t{os.getpid()}-{killer}"
    shell = subprocess.Popen(["sh", "-c", hostile_tree(tmp_path, sleep)], env={**os.environ, TAG_VAR: tag})
    calls: list[tuple[str, set[int]]] = []
    try:
        assert wait_until(lambda: len([p for p in processes_with(f"sleep {sleep}") if p.startswith("sleep")]) == 13)
        tree = tagged_parents(tag)
        if killer == "script":  # dash when present (the POSIX sh of slim images); each `kill` is logged
            log = tmp_path / "kills.log"
            logged = f'kill() {{ echo "$@" >> {log}; command kill "$@"; }}\n'
            argv = kill_argv(tag)
            argv[0], argv[2] = shutil.which("dash") or argv[0], logged + argv[2]
            assert subprocess.run(argv, timeout=30).returncode == 0
            for line in log.read_text().splitlines():
                signal_name, *pids = line.split()
                calls.append((signal_name.lstrip("-"), {int(pid) for pid in pids}))
        else:
            real_kill = os.kill

            def kill(pid: int, signal_number: int) -> None:
                calls.append((signal.Signals(signal_number).name.removeprefix("SIG"), {pid}))
                real_kill(pid, signal_number)

            monkeypatch.setattr(os, "kill", kill)
            while parents := tagged_parents(tag):
                kill_tree(parents)
            monkeypatch.undo()
        assert shell.wait(timeout=10) < 0  # killed, not exited
    finally:
        shell.kill()
    inner = set(tree) - {shell.pid}
    assert len(tree) == 26 and all(parent in tree for pid, parent in tree.items() if pid != shell.pid)
    stops = {pid for name, pids in calls if name == "STOP" for pid in pids}
    order = [name for name, pids in calls if pids & set(tree)]
    assert stops == inner and shell.pid not in stops
    first_kill = order.index("KILL")
    assert set(order[:first_kill]) == {"STOP"}  # every stop before the first kill
    killed = [pids for name, pids in calls if name == "KILL"]
    assert shell.pid in killed[0] and not killed[0] & inner  # the root first, alone
    assert wait_until(lambda: not processes_with(f"sleep {sleep}"), 5)
    assert sorted(path.name for path in tmp_path.glob("after-*")) == []


def test_a_parent_is_read_past_a_name_that_imitates_the_stat_line() -> None:
    child = subprocess.Popen(["sh", "-c", f"{HOSTILE_COMM} sleep 30; true"])
    try:
        assert wait_until(lambda: "x) S 1 (" in Path(f"/proc/{child.pid}/comm").read_text())
        assert parent_pid(child.pid) == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert parent_pid(child.pid) is None
