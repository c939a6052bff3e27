"""How a `local` session's bubblewrap is entered: the command line that puts it in its slot's cgroup
and namespaces (as root, through the exec server's launcher), and the slot's zygote that makes the
sessions without an image."""

from __future__ import annotations

import shutil
from pathlib import Path

from hermes_core.sandbox.base import SandboxSettings
from hermes_core.sandbox.cgroups import SessionCgroup
from hermes_core.sandbox.host_root import host_layout
from hermes_core.sandbox.identity import ID_COUNT
from hermes_core.sandbox.slots import Slot
from hermes_core.sandbox.zygote import Zygote

BWRAP = shutil.which("bwrap")
NSENTER = shutil.which("nsenter") or "nsenter"
NSENTER_OPTION = {"net": "net", "mnt": "mount"}
ZYGOTE_FLAGS = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
                "--new-session"]
NAMESPACE_FLAGS = [*ZYGOTE_FLAGS, "--cap-drop", "ALL"]  # as root, bwrap would otherwise keep every capability


def entry_argv(launcher: Path | None, cgroup: SessionCgroup | None, fds: dict[str, int], ids: int | None,
               layer: list[str] | None) -> list[str]:
    """What runs bubblewrap inside a slot's cgroup and namespaces (`fds`), as root of a user namespace
    whose ids are unprivileged on the host (when we are root): the exec server's launcher mode (one
    static process), which also makes the writable `layer` if given; when not root and without it, a
    shell that joins the cgroup and nsenter."""
    procs = cgroup.procs_files if cgroup else []
    if launcher is not None:
        joins = [*(item for path in procs for item in ("--cgroup", str(path))),
                 *(item for fd in fds.values() for item in ("--ns", str(fd))),
                 *(["--map", str(ids), str(ID_COUNT)] if ids is not None else []), *(layer or [])]
        return [str(launcher), "--enter", *joins, "--"] if joins else []
    enter = cgroup.enter_argv() if cgroup else []
    namespaces = [f"--{NSENTER_OPTION[kind]}=/proc/self/fd/{fd}" for kind, fd in fds.items()]
    return [*enter, *([NSENTER, *namespaces, "--"] if namespaces else [])]


def makes_zygotes(settings: SandboxSettings, launcher: Path | None, ids: int | None) -> bool:
    """Whether sessions without an image come from their slot's zygote: as root, with the exec server."""
    return ids is not None and launcher is not None and settings.exec_server


def slot_zygote(slot: Slot, launcher: Path, ids: int | None) -> Zygote:
    """The slot's zygote, started now if need be: pid 1 of a bubblewrap on the host's system folders
    (read-only), keeping the capabilities of the slot's user namespace (whose root is unprivileged on
    the host) to make sessions."""
    enter = entry_argv(launcher, slot.cgroup, {} if slot.net_fd is None else {"net": slot.net_fd}, ids, None)
    return slot.zygote_for(lambda ctl, exe: [
        *enter, BWRAP or "bwrap", *ZYGOTE_FLAGS, "--as-pid-1", *host_layout(), "--proc", "/proc", "--dev", "/dev",
        "--dir", "/newroot", "--dir", "/layer", "--remount-ro", "/", "--chdir", "/", "--",
        f"/proc/self/fd/{exe}", "--zygote", str(ctl), str(exe)], launcher)
