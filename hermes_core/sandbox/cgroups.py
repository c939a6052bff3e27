"""Per-session control groups: memory, process-count and CPU limits, and a reliable way to find and
kill every process of a session (however it forked, setsid'd or daemonized).

Both hierarchies are supported. cgroup v1: one `hermes-foundry/<session>` folder in each of the
memory, pids and cpu controller mounts. cgroup v2: one `hermes-foundry/<session>` folder, with the
controllers enabled in `cgroup.subtree_control` of its parents. Folders sit at the top of each
hierarchy (like docker's), not under this process's own cgroup: an outer manager's per-process
cgroup must stay removable even if a crash leaves a session's folder behind for the reaper.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PARENT = "hermes-foundry"
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


class CgroupError(OSError):
    """A session cgroup could not be set up (no cgroup support, or no permission)."""


@dataclass(frozen=True)
class Hierarchy:
    """Where session cgroups go: v1 maps each controller to its mount, v2 has one mount (key "")."""

    version: int
    mounts: dict[str, Path] = field(default_factory=dict)

    def parents(self) -> list[Path]:
        return sorted({mount / PARENT for mount in self.mounts.values()})


def _v2_controllers(mount: Path) -> set[str]:
    try:
        return set((mount / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def detect(mounts_file: str | Path = "/proc/self/mounts") -> Hierarchy | None:
    """The usable hierarchy: v2 when its mount offers the memory and pids controllers, else v1 when
    they are mounted there, else None (sandboxes then run without cgroup limits)."""
    try:
        lines = Path(mounts_file).read_text().splitlines()
    except OSError:
        return None
    v1: dict[str, Path] = {}
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        mount, kind, options = Path(parts[1].replace("\\040", " ")), parts[2], set(parts[3].split(","))
        if kind == "cgroup2" and {"memory", "pids"} <= _v2_controllers(mount):
            return Hierarchy(2, {"": mount})
        for controller in CONTROLLERS if kind == "cgroup" else ():
            if controller in options:
                v1.setdefault(controller, mount)
    if {"memory", "pids"} <= set(v1):
        return Hierarchy(1, v1)
    return None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _v2_parent(mount: Path) -> set[str]:
    """Make the v2 parent folder, its controllers enabled for it and for the sessions under it; the
    controllers session folders can use."""
    wanted = set(CONTROLLERS) & _v2_controllers(mount)
    parent = mount / PARENT
    parent.mkdir(exist_ok=True)
    # Controllers must be enabled on every level above the folder that uses them.
    for level in (mount, parent):
        enabled = set((level / "cgroup.subtree_control").read_text().split()) \
            if (level / "cgroup.subtree_control").exists() else set()
        if wanted - enabled:
            _write(level / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted - enabled)))
    return wanted


def host_share(memory_mb: int = 0, pids: int = 0) -> tuple[int, int]:
    """What every sandbox of this host may use together, in bytes and processes: `memory_mb` and `pids`,
    or where 0, half the host's memory and half its process ids (the lower of pid_max and threads-max,
    threads counting as processes)."""
    if memory_mb <= 0:
        total_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                        if line.startswith("MemTotal:"))
        memory_mb = total_kb // 1024 // 2
    if pids <= 0:
        pids = min(int(Path(f"/proc/sys/kernel/{name}").read_text()) for name in ("pid_max", "threads-max")) // 2
    return memory_mb << 20, pids


def limit_host_share(hierarchy: Hierarchy, memory_bytes: int, pids: int) -> None:
    """Cap the `hermes-foundry` parent of every session cgroup: each session's limits bound one sample,
    and 64 sessions at 512 processes each were the whole pid space of a host with pid_max 32768 (no
    thread or process could start then, the orchestrator's included), 12 at 2 GiB each its 24 GiB of
    memory. Shared by every run on the host: the last run to start sets it."""
    if hierarchy.version == 2:
        wanted, parent = _v2_parent(hierarchy.mounts[""]), hierarchy.mounts[""] / PARENT
        if "memory" in wanted:
            _write(parent / "memory.max", str(memory_bytes))
            if (parent / "memory.swap.max").exists():
                _write(parent / "memory.swap.max", "0")
        if "pids" in wanted:
            _write(parent / "pids.max", str(pids))
        return
    for controller, mount in hierarchy.mounts.items():
        parent = mount / PARENT
        parent.mkdir(exist_ok=True)
        if controller == "pids":
            _write(parent / "pids.max", str(pids))
        elif controller == "memory":
            limits = ["memory.limit_in_bytes"] + [name for name in ("memory.memsw.limit_in_bytes",)
                                                  if (parent / name).exists()]  # no swap accounting: none
            try:  # memory+swap may never be below memory alone: lowering goes memory first, raising the other way
                for name in limits:
                    _write(parent / name, str(memory_bytes))
            except OSError:
                for name in reversed(limits):
                    _write(parent / name, str(memory_bytes))


class SessionCgroup:
    """The cgroup folder(s) of one session: `name` under `hermes-foundry` in every hierarchy mount."""

    def __init__(self, hierarchy: Hierarchy, name: str) -> None:
        self.hierarchy, self.name = hierarchy, name
        self.dirs = [parent / name for parent in hierarchy.parents()]
        self.limited: tuple[str, ...] = ()  # the controllers whose limits were applied

    @classmethod
    def create(cls, hierarchy: Hierarchy, name: str, memory_mb: int, pids: int, cpus: float) -> "SessionCgroup":
        cgroup = cls(hierarchy, name)
        try:
            cgroup.limit(memory_mb, pids, cpus)  # creates the folders too
        except OSError as exc:
            cgroup.remove(wait=0.0)
            raise CgroupError(exc.errno, f"could not create cgroup {name!r}: {exc.strerror or exc}") from exc
        return cgroup

    def _create_v1(self, memory_mb: int, pids: int, cpus: float) -> set[str]:
        for path in self.dirs:
            path.mkdir(parents=True, exist_ok=True)
        applied = set()
        for controller, mount in self.hierarchy.mounts.items():
            folder = mount / PARENT / self.name
            if controller == "memory":
                _write(folder / "memory.limit_in_bytes", str(memory_mb << 20))
                if (folder / "memory.memsw.limit_in_bytes").exists():  # no escaping the limit into swap
                    _write(folder / "memory.memsw.limit_in_bytes", str(memory_mb << 20))
            elif controller == "pids":
                _write(folder / "pids.max", str(pids))
            elif controller == "cpu":
                _write(folder / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(folder / "cpu.cfs_quota_us", str(self._quota(cpus)))
            applied.add(controller)
        return applied

    def _create_v2(self, memory_mb: int, pids: int, cpus: float) -> set[str]:
        wanted = _v2_parent(self.hierarchy.mounts[""])
        folder = self.dirs[0]
        folder.mkdir(exist_ok=True)
        if "memory" in wanted:
            _write(folder / "memory.max", str(memory_mb << 20))
            if (folder / "memory.swap.max").exists():
                _write(folder / "memory.swap.max", "0")
        if "pids" in wanted:
            _write(folder / "pids.max", str(pids))
        if "cpu" in wanted:
            quota = self._quota(cpus)
            _write(folder / "cpu.max", f"{'max' if quota < 0 else quota} {CPU_PERIOD_US}")
        return wanted

    def limit(self, memory_mb: int, pids: int, cpus: float) -> None:
        """(Re)apply the limits to an existing cgroup."""
        applied = self._create_v2(memory_mb, pids, cpus) if self.hierarchy.version == 2 else \
            self._create_v1(memory_mb, pids, cpus)
        self.limited = tuple(sorted(applied))

    def rename(self, name: str) -> "SessionCgroup":
        """The same (empty) cgroup under another name; the first hierarchy's rename is the claim, so
        of two processes renaming one cgroup, only one goes on to the others."""
        renamed = SessionCgroup(self.hierarchy, name)
        for old, new in zip(self.dirs, renamed.dirs):
            old.rename(new)
        renamed.limited = self.limited
        return renamed

    @staticmethod
    def _quota(cpus: float) -> int:
        return -1 if cpus <= 0 else max(1000, int(cpus * CPU_PERIOD_US))

    @property
    def procs_files(self) -> list[Path]:
        return [path / "cgroup.procs" for path in self.dirs]

    def enter_argv(self) -> list[str]:
        """A prefix for a command line: the shell moves itself into the cgroup, then `exec`s the rest,
        so the command and all it starts are inside before they run (no preexec_fn: not thread-safe)."""
        script = " && ".join(f"echo $$ > {shlex.quote(str(path))}" for path in self.procs_files)
        return ["/bin/sh", "-c", f'{script} && exec "$@"', "sh"]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.procs_files:
            try:
                found.update(int(pid) for pid in path.read_text().split())
            except (OSError, ValueError):
                continue
        return found

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup until none is left; True once it is empty."""
        kill_file = self.dirs[0] / "cgroup.kill" if self.hierarchy.version == 2 else None
        deadline = time.monotonic() + timeout
        pause = 0.001  # exiting processes leave within a few ms: poll fast first, then back off
        while (members := self.pids()) and time.monotonic() < deadline:
            if kill_file is not None and kill_file.exists():
                try:
                    _write(kill_file, "1")  # atomic, also catches processes forking right now
                except OSError:
                    kill_file = None
            for pid in members if kill_file is None else ():
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
        return not self.pids()

    def exists(self) -> bool:
        return any(path.is_dir() for path in self.dirs)

    def remove(self, wait: float = 2.0) -> bool:
        """Delete the folders; exiting processes keep a cgroup busy for a moment, hence the retries."""
        deadline = time.monotonic() + wait
        while True:
            for path in self.dirs:
                try:
                    path.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    continue
            if not self.exists() or time.monotonic() >= deadline:
                return not self.exists()
            time.sleep(0.02)


SPARE_PREFIX = "spare-"
MAX_SPARES = 1024


def spare_names(hierarchy: Hierarchy) -> list[str]:
    """Empty cgroups that finished runs left for the next ones: a memory cgroup that is removed
    lingers in the kernel as long as anything is still charged to it (page cache, dentries), and
    hundreds of those made every sandbox command cost 4x the system time. Reusing them, nothing
    lingers."""
    return sorted(name for name in session_names(hierarchy) if name.startswith(SPARE_PREFIX))


class SparePool:
    """One process's view of the spares: listed once, at the first slot that needs one or the first
    retirement, then kept up to date by what this pool takes and retires. A listing scans every
    session cgroup of every mount (~2–5 ms with 1,000 spares on cgroup v1): once per slot it cost more
    than the rest of the slot at 1,024 sessions, and once per retirement it cost a listing per session
    at the end of a run (each session that finds no job left retires the idle slots). Spares that other
    processes take meanwhile fail to rename and are skipped; ones they add are not seen until the next
    pool (a new cgroup is made instead), nor counted against MAX_SPARES by this one."""

    def __init__(self, hierarchy: Hierarchy) -> None:
        self.hierarchy = hierarchy
        self._names: list[str] | None = None
        self._lock = threading.Lock()

    def _listed(self) -> list[str]:
        """The spares this pool may take (the lock held): listed at the first call."""
        if self._names is None:
            self._names = spare_names(self.hierarchy)[::-1]
        return self._names

    def _next(self) -> str | None:
        with self._lock:
            names = self._listed()
            return names.pop() if names else None

    def adopt(self, name: str, memory_mb: int, pids: int, cpus: float) -> SessionCgroup | None:
        """A spare cgroup renamed to `name`, with these limits; None when there is none to take."""
        while (spare := self._next()) is not None:
            try:
                cgroup = SessionCgroup(self.hierarchy, spare).rename(name)
            except OSError:
                continue  # another process took it first
            try:
                cgroup.kill_all(timeout=1.0)  # spares are empty; make sure
                cgroup.limit(memory_mb, pids, cpus)
            except OSError:
                cgroup.remove()
                continue
            return cgroup
        return None

    def retire(self, cgroups: list[SessionCgroup]) -> None:
        """`retire`, the spares counted from this pool's view; those kept are this pool's to take again."""
        with self._lock:
            known = len(self._listed())
        kept = retire(cgroups, known)
        with self._lock:
            self._listed()[:0] = kept  # taken after the ones listed (pop takes from the end)


def retire(cgroups: list[SessionCgroup], spares: int | None = None) -> list[str]:
    """Keep emptied cgroups as spares for later runs, or remove them (not empty, or MAX_SPARES
    reached: `spares` are there already, listed when not given); returns the names of those kept."""
    if not cgroups:
        return []
    spares = len(spare_names(cgroups[0].hierarchy)) if spares is None else spares
    kept: list[str] = []
    for cgroup in cgroups:
        if cgroup.kill_all(timeout=1.0) and spares + len(kept) < MAX_SPARES:
            try:
                kept.append(cgroup.rename(SPARE_PREFIX + secrets.token_hex(6)).name)
                continue
            except OSError:
                pass
        cgroup.remove()
    return kept


def session_names(hierarchy: Hierarchy) -> set[str]:
    """Names of every session cgroup present, in any of the hierarchy's mounts."""
    names: set[str] = set()
    for parent in hierarchy.parents():
        try:
            names.update(entry.name for entry in os.scandir(parent) if entry.is_dir())
        except OSError:
            continue
    return names
