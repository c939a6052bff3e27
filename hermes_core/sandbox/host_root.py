"""A sandbox root made of the host's own system folders, read-only, for sessions without an image.

The sandbox's root is an unprivileged host uid (a user namespace, see bubblewrap.py), so what only the
host's root may read (/etc/shadow, private keys) stays unreadable inside without a filtered copy.
"""

from __future__ import annotations

import os

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# The host's kernel settings, read-only inside, on top of the user namespace that already denies writing
# them (they belong to the host's root, unmapped there): defence in depth where a root escape goes. The
# other knobs Docker makes read-only (/proc/irq, /proc/bus, /proc/fs) are left to the user namespace
# alone: binding them cost a sandbox 0.5 ms of its 11. Only those this kernel has.
PROC_KNOBS = ("/proc/sys", "/proc/sysrq-trigger")


def host_layout() -> list[str]:
    """bwrap arguments for a root made of the host's system folders, read-only."""
    args = ["--tmpfs", "/"]
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):  # merged-/usr systems: /bin -> usr/bin
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    return args


def proc_layout() -> list[str]:
    """bwrap arguments for /proc: the sandbox's own, with the host's global knobs read-only."""
    return ["--proc", "/proc", *(arg for knob in PROC_KNOBS if os.path.exists(knob)
                                 for arg in ("--ro-bind", knob, knob))]
