"""A `local` sandbox slot: what the sessions of a backend use one after another (a cgroup, a loopback-only
network namespace, and as root the zygote that makes the sessions)."""

from __future__ import annotations

import logging
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hermes_core.sandbox.base import SandboxSettings
from hermes_core.sandbox.cgroups import (CgroupError, Hierarchy, SessionCgroup, SparePool, host_share,
                                         limit_host_share)
from hermes_core.sandbox.processes import DEFAULT_PATH, loopback_namespace, owner_tag
from hermes_core.sandbox.zygote import Zygote

log = logging.getLogger(__name__)


@dataclass
class Slot:
    """What sessions use one after another: a cgroup and a loopback-only network namespace (pinned
    by an fd). Creating and destroying both costs ~2 ms of CPU per session as root (~5 ms otherwise); reusing them is safe
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


class SlotPool:
    """The slots of one `local` backend: made when a session finds none idle, or ahead of the sessions
    (`warm`), and reused once a session's end emptied them. A new slot cost ~13 ms of CPU and 16 ms of
    wall (a cgroup, a bubblewrap pinning the network namespace, as root the zygote; ~4 ms less since
    root makes the namespace in a thread) against ~4 ms for a session on a reused one; at 1,024 sessions all of that fell on the run's first round."""

    def __init__(self, hierarchy: Hierarchy | None, settings: SandboxSettings, state_root: Path, tag: str,
                 bwrap: str) -> None:
        self.settings, self.state_root, self.tag, self.bwrap = settings, state_root, tag, bwrap
        self._spares = SparePool(hierarchy) if hierarchy else None
        self._idle: list[Slot] = []
        self._lock = threading.Condition()
        self._warming: threading.Thread | None = None
        self._closing = False
        self._made = 0  # slots made by this pool, ahead or on demand
        self._host_limited = False  # the host's share of all sandboxes set, before this pool's first cgroup
        self._making = self._waiting = 0  # slots being made ahead; sessions waiting for one of them

    def take(self) -> Slot:
        """An idle slot; else the one being made ahead if no other session waits for it; else a new one."""
        with self._lock:
            while not self._idle and self._making > self._waiting:
                self._waiting += 1
                self._lock.wait()
                self._waiting -= 1
            if self._idle:
                return self._idle.pop()
            self._made += 1
        return self._make()

    def _limit_host_share(self, hierarchy: Hierarchy) -> None:
        with self._lock:
            if self._host_limited:
                return
            self._host_limited = True
            try:
                limit_host_share(hierarchy, *host_share(self.settings.host_memory_mb, self.settings.host_pids))
            except PermissionError:
                pass  # no cgroups of this user's own here: sessions run without limits too (SPEC §6)
            except OSError as exc:  # e.g. the memory in use is above the share already: each keeps its own limits
                log.warning("could not limit all sandboxes of this host together (%s): %s",
                            hierarchy.parents()[0], exc)

    def _make(self) -> Slot:
        cgroup = None
        if self._spares is not None:  # there is a cgroup hierarchy to use
            self._limit_host_share(self._spares.hierarchy)
            name = f"o{owner_tag('-')}-{self.tag}-slot{secrets.token_hex(4)}"
            s = self.settings
            try:
                cgroup = self._spares.adopt(name, s.memory_mb, s.pids, s.cpus) or \
                    SessionCgroup.create(self._spares.hierarchy, name, s.memory_mb, s.pids, s.cpus)
            except CgroupError:
                cgroup = None  # no permission to use cgroups here: run without limits (SPEC §6)
        slot = Slot(cgroup, None, self.state_root)
        if not self.settings.network:
            try:
                slot.net_fd = loopback_namespace(self.bwrap)
            except BaseException:
                slot.destroy()
                raise
        return slot

    def give_back(self, slot: Slot, emptied: bool) -> None:
        with self._lock:
            if emptied and slot.cgroup is not None and not self._closing:
                self._idle.append(slot)
                self._lock.notify()
                return
        slot.destroy()  # without a cgroup, an escaped daemon could still hold the namespace: never reuse it

    def warm(self, count: int, ready: Callable[[Slot], None] | None = None) -> None:
        """Make slots one after another in a thread of their own, each readied by `ready` (e.g. its
        zygote started), until `count` exist, counting those that sessions made themselves: a session
        that finds none idle waits for the one being made rather than making another. Only slots with a
        cgroup are kept (as in `give_back`); a slot that fails to be made ends the warming, and the
        sessions make their own (and meet its error). Once per pool until `close`."""
        if self._spares is None or self._warming is not None:
            return

        def make() -> Slot | None:
            try:
                slot = self._make()
            except Exception:
                return None
            try:
                if slot.cgroup is None:  # no permission for cgroups after all: such slots are never reused
                    raise CgroupError("no cgroup")
                if ready is not None:
                    ready(slot)
            except Exception:
                slot.destroy()
                return None
            return slot

        def warming() -> None:
            try:
                while True:
                    with self._lock:
                        if self._closing or self._made >= count:
                            return
                        self._made += 1
                        self._making += 1
                    slot = make()
                    with self._lock:
                        self._making -= 1
                        if slot is not None and not self._closing:
                            self._idle.append(slot)
                            self._lock.notify()
                            continue
                    if slot is not None:
                        slot.destroy()
                    return
            finally:
                with self._lock:
                    self._lock.notify_all()  # sessions waiting for a slot that will not come make their own

        self._warming = threading.Thread(target=warming, name="hermes-slot-warm", daemon=True)
        self._warming.start()

    def close(self) -> None:
        """Destroy the idle slots; their cgroups become spares for later runs."""
        with self._lock:
            self._closing = True
        if self._warming is not None:
            self._warming.join()  # its slot in making goes back, and is destroyed below
        with self._lock:
            idle, self._idle = self._idle, []
            self._closing, self._warming, self._made = False, None, 0  # used again, it warms again
        for slot in idle:  # every zygote told first: they end together, not one after another
            if slot.zygote is not None:
                slot.zygote.hang_up()
        for slot in idle:
            slot.destroy(keep_cgroup=True)
        if self._spares is not None:
            self._spares.retire([slot.cgroup for slot in idle if slot.cgroup is not None])
