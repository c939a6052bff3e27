"""A `local` sandbox slot: what the sessions of a backend use one after another (a cgroup, a loopback-only
network namespace, and as root the zygote that makes the sessions)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hermes_core.sandbox.cgroups import SessionCgroup
from hermes_core.sandbox.processes import DEFAULT_PATH
from hermes_core.sandbox.zygote import Zygote


@dataclass
class Slot:
    """What sessions use one after another: a cgroup and a loopback-only network namespace (pinned
    by an fd). Creating and destroying both costs ~5 ms of CPU per session; reusing them is safe
    once the cgroup is empty, because no process of the previous session is left to hold a socket."""

    cgroup: SessionCgroup | None
    net_fd: int | None
    state_root: Path  # where the zygote's start is logged (the log is removed once it started)
    zygote: Zygote | None = None  # started by the slot's first session that uses one

    def zygote_for(self, argv: Callable[[int, int], list[str]], launcher: Path) -> Zygote:
        if self.zygote is None:
            fds = () if self.net_fd is None else (self.net_fd,)
            self.zygote = Zygote(argv, launcher, self.state_root, {"PATH": DEFAULT_PATH}, fds)
        return self.zygote

    def stop_zygote(self) -> None:
        zygote, self.zygote = self.zygote, None
        if zygote is not None:
            zygote.stop()

    def destroy(self, keep_cgroup: bool = False) -> None:
        """End the zygote, free the network namespace; remove the cgroup unless `keep_cgroup` (the
        caller retires it)."""
        self.stop_zygote()
        if self.net_fd is not None:
            os.close(self.net_fd)  # frees the network namespace
            self.net_fd = None
        if self.cgroup is not None and not keep_cgroup:
            self.cgroup.remove()
