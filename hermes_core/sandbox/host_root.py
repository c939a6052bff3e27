"""A sandbox root made of the host's own system folders, read-only, for sessions without an image.

Commands run as uid 0 inside, so /etc is a copy without what only root may read.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")


def host_layout(etc: Path) -> list[str]:
    """bwrap arguments for a root made of the host's system folders, read-only, with `etc` (a copy
    of /etc without what only root may read: commands run as uid 0) as /etc."""
    args = ["--tmpfs", "/"]
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):  # merged-/usr systems: /bin -> usr/bin
            args += ["--symlink", os.readlink(folder), folder]
        elif folder == "/etc":
            args += ["--ro-bind", str(etc), "/etc"]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    return args


def copy_readable_etc(target: Path) -> None:
    """/etc without the files and folders that only root may read (e.g. /etc/shadow, private keys).
    One bind of this copy replaces a dozen masking mounts per command, which made every command
    pay ~2 ms more and serialized concurrent ones in the kernel (bench: 204 -> 317 bwrap runs/s)."""
    target.mkdir(mode=0o755)
    for top, folders, files in os.walk("/etc"):
        inside = target / os.path.relpath(top, "/etc")
        for name in sorted(folders + files):
            source, copy = os.path.join(top, name), inside / name
            try:
                if os.path.islink(source):
                    copy.symlink_to(os.readlink(source))
                    continue
                mode = os.stat(source).st_mode
                if not mode & 0o004:
                    continue  # only root may read it: commands do not see it at all
                if stat.S_ISDIR(mode):
                    copy.mkdir(mode=stat.S_IMODE(mode))
                elif stat.S_ISREG(mode):
                    shutil.copy2(source, copy)
            except OSError:
                continue  # vanished or unreadable while copying: leave it out
        folders[:] = [name for name in folders if (inside / name).is_dir() and not (inside / name).is_symlink()]
