"""Who the local backend's sandboxes run as, and where their writable layer is mounted: as root, the
sandbox's root is an unprivileged host uid range of its own user namespace (exec_server.c --map), and
its writable space a quota tmpfs on LAYER in its own mount namespace (exec_server.c --layer)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hermes_core.sandbox.base import SandboxError, SandboxSettings

NO_LAUNCHER = ("as root, the local backend needs its launcher, which is built with a C compiler: install one "
               "(e.g. apt-get install gcc), or run as another user")
ID_COUNT = 65536  # ids 0..65535 inside the sandbox, mapped to settings.host_uid and up
LAYER = Path("/run/hermes-foundry/layer")  # where each session's writable tmpfs is, in its own mount namespace


def layer_mount_point() -> None:
    """LAYER, made once: root's own folder (each session mounts its tmpfs there in its own namespace)."""
    try:
        LAYER.mkdir(mode=0o755, parents=True, exist_ok=True)
        info = LAYER.lstat()
    except OSError as exc:
        raise SandboxError(f"cannot make the sandboxes' mount point {LAYER}: {exc}") from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise SandboxError(f"{LAYER} must be a folder owned by root that only root may write; remove it")


def host_ids(settings: SandboxSettings) -> int | None:
    """The first host uid (and gid) of the sandbox's user namespace: its root is that unprivileged id,
    so a command has no power over the host as root (kernel settings, root-owned files, keyrings).
    None when not running as root: bubblewrap then maps the invoking user, who has no more power."""
    if os.geteuid() != 0:
        return None
    if not 0 < settings.host_uid <= 2**32 - 2 - ID_COUNT:
        raise SandboxError(f"HERMES_SANDBOX_HOST_UID={settings.host_uid} must be a host uid from 1 to "
                           f"{2**32 - 2 - ID_COUNT} (the sandbox's ids 0..{ID_COUNT - 1} are mapped from it up)")
    return settings.host_uid
