"""A tiny root filesystem made from host binaries, for sandbox tests that need an image without the
debootstrapped one."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path


def tiny_rootfs(image_root: Path, name: str = "tiny_v1") -> Path:
    """A root filesystem of a few host binaries and their libraries: enough for sh, cat, ls, sleep."""
    rootfs = image_root / name
    (rootfs / "usr" / "bin").mkdir(parents=True)
    (rootfs / "bin").symlink_to("usr/bin")
    for binary in ("dash", "cat", "mkdir", "dirname", "ls", "sleep", "rm", "head"):
        source = shutil.which(binary)
        shutil.copy2(source, rootfs / "usr" / "bin" / binary)
        for library in re.findall(r"(/\S+) \(0x", subprocess.run(["ldd", source], capture_output=True, text=True).stdout):
            target = rootfs / library.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(library), target)
    (rootfs / "usr" / "bin" / "sh").symlink_to("dash")
    for folder in ("etc", "tmp", "app", "proc", "dev"):
        (rootfs / folder).mkdir(exist_ok=True)
    (rootfs / "etc" / "marker").write_text("tiny\n")
    (rootfs / "app" / "shipped.txt").write_text("from the image\n")
    return rootfs
