"""Memory of a whole process tree (the command, its worker processes and every sandbox), as PSS.

PSS (proportional set size) counts a page shared by n processes as 1/n in each, so the sum over a
tree is what the tree costs the machine: 1,024 sandboxes that share bash's pages do not count them
1,024 times, as RSS would.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def descendants(root: int) -> list[int]:
    """Every live process under `root` (not `root` itself), from one scan of /proc. A process
    reparented away from the tree is lost, unless `root` is a child subreaper (see harness)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, pending = [], list(children.get(root, ()))
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


def pss_kb(pid: int) -> int | None:
    """The process's PSS in kB (/proc/<pid>/smaps_rollup), or None if it exited or is exiting (its
    memory already released: the rollup is empty)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class TreePss(threading.Thread):
    """Samples the summed PSS of `root`'s descendants every `interval` seconds until `stop()`;
    keeps the peak sum, the most processes seen at once and the most seen exiting (no memory left)."""

    def __init__(self, root: int, interval: float = 1.0) -> None:
        super().__init__(name="tree-pss", daemon=True)
        self.root, self.interval = root, interval
        self.peak_kb = self.peak_processes = self.unreadable = self.samples = 0
        self.cpu_seconds = 0.0  # this sampler's own CPU, which the measured run competed with
        self._stop_event = threading.Event()

    def run(self) -> None:
        started = time.thread_time()
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)
        self.cpu_seconds = time.thread_time() - started

    def sample(self) -> None:
        pids = descendants(self.root)
        sizes = [pss_kb(pid) for pid in pids]
        self.unreadable = max(self.unreadable, sum(size is None for size in sizes))
        self.peak_kb = max(self.peak_kb, sum(size or 0 for size in sizes))
        self.peak_processes = max(self.peak_processes, len(pids))
        self.samples += 1

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    @property
    def peak_mb(self) -> float:
        return self.peak_kb / 1024
