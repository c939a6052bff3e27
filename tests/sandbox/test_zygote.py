"""A slot's zygote (hermes_core/sandbox/zygote.py + zygote.c): as root, the sessions of a `local` slot
are made by one long-lived bubblewrap instead of one each. The next session of a slot must see
nothing of the previous one: files, processes, IPC objects, sockets, keys."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Iterator

import pytest

from hermes_core.sandbox import SandboxSettings
from hermes_core.sandbox.base import SandboxFailed
from hermes_core.sandbox.bubblewrap import BubblewrapBackend, session_leftovers
from hermes_core.sandbox.cgroups import detect
from hermes_core.sandbox.exec_server import server_binary
from procs import marker, open_fds, processes_with, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or server_binary() is None or detect() is None,
                                reason="the zygote serves root's sandboxes, with a C compiler and cgroups")

# The user keyring of the session's root: a key added there outlived the processes that added it.
KEYS = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL, SEARCH, USER_KEYRING = 248, 250, 10, -4
if sys.argv[1] == "add":
    print(libc.syscall(ADD_KEY, b"user", b"hermes-key", b"secret", 6, USER_KEYRING) > 0)
else:
    print(libc.syscall(KEYCTL, SEARCH, USER_KEYRING, b"user", b"hermes-key", 0) > 0)
"""
# A server on an abstract unix socket (the network namespace is the slot's, reused session after session).
LISTEN = "import socket, time; s = socket.socket(socket.AF_UNIX); s.bind('\\0{name}'); s.listen(); time.sleep(600)"
CONNECT = "import socket; s = socket.socket(socket.AF_UNIX)\ntry:\n s.connect('\\0{name}'); print('connected')\n" \
          "except OSError as e:\n print('refused')"


@pytest.fixture
def local(tmp_path: Path) -> Iterator[BubblewrapBackend]:
    settings = SandboxSettings(state_root=tmp_path / "state")
    with BubblewrapBackend(settings) as backend:
        yield backend
    assert session_leftovers(settings.state_root) == []


def test_the_next_session_of_a_slot_sees_nothing_of_the_previous_one(local: BubblewrapBackend) -> None:
    tag, name = marker(), f"hermes-{marker()}"
    first = local.open("first")
    first.write_file("keys.py", KEYS.encode())
    out = first.exec("echo secret > /tmp/t; echo secret > w; echo secret > /dev/shm/s; ipcmk -M 4096; "
                     "python3 keys.py add").output
    assert "True" in out and "Shared memory id" in out
    first.spawn(f"setsid sleep {tag} & (sleep {tag} &); exec python3 -c \"{LISTEN.format(name=name)}\"")
    first.write_file("connect.py", CONNECT.format(name=name).encode())
    assert wait_until(lambda: first.exec("python3 connect.py").output == "connected\n", timeout=10)
    slot, zygote = first._slot, first._slot.zygote
    assert zygote is not None and processes_with(f"sleep {tag}")
    first.close()
    assert not processes_with(f"sleep {tag}")  # every process of the session ended with it
    with local.open("second") as second:
        assert second._slot is slot and slot.zygote is zygote  # the same slot, made by the same zygote
        second.write_file("keys.py", KEYS.encode())
        second.write_file("connect.py", CONNECT.format(name=name).encode())
        out = second.exec("cat /tmp/t w /dev/shm/s 2>&1 | grep -c 'No such file'; ipcs -m | grep -c '^0x'; "
                          "python3 keys.py find; python3 connect.py; ls /tmp /dev/shm").output
        assert out.split() == ["3", "0", "False", "refused", "/dev/shm:", "/tmp:"], out
        seen = second.exec("ps -e -o args=").output
        assert tag not in seen and "python3" not in seen and len(seen.splitlines()) == 3, seen  # pid 1, supervisor, ps


def test_a_session_that_cannot_be_built_fails_alone_and_the_slot_goes_on(local: BubblewrapBackend) -> None:
    box = local.open("long", cwd="/" + "a" * 300)  # no folder may have a name this long
    with pytest.raises(SandboxFailed, match="could not start the sandbox: mkdir /newroot/aaa.*File name too long"):
        box.exec("true")
    slot = box._slot
    box.close()
    with local.open("next") as following:
        assert following._slot is slot and following.exec("echo fine").output == "fine\n"


def test_a_session_whose_pid_1_dies_frees_its_slot_for_the_next(local: BubblewrapBackend) -> None:
    tag = marker()
    box = local.open("killed")
    box.spawn(f"sleep {tag}")
    assert wait_until(lambda: processes_with(f"sleep {tag}"))
    os.kill(box._session_pid, signal.SIGKILL)  # the kernel ends every process of its pid namespace
    with pytest.raises(SandboxFailed, match="the sandbox failed"):
        box.exec("true")
    assert wait_until(lambda: not processes_with(f"sleep {tag}"), timeout=5)
    box.close()
    with local.open("next") as following:
        assert tag not in following.exec("ps -e -o args=").output


