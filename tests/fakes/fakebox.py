"""What the test fakes of Modal and Apptainer share: commands really run in bubblewrap on a
prepared root filesystem, with cgroup limits, so the sandbox contract suite tests real isolation.

Test-only. Needs root (cgroups) and bwrap; the test images are debootstrapped root filesystems in
/var/cache/hermes-foundry/rootfs/<name> (see scripts/test_images.sh).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path, PurePosixPath
from typing import Iterable

ROOTFS_ROOT = Path(os.environ.get("HERMES_TEST_ROOTFS_ROOT", "/var/cache/hermes-foundry/rootfs"))
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "hermes-fake"  # every fake's cgroups live below this, one per container
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_KERNEL_DIRS = {"proc", "dev", "sys"}  # mounted fresh by bwrap, never taken from the image


def rootfs_for(image: str) -> Path | None:
    """The root filesystem of an image: an absolute path to a directory, or a name like
    "hermes-test/bookworm:latest" mapped to ROOTFS_ROOT/bookworm."""
    if image.startswith("/"):
        return Path(image) if Path(image).is_dir() else None
    name = image.split("://", 1)[-1].rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    candidate = ROOTFS_ROOT / name
    return candidate if name and candidate.is_dir() else None


def rootfs_args(rootfs: Path, mount_points: Iterable[str] = ()) -> list[str]:
    """bwrap arguments making `rootfs` the read-only root. Directories on the way to a mount point
    are rebuilt as tmpfs folders of read-only binds, so a mount point missing from the image (like
    a workdir "/srv/project") can still be created, as container engines do."""
    expand = {""}
    for point in mount_points:
        parts = PurePosixPath(point).parts[1:]
        for depth in range(1, len(parts)):
            relative = "/".join(parts[:depth])
            host = rootfs / relative
            if host.is_symlink() or not host.is_dir():
                break
            expand.add(relative)
    args: list[str] = []

    def emit(relative: str) -> None:
        for entry in sorted(os.scandir(rootfs / relative), key=lambda item: item.name):
            child = f"{relative}/{entry.name}" if relative else entry.name
            if not relative and entry.name in _KERNEL_DIRS:
                continue
            if entry.is_symlink():
                args.extend(["--symlink", os.readlink(entry.path), "/" + child])
            elif entry.is_dir() and child in expand:
                args.extend(["--dir", "/" + child])
                emit(child)
            elif entry.is_dir() or entry.is_file():
                args.extend(["--ro-bind", entry.path, "/" + child])

    emit("")
    return args + ["--proc", "/proc", "--dev", "/dev"]


def bwrap_argv(rootfs: Path, command: list[str], *, cwd: str, binds: dict[str, Path], tmpfs: Iterable[str] = (),
               network: bool = False, user_ns: bool = False, drop_caps: bool = True,
               extra: Iterable[str] = ()) -> list[str]:
    """A bwrap command line: own pid/ipc/uts (and, unless `network`, net) namespaces, the image
    read-only, `binds` (inside path -> host folder) writable, `tmpfs` folders empty and writable."""
    bwrap = shutil.which("bwrap") or "bwrap"
    argv = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
    if drop_caps:
        argv += ["--cap-drop", "ALL"]
    if user_ns:
        argv += ["--unshare-user", "--uid", "0", "--gid", "0"]
    if not network:
        argv.append("--unshare-net")
    argv += rootfs_args(rootfs, list(binds) + list(tmpfs))
    for inside in tmpfs:
        argv += ["--tmpfs", inside]
    for inside, host in binds.items():
        argv += ["--bind", str(host), inside]
    argv += ["--chdir", cwd, "--hostname", "sandbox", *extra, "--"]
    return argv + command


def container_env(home: str = "/root", extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a fresh container: nothing of the host's."""
    return {"PATH": CONTAINER_PATH, "HOME": home, "LANG": "C.UTF-8", "TERM": "xterm", **(extra or {})}


