"""The sandboxes' cgroups: limits created and removed (v1, v2 on a real and a fake mount), and the spare
cgroups finished runs leave for later ones."""

from __future__ import annotations

import signal
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from hermes_core.sandbox import SandboxError, SandboxSettings
from hermes_core.sandbox.bubblewrap import BubblewrapBackend, session_leftovers
from hermes_core.sandbox import cgroups
from hermes_core.sandbox.cgroups import (Hierarchy, SessionCgroup, SparePool, detect, host_share, limit_host_share,
                                         retire, spare_names)
from cgroup_folders import own_cgroup_folders
from procs import marker, open_fds, processes_with, wait_until


def test_cgroup_limits_are_created_and_removed(tmp_path: Path) -> None:
    hierarchy = detect()
    if hierarchy is None:
        pytest.skip("no cgroup hierarchy with memory and pids controllers here")
    backend = BubblewrapBackend(SandboxSettings(state_root=tmp_path, memory_mb=300, pids=77, cpus=0.5))
    box = backend.open("limits")
    cgroup = box.cgroup
    assert cgroup is not None and set(cgroup.limited) >= {"memory", "pids"}
    files = {"memory.limit_in_bytes": 300 << 20, "pids.max": 77, "cpu.cfs_quota_us": 50000, "memory.max": 300 << 20}
    for folder in cgroup.dirs:
        for name, value in files.items():
            if (folder / name).exists():
                assert int((folder / name).read_text()) == value
    tag = marker()  # other tests on the other worker run sleeps too
    job = box.spawn(f"sleep {tag}")
    assert wait_until(lambda: box.jobs.jobs[job].proc.pid in cgroup.pids())  # the job's launcher joins it
    assert wait_until(lambda: len(cgroup.pids()) >= 3)  # bubblewrap, its pid 1 and the command
    box.close()
    left = cgroup.pids()  # emptied, kept for the next session: only the slot's zygote may stay there
    zygote = box._slot.zygote
    assert cgroup.exists() and (left == set() if zygote is None else zygote.proc.pid in left and len(left) == 3)
    assert not processes_with(f"sleep {tag}")
    backend.close()
    assert not cgroup.exists() and session_leftovers(tmp_path) == []


def test_cgroup_v2_on_a_real_cgroup2_mount(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup2"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "cgroup2", "none", str(mount)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a cgroup2 hierarchy here")
    try:
        backend = BubblewrapBackend(SandboxSettings(state_root=tmp_path / "state"), hierarchy=Hierarchy(2, {"": mount}))
        box = backend.open("v2")
        assert box.cgroup is not None and box.cgroup.dirs == [mount / "hermes-foundry" / box.cgroup.name]
        box.spawn(f"sleep {marker()}")
        assert box.exec("echo in v2").output == "in v2\n"
        assert wait_until(lambda: len(box.cgroup.pids()) >= 3)
        lonely = SessionCgroup.create(Hierarchy(2, {"": mount}), "kill-test", 64, 16, 1.0)
        sleeper = subprocess.Popen([*lonely.enter_argv(), "sleep", "100"])
        assert wait_until(lambda: sleeper.pid in lonely.pids())
        assert lonely.kill_all() and sleeper.wait(5) == -signal.SIGKILL and lonely.remove()
        box.close()
        backend.close()
        assert not box.cgroup.exists() and session_leftovers(tmp_path / "state", Hierarchy(2, {"": mount})) == []
    finally:
        try:
            (mount / "hermes-foundry").rmdir()
        except OSError:
            pass  # another run's sessions may still be there
        subprocess.run(["umount", str(mount)], check=True)