def test_hostile_sessions_one_after_another_leave_nothing_behind(local: BubblewrapBackend) -> None:
    """Twenty sessions of one slot, each killing every process it can reach, leaving daemons and a
    background job, filling /tmp: afterwards the orchestrator holds the same fds and threads, the slot's
    cgroup holds only its zygote's processes, and no state folder or process of a session is left."""
    tag = marker()
    with local.open("warm") as warm:
        warm.exec("true")
    slot = warm._slot
    assert slot.zygote is not None and slot.cgroup is not None
    fds, threads, members = open_fds(), threading.active_count(), slot.cgroup.pids()
    for number in range(20):
        with local.open(f"hostile-{number}") as box:
            out = box.exec(f"(setsid sleep {tag} &); sleep {tag} & head -c 1000000 /dev/zero > /tmp/f; "
                           "ls /proc | grep -c '^[0-9]'").output
            assert box._slot is slot and int(out.split()[-1]) < 10, out  # only this session's few processes
            box.spawn(f"sleep {tag}")
            with pytest.raises(SandboxFailed, match="stopped while running a command"):
                box.exec("kill -9 -1")  # kills its own supervisor too: this sample's sandbox fails, clearly
    assert wait_until(lambda: not processes_with(f"sleep {tag}"), timeout=5)
    assert wait_until(lambda: open_fds() == fds and threading.active_count() == threads, timeout=5), (
        fds, open_fds(), threads, [thread.name for thread in threading.enumerate()])  # what a rare CI failure left
    assert slot.cgroup.pids() == members  # the zygote, its bubblewrap and launcher: nothing of a session
    assert sorted(local.state_root.iterdir()) == []


def test_slots_made_ahead_serve_the_first_sessions(local: BubblewrapBackend) -> None:
    """`prepare(n)` makes n slots with their zygotes in the background, so that a run's first sessions
    do not each pay a new slot: the sessions then take those, and no slot more is made."""
    local.prepare(3)
    assert wait_until(lambda: len(local._slots._idle) == 3, timeout=10)
    made = {id(slot): slot.zygote for slot in local._slots._idle}
    assert all(zygote is not None for zygote in made.values())
    boxes = [local.open(f"early-{number}") for number in range(3)]
    try:
        assert {id(box._slot) for box in boxes} == set(made)
        assert all(box._slot.zygote is made[id(box._slot)] for box in boxes)  # started ahead, used as they were
        boxes[0].exec("echo mine > /tmp/t")
        assert [box.exec("cat /tmp/t 2>&1").output for box in boxes[1:]] == ["cat: /tmp/t: No such file or directory\n"] * 2
    finally:
        for box in boxes:
            box.close()
    local.prepare(3)  # once per backend: already made
    assert local._slots._made == 3


def test_closing_while_slots_are_made_ahead_leaves_nothing(local: BubblewrapBackend) -> None:
    local.prepare(50)
    assert wait_until(lambda: local._slots._idle, timeout=10)
    local.close()  # waits for the slot in making; the fixture checks that no cgroup, mount or folder is left
    assert not local._slots._idle and local._slots._warming is None
    with local.open("after") as box:  # the backend is usable again
        assert box.exec("echo fine").output == "fine\n"


def test_a_hostile_session_cannot_reach_the_slots_made_ahead_for_others(local: BubblewrapBackend) -> None:
    """A session on a slot made ahead that kills every process it can reach and leaves daemons: the
    zygotes made ahead for the other sessions live on and serve them, nothing of it reaches them, and
    once the backend is closed the orchestrator holds the fds and threads it held before."""
    tag = marker()
    fds, threads = open_fds(), threading.active_count()
    local.prepare(3)
    assert wait_until(lambda: len(local._slots._idle) == 3, timeout=10)
    others = {id(slot): slot.zygote for slot in local._slots._idle}
    with local.open("hostile") as box:
        others.pop(id(box._slot))
        box.spawn(f"setsid sleep {tag}")
        with pytest.raises(SandboxFailed, match="stopped while running a command"):
            box.exec(f"(setsid sleep {tag} &); kill -9 -1")
    assert all(zygote.proc.poll() is None for zygote in others.values())
    for number in range(2):
        with local.open(f"next-{number}") as following:
            assert following.exec("echo fine").output == "fine\n"
            assert tag not in following.exec("ps -e -o args=").output
    local.close()
    assert wait_until(lambda: not processes_with(f"sleep {tag}"), timeout=5)
    assert wait_until(lambda: open_fds() == fds and threading.active_count() == threads, timeout=5)