class Cgroup:
    """One container's cgroup (v1 controllers or the v2 unified tree). Its name starts with the pid
    of the process responsible for removing it, so leftovers of dead owners can be found."""

    def __init__(self, kind: str, memory_bytes: int | None = None, pids: int | None = None,
                 cpus: float | None = None, owner_pid: int | None = None) -> None:
        self.name = f"{kind}-{owner_pid or os.getpid()}-{os.urandom(3).hex()}"
        self.unified = (CGROUP_ROOT / "cgroup.controllers").exists()
        self.dirs: list[Path] = []
        limits = {"memory": memory_bytes, "pids": pids, "cpu": cpus}
        try:
            for controller, value in limits.items():
                if value is not None:
                    self._limit(controller, value)
        except BaseException:
            self.destroy()
            raise

    def _dir(self, controller: str) -> Path:
        if self.unified:
            parent = CGROUP_ROOT / CGROUP_PARENT
            parent.mkdir(exist_ok=True)
            available = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
            for level in (CGROUP_ROOT, parent):  # controllers must be enabled on every level above
                (level / "cgroup.subtree_control").write_text(" ".join(f"+{name}" for name in available))
            path = parent / self.name
        else:
            path = CGROUP_ROOT / controller / CGROUP_PARENT / self.name
        if not path.is_dir():
            path.mkdir(parents=True)
            self.dirs.append(path)
        return path

    def _limit(self, controller: str, value: float) -> None:
        path = self._dir(controller)
        if controller == "memory":
            size = str(int(value))
            if self.unified:
                (path / "memory.max").write_text(size)
                (path / "memory.swap.max").write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(size)
                swap = path / "memory.memsw.limit_in_bytes"  # absent without swap accounting
                if swap.exists():
                    swap.write_text(size)
        elif controller == "pids":
            (path / "pids.max").write_text(str(int(value)))
        elif self.unified:
            (path / "cpu.max").write_text(f"{int(float(value) * 100000)} 100000")
        else:
            (path / "cpu.cfs_period_us").write_text("100000")
            (path / "cpu.cfs_quota_us").write_text(str(int(float(value) * 100000)))

    def procs_files(self) -> list[str]:
        return [str(path / "cgroup.procs") for path in self.dirs]

    def join(self, pid: int = 0) -> None:
        for procs in self.procs_files():
            Path(procs).write_text(str(pid or os.getpid()))

    def destroy(self) -> None:
        """Kill whatever is still inside, then remove the folders."""
        for path in reversed(self.dirs):
            deadline = time.monotonic() + 5
            while path.is_dir():
                try:
                    pids = [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    path.rmdir()
                except (ProcessLookupError, OSError):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
        self.dirs = [path for path in self.dirs if path.is_dir()]


def join_cgroups_argv(procs_files: list[str], command: list[str]) -> list[str]:
    """`command` run by a host shell that first moves itself into the given cgroups."""
    script = "".join(f'echo $$ > "{path}" && ' for path in procs_files) + 'exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *command]


_STALE_BEFORE: dict[tuple[str, str], set[str]] = {}


def note_stale_cgroups(kind: str, scope: object) -> None:
    """Remember the stale cgroups of `kind` there are before a test (`scope`, e.g. its tmp_path) starts:
    the cgroup tree is the host's, shared with whatever else ran on it (another checkout's killed test
    run), so `new_stale_cgroups` counts only the test's own."""
    _STALE_BEFORE.setdefault((kind, str(scope)), set(stale_cgroups(kind)))


def new_stale_cgroups(kind: str, scope: object) -> list[str]:
    before = _STALE_BEFORE.get((kind, str(scope)), set())
    return [path for path in stale_cgroups(kind) if path not in before]


def stale_cgroups(kind: str) -> list[str]:
    """Cgroups of `kind` whose owner process is gone: what a crashed or careless fake left."""
    found = []
    for parent in [CGROUP_ROOT / CGROUP_PARENT, *CGROUP_ROOT.glob(f"*/{CGROUP_PARENT}")]:
        for path in parent.glob(f"{kind}-*") if parent.is_dir() else []:
            try:
                os.kill(int(path.name.split("-")[1]), 0)
            except ProcessLookupError:
                found.append(str(path))
            except (ValueError, IndexError, PermissionError):
                continue
    return found