def test_cgroup_limit_files_on_a_fake_sysfs(tmp_path: Path) -> None:
    # The controllers are bound to v1 on this machine, so v2's limit files are checked on a fake tree.
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (v2 / "cgroup.subtree_control").write_text("")
    cgroup = SessionCgroup.create(Hierarchy(2, {"": v2}), "s1", 256, 64, 1.5)
    assert cgroup.limited == ("cpu", "memory", "pids")
    assert (v2 / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (v2 / "hermes-foundry" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    folder = v2 / "hermes-foundry" / "s1"
    assert {name: (folder / name).read_text() for name in ("memory.max", "pids.max", "cpu.max")} == {
        "memory.max": str(256 << 20), "pids.max": "64", "cpu.max": "150000 100000"}
    assert cgroup.enter_argv()[2] == f'echo $$ > {folder}/cgroup.procs && exec "$@"'
    v1 = {name: tmp_path / "v1" / name for name in ("memory", "pids", "cpu,cpuacct")}
    (v1["memory"] / "hermes-foundry" / "s2").mkdir(parents=True)
    (v1["memory"] / "hermes-foundry" / "s2" / "memory.memsw.limit_in_bytes").write_text("")
    hierarchy = Hierarchy(1, {"memory": v1["memory"], "pids": v1["pids"], "cpu": v1["cpu,cpuacct"]})
    SessionCgroup.create(hierarchy, "s2", 100, 10, 2)
    written = {path.relative_to(tmp_path / "v1").as_posix(): path.read_text() for path in (tmp_path / "v1").rglob("*.*")
               if path.is_file()}
    assert written == {"memory/hermes-foundry/s2/memory.limit_in_bytes": str(100 << 20),
                       "memory/hermes-foundry/s2/memory.memsw.limit_in_bytes": str(100 << 20),
                       "pids/hermes-foundry/s2/pids.max": "10", "cpu,cpuacct/hermes-foundry/s2/cpu.cfs_period_us": "100000",
                       "cpu,cpuacct/hermes-foundry/s2/cpu.cfs_quota_us": "200000"}
    limit_host_share(Hierarchy(2, {"": v2}), 4 << 30, 5000)  # all sessions of the host together
    assert {name: (v2 / "hermes-foundry" / name).read_text() for name in ("memory.max", "pids.max")} == {
        "memory.max": str(4 << 30), "pids.max": "5000"}
    limit_host_share(hierarchy, 4 << 30, 5000)
    assert [(v1["memory"] / "hermes-foundry" / name).read_text() for name in ("memory.limit_in_bytes", "pids.max")
            if (v1["memory"] / "hermes-foundry" / name).exists()] == [str(4 << 30)]
    assert (v1["pids"] / "hermes-foundry" / "pids.max").read_text() == "5000"
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {v2} cgroup2 rw 0 0\n")
    assert detect(mounts) == Hierarchy(2, {"": v2})
    mounts.write_text("cgroup /a cgroup rw,memory 0 0\ncgroup /b cgroup rw,pids 0 0\ncgroup /c cgroup rw,cpu,cpuacct 0 0\n"
                      "cgroup2 /u cgroup2 rw 0 0\n")
    assert detect(mounts) == Hierarchy(1, {"memory": Path("/a"), "pids": Path("/b"), "cpu": Path("/c")})
    mounts.write_text("proc /proc proc rw 0 0\n")
    assert detect(mounts) is None


@pytest.fixture
def own_hierarchy() -> Iterator[Hierarchy]:
    """The host's hierarchy in folders of this test's own (cgroup_folders.py)."""
    host = detect()
    if host is None:
        pytest.skip("no cgroup hierarchy with memory and pids controllers here")
    with own_cgroup_folders(host) as hierarchy:
        yield hierarchy


def _share_parent(hierarchy: Hierarchy, controller: str) -> Path:
    return hierarchy.mounts.get(controller, hierarchy.mounts.get("")) / "hermes-foundry"


def test_the_sandboxes_of_a_host_together_stay_within_its_process_share(tmp_path: Path,
                                                                        own_hierarchy: Hierarchy) -> None:
    """A session's limits bound one sample, not a run: 8 sessions each starting 600 processes took 4,104
    of this host's 32,768 process ids, so 64 would have taken all of them, and no process or thread
    could start then, the orchestrator's included. The parent of every session's cgroup now holds them
    to a share of the host: here 300 processes, where the sessions' own limits (512 each) add up to 1,536."""
    assert host_share()[1] == min(int(Path(f"/proc/sys/kernel/{name}").read_text())
                                  for name in ("pid_max", "threads-max")) // 2  # the default: half of it
    fds, threads = open_fds(), threading.active_count()
    backend = BubblewrapBackend(SandboxSettings(state_root=tmp_path, host_pids=300), hierarchy=own_hierarchy)
    parent, tag = _share_parent(own_hierarchy, "pids"), marker()
    boxes = [backend.open(f"greedy{i}") for i in range(3)]
    try:
        for box in boxes:  # each session's sandbox is up before the others fill the share
            assert box.exec("echo ready").output == "ready\n"
        assert (parent / "pids.max").read_text().strip() == "300"
        for box in boxes:
            box.spawn(f"for i in $(seq 600); do sleep {tag} & done 2>/dev/null; wait")
        assert wait_until(lambda: int((parent / "pids.current").read_text()) >= 290, timeout=30)
        assert len(processes_with(f"sleep {tag}")) <= 300  # 1,800 asked for
        assert subprocess.run(["true"]).returncode == 0  # this process (the orchestrator) starts processes as ever
    finally:
        for box in boxes:
            box.close()
        backend.close()
    assert not processes_with(f"sleep {tag}") and session_leftovers(tmp_path, own_hierarchy) == []
    assert wait_until(lambda: open_fds() == fds and threading.active_count() == threads), (fds, open_fds())


def test_the_sandboxes_of_a_host_together_stay_within_its_memory_share(tmp_path: Path,
                                                                       own_hierarchy: Hierarchy) -> None:
    """Likewise for memory: 12 sessions at 2 GiB each were this host's 24 GiB, and a session's files
    are memory too (a tmpfs). Here the share is 256 MiB and three sessions each write 150 MiB of files."""
    fds, threads = open_fds(), threading.active_count()
    backend = BubblewrapBackend(SandboxSettings(state_root=tmp_path, host_memory_mb=256), hierarchy=own_hierarchy)
    memory = _share_parent(own_hierarchy, "memory")
    limit = memory / ("memory.limit_in_bytes" if own_hierarchy.version == 1 else "memory.max")
    used = memory / ("memory.usage_in_bytes" if own_hierarchy.version == 1 else "memory.current")
    boxes = [backend.open(f"greedy{i}") for i in range(3)]
    written, peak = [], 0
    try:
        for box in boxes:
            try:
                written.append(box.exec("head -c 150M /dev/zero > fill && echo written").output)
            except SandboxError as exc:  # its exec server was the process the kernel stopped
                written.append(str(exc))
            peak = max(peak, int(used.read_text()))
        assert written.count("written\n") < 3, written
        assert int(limit.read_text()) == 256 << 20 and peak <= 256 << 20
        assert subprocess.run(["true"]).returncode == 0
    finally:
        for box in boxes:
            box.close()
        backend.close()
    assert session_leftovers(tmp_path, own_hierarchy) == []
    assert wait_until(lambda: open_fds() == fds and threading.active_count() == threads), (fds, open_fds())


def test_finished_runs_leave_spare_cgroups_that_later_runs_adopt(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Removing a used memory cgroup leaves it dying in the kernel; hundreds of those slowed every
    sandbox command 4x. Runs hand their emptied cgroups on instead, with the new run's limits."""
    hierarchy = detect()
    if hierarchy is None:
        pytest.skip("no cgroup hierarchy with memory and pids controllers here")

    def run(pids: int) -> set[int]:
        """Four sessions at once; returns the pids limits their cgroups had."""
        with BubblewrapBackend(SandboxSettings(state_root=tmp_path / "state", pids=pids)) as backend:
            boxes = [backend.open(f"s{i}") for i in range(4)]
            for box in boxes:
                assert box.exec("echo hi > f; cat f").output == "hi\n"
            limits = {int((folder / "pids.max").read_text()) for box in boxes for folder in box.cgroup.dirs
                      if (folder / "pids.max").exists()}
            for box in boxes:
                box.close()
        return limits

    run(pids=64)
    assert len(spare_names(hierarchy)) >= 4
    created = []  # counted in this process: other tests may make cgroups at the same time (pytest-xdist)
    make = SessionCgroup.create
    monkeypatch.setattr(SessionCgroup, "create", classmethod(lambda cls, *a, **k: created.append(a) or make(*a, **k)))
    assert run(pids=77) == {77} and run(pids=78) == {78}  # each run's own limits on adopted cgroups
    assert created == []  # adopted, not created: nothing new lingers
    assert session_leftovers(tmp_path / "state") == []


def test_a_reap_after_a_crash_counts_the_spares_with_one_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed with 1,024 sessions leaves 1,024 slot cgroups to the next run's reap: each became
    a spare after a listing of every session cgroup of its own, 2.5 s before that run began. What a
    hostile sample left running in one (a daemon that outlived its run) ends with the reap."""
    hierarchy = detect()
    if hierarchy is None:
        pytest.skip("no cgroup hierarchy with memory and pids controllers here")
    gone = subprocess.Popen(["true"])
    gone.wait()  # a dead owner
    tag = uuid.uuid4().hex[:8]
    left = [SessionCgroup.create(hierarchy, f"o{gone.pid}-0-{tag}-reap{i}", 64, 32, 0) for i in range(3)]
    fds, stay = open_fds(), marker()
    daemon = subprocess.Popen(left[1].enter_argv() + ["sleep", stay], start_new_session=True)
    # Once it is `sleep`, the shell before it joined every hierarchy (its command line has the marker too).
    assert wait_until(lambda: Path(f"/proc/{daemon.pid}/cmdline").read_bytes().startswith(b"sleep"))
    listings: list[int] = []
    real = cgroups.spare_names
    monkeypatch.setattr(cgroups, "spare_names", lambda h: listings.append(1) or real(h))
    monkeypatch.setattr(cgroups, "SPARE_PREFIX", prefix := f"spare-t{uuid.uuid4().hex[:8]}-")
    try:
        assert BubblewrapBackend(SandboxSettings(state_root=tmp_path / "state"), hierarchy=hierarchy).reap() >= 3
        assert listings == [1] and not any(cgroup.exists() for cgroup in left)
        assert daemon.wait(timeout=10) == -signal.SIGKILL and processes_with(f"sleep {stay}") == []
        assert open_fds() == fds
    finally:
        daemon.kill()
        for name in {name for name in cgroups.session_names(hierarchy) if name.startswith(prefix) or tag in name}:
            SessionCgroup(hierarchy, name).remove()


def test_slots_take_and_retire_spares_from_one_listing_and_skip_the_ones_taken_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Listing the spares scans every session cgroup (~2–5 ms at 1,000 spares): a backend lists them once,
    to take them and to count them when its slots retire (each session that finds no job left retires
    the idle ones). A spare another process renamed after that listing is skipped, not an error."""
    hierarchy = detect()
    if hierarchy is None:
        pytest.skip("no cgroup hierarchy with memory and pids controllers here")
    mine = sorted(SessionCgroup.create(hierarchy, f"spare-test{uuid.uuid4().hex[:12]}", 64, 32, 0).name
                  for _ in range(3))
    listings: list[int] = []

    def listing(_: Hierarchy) -> list[str]:  # other runs' real spares stay out of this test
        listings.append(1)
        return list(mine)

    monkeypatch.setattr(cgroups, "spare_names", listing)
    # Spares made here get a name of their own: a run on the other test worker retires its slots too.
    monkeypatch.setattr(cgroups, "SPARE_PREFIX", prefix := f"spare-t{uuid.uuid4().hex[:8]}-")
    pool = SparePool(hierarchy)
    first = pool.adopt(f"test-{uuid.uuid4().hex[:8]}", 64, 32, 0)
    taken = SessionCgroup(hierarchy, mine[1]).rename(f"test-{uuid.uuid4().hex[:8]}")  # by "another process"
    second = pool.adopt(f"test-{uuid.uuid4().hex[:8]}", 64, 32, 0)
    assert first is not None and second is not None and first.exists() and second.exists()
    assert pool.adopt("test-none", 64, 32, 0) is None and listings == [1]  # used up, listed once
    assert not any(SessionCgroup(hierarchy, name).exists() for name in mine)  # each taken exactly once
    before = cgroups.session_names(hierarchy)
    pool.retire([first, second])  # counted from the pool's own view: no listing
    new = cgroups.session_names(hierarchy) - before
    assert listings == [1] and len({name for name in new if name.startswith(prefix)}) == 2
    again = pool.adopt(f"test-{uuid.uuid4().hex[:8]}", 64, 32, 0)  # a spare it retired, without listing
    assert again is not None and again.exists() and listings == [1]
    before = cgroups.session_names(hierarchy)
    assert len(retire([again, taken])) == 2  # alone, one listing counts the spares; both kept
    new = cgroups.session_names(hierarchy) - before
    assert len(listings) == 2 and len({name for name in new if name.startswith(prefix)}) == 2
    assert not any(cgroup.exists() for cgroup in (first, second, taken, again))
    for name in {name for name in cgroups.session_names(hierarchy) if name.startswith(prefix)}:
        SessionCgroup(hierarchy, name).remove()
