"""Issue 28, finding 3: clean-up of what sandboxes wrote removes any tree (1,200 folders deep, locked
by a command, with links and mounts) without crashing, and what it cannot remove is reported once
and skipped, so closing a sandbox and reaping a state root never fail because of it."""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from hermes_core.sandbox import SandboxBackend, SandboxSettings
from hermes_core.sandbox.bubblewrap import BubblewrapBackend, session_leftovers
from hermes_core.sandbox.local import PlainBackend
from hermes_core.sandbox.output import HOST_FULL_NOTE, LOG_FULL_NOTE
from mounts import tmpfs
from procs import marker, open_fds, processes_with, wait_until
from hermes_core.sandbox.trees import remove_tree
from leftover_trees import (BUILD_COMMAND, DEPTH, dead_owner_session, deep_tree, immutable,  # noqa: F401
                            no_deep_tree_left)  # (fixture)

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="chattr, mount and a drop to uid 65534 need root"),
              pytest.mark.usefixtures("no_deep_tree_left")]
NOBODY = 65534
BACKENDS: dict[str, Callable[[SandboxSettings], SandboxBackend]] = {"local": BubblewrapBackend, "plain": PlainBackend}


def as_nobody(func: Callable[[], int], max_fds: int) -> str:
    """`func()` run in a forked child as uid and gid 65534 with at most `max_fds` open files; what it
    returned (or raised), as text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only fd 3 (the pipe) stays open above stdio
        code = 1
        try:
            os.dup2(write, 3)
            os.closerange(4, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_fds, max_fds))
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(3, str(func()).encode())
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            os.write(3, f"{type(exc).__name__}: {exc}"[:1000].encode())
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said = answer.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.fixture
def nobodys_folder() -> Iterator[Path]:
    """A folder of uid 65534 that it can reach (the test's tmp_path is root's own)."""
    folder = Path(tempfile.mkdtemp(prefix="hermes-cleanup-"))
    os.chown(folder, NOBODY, NOBODY)
    yield folder
    remove_tree(folder)


def test_a_deep_locked_tree_is_removed_by_its_owner_with_few_file_descriptors(nobodys_folder: Path) -> None:
    """shutil.rmtree recursed once per level: RecursionError at 1,000 (not an OSError), and it kept
    one file descriptor open per level. Here the owner is not root, so the folders the command made
    mode 000 and read-only must be opened up to be emptied; a link out of the tree is not followed."""
    tree, outside = nobodys_folder / "tree", nobodys_folder / "outside"

    def build_and_remove() -> int:
        deep_tree(tree)
        outside.mkdir()
        (outside / "kept").write_text("x")
        (tree / "link").symlink_to(outside)
        return remove_tree(tree)

    assert as_nobody(build_and_remove, max_fds=12) == "0"
    assert not tree.exists() and (outside / "kept").read_text() == "x"


@pytest.fixture
def bind_mount(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """mount(point): a folder with a file `kept` bind-mounted on `point` until the end of the test."""
    mounted: list[Path] = []

    def mount(point: Path) -> Path:
        source = tmp_path / f"source{len(mounted)}"
        source.mkdir()
        (source / "kept").write_text("x")
        point.mkdir(parents=True)
        subprocess.run(["mount", "--bind", str(source), str(point)], check=True)
        mounted.append(point)
        return source

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=True)


def test_what_cannot_be_removed_is_reported_once_and_the_rest_goes(tmp_path: Path, bind_mount, caplog) -> None:
    tree = deep_tree(tmp_path / "tree")
    source = bind_mount(tree / "a" / "mnt")  # a mount is never entered: its files are not the tree's
    (tree / "b").mkdir()
    with immutable(tree / "b" / "stuck"), caplog.at_level(logging.WARNING):
        assert remove_tree(tree) == 2
    assert sorted(str(path.relative_to(tree)) for path in tree.rglob("*")) == ["a", "a/mnt", "a/mnt/kept", "b",
                                                                               "b/stuck"]
    assert (source / "kept").read_text() == "x"
    warnings = [record.getMessage() for record in caplog.records if record.name == "hermes_core.sandbox.trees"]
    assert len(warnings) == 1 and warnings[0].startswith(f"could not remove all of {tree}: 2 entries stayed")


def test_a_file_a_link_or_nothing(tmp_path: Path) -> None:
    target = deep_tree(tmp_path / "target", depth=3)
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "file").write_text("x")
    assert remove_tree(tmp_path / "link") == 0 and remove_tree(tmp_path / "file") == 0
    assert remove_tree(tmp_path / "missing") == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["target"] and (target / "ro" / "in" / "f").exists()


def leftovers(backend: SandboxBackend) -> list[str]:
    if isinstance(backend, BubblewrapBackend):
        return session_leftovers(backend.state_root)
    return [str(path) for path in backend.state_root.iterdir()]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_session_id_cannot_pass_a_live_session_off_as_a_dead_ones(tmp_path: Path, name: str) -> None:
    """An API client names its session, and a state folder's name says its owner (`-o<pid>.<start>-`):
    ids that end like a dead owner's folder or reach for other folders still give folders in the state
    root named for this process, which a reap keeps while their sessions live."""
    settings = SandboxSettings(state_root=tmp_path / "state")
    backend = PlainBackend(settings) if name == "plain" else BubblewrapBackend(settings, hierarchy=None)
    boxes = [backend.open(session_id) for session_id in ("x-o1.1-dead", "../../up-o1.1-abc", "a/b-o2.0-1.state")]
    try:
        for box in boxes:
            box.spawn("true")  # a session of a slot's zygote makes its folder at its first background command
        folders = sorted(path for path in settings.state_root.iterdir())
        assert len(folders) == (6 if name == "plain" else 3)  # the plain backend: a workdir beside each
        assert all(f"-o{os.getpid()}." in path.name for path in folders)
        assert backend.reap() == 0 and sorted(settings.state_root.iterdir()) == folders
        assert [box.exec("echo alive").output for box in boxes] == ["alive\n"] * 3
    finally:
        for box in boxes:
            box.close()
    assert leftovers(backend) == []


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_closing_a_sandbox_removes_the_deep_locked_folder_its_command_made(tmp_path: Path, name: str) -> None:
    """The finding: the step failed in close() and the folder stayed in the shared state root."""
    with BACKENDS[name](SandboxSettings(state_root=tmp_path / "state")) as backend:
        box = backend.open("deep")
        done = box.exec(BUILD_COMMAND, timeout=60)
        assert done.exit_code == 0 and "built" in done.output
        assert box.exec("find . -name bottom 2>/dev/null | tr -cd / | wc -c").output.strip() == str(DEPTH + 1)
        box.close()
    assert leftovers(backend) == []


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_reaping_removes_dead_sessions_and_skips_what_stays(tmp_path: Path, name: str, caplog) -> None:
    """A later run reaps the shared state root at start: a dead session's deep and locked folders go;
    a file that cannot be removed is reported, its folder skipped (tried again by the next reap)."""
    state_root, plain = tmp_path / "state", name == "plain"
    gone = dead_owner_session(state_root, "gone-1", plain)
    stuck = dead_owner_session(state_root, "stuck-1", plain)
    settings = SandboxSettings(state_root=state_root)
    # Without cgroups: reap() would also count the dead slots of other runs on this machine.
    backend = PlainBackend(settings) if plain else BubblewrapBackend(settings, hierarchy=None)
    with immutable(stuck / "stuck"), caplog.at_level(logging.WARNING):
        assert backend.reap() == 1
        assert backend.reap() == 0  # the next run's reap: no exception either
        assert not gone.exists() and sorted(path.name for path in stuck.iterdir()) == ["stuck"]
    warnings = [record.getMessage() for record in caplog.records if record.name == "hermes_core.sandbox.trees"]
    assert warnings and all(f"could not remove all of {stuck}: 1 entry stayed" in w for w in warnings)
    # The folder's name says its owner is dead, and it stays: the next reap tries again (and says so again).
    assert len(warnings) == 2


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_models_background_output_stays_within_the_disk_quota_on_the_host(tmp_path: Path, name: str) -> None:
    """A background command's output is logged on the host; `yes` there wrote 2.7 GB in 2 s. The logs of
    a session's background commands now share its disk quota: past it nothing more is read, the command
    waits on its output (it is not killed) and says so; closing ends it and leaves no fd, thread or file."""
    settings = SandboxSettings(state_root=tmp_path / "state", disk_mb=4)
    backend = PlainBackend(settings) if name == "plain" else BubblewrapBackend(settings, hierarchy=None)
    fds, threads = open_fds(), threading.active_count()
    box = backend.open("flood")
    flooding = f"yes flood-{marker()}"  # its own: the other worker may run a flood too
    flood = box.spawn(flooding)
    late = box.spawn("sleep 1; echo late")
    assert wait_until(lambda: "reached its limit" in box.poll(flood).output)
    time.sleep(1.5)  # the late one's output comes after the budget is spent
    on_host = sum(path.stat().st_size for path in settings.state_root.rglob("*") if path.is_file())
    assert on_host <= (4 << 20) + 2 * len(LOG_FULL_NOTE), on_host
    assert box.poll(flood).running and "reached its limit" in box.poll(late).output
    box.close()
    backend.close()
    assert wait_until(lambda: open_fds() == fds and threading.active_count() == threads), (fds, open_fds())
    assert not processes_with(flooding) and list(settings.state_root.iterdir()) == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 40 MiB file system of its own (a tmpfs), unmounted at the end of the test."""
    with tmpfs(tmp_path / "small", 40) as point:
        yield point


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_many_sessions_within_their_quotas_never_fill_the_hosts_disk(small_disk: Path, name: str) -> None:
    """Each session's quota (here 64 MB, above the disk's 40) does not bound a run's sessions together:
    1,024 of them at the default 1 GiB could fill a host's disk, or its memory with /tmp on a tmpfs.
    The logs stop once the file system is down to its reserve (a tenth of it here), and each command
    then waits on its output and says why; closing leaves no fd, thread or file."""
    settings = SandboxSettings(state_root=small_disk / "state", disk_mb=64)
    backend = PlainBackend(settings) if name == "plain" else BubblewrapBackend(settings, hierarchy=None)
    fds, threads = open_fds(), threading.active_count()
    boxes = [backend.open(f"flood{i}") for i in range(3)]
    flooding = f"yes flood-{marker()}"  # its own: the other worker may run a flood too
    try:
        floods = [(box, box.spawn(flooding)) for box in boxes]
        assert wait_until(lambda: all("nearly full" in box.poll(job).output for box, job in floods), timeout=30)
        disk = os.statvfs(small_disk)
        reserve, free = disk.f_blocks * disk.f_frsize // 10, disk.f_bavail * disk.f_frsize
        assert free >= reserve - len(floods) * (65536 + len(HOST_FULL_NOTE)), (free, reserve)
        assert all(box.poll(job).running for box, job in floods)  # waiting on their output, not killed
    finally:
        for box in boxes:
            box.close()
        backend.close()
    assert wait_until(lambda: open_fds() == fds and threading.active_count() == threads), (fds, open_fds())
    assert not processes_with(flooding) and list(settings.state_root.iterdir()) == []
