"""How many model requests may be in flight to one endpoint (SPEC §5).

- A cap across every process of this machine, so it holds across concurrent Dagster runs: one slot
  file per allowed request under `HERMES_LIMITS_DIR` (default /tmp/hermes-foundry-limits), each held
  with `flock` while its request is in flight. The kernel drops a dead process's locks, so a crash
  never leaks a slot.
- An adaptive window in this process (AIMD): a 429 halves it, and each success grows it back by
  1/window, so a rate-limited endpoint is slowed down, then recovers. Retry-After is honoured by the
  model client's retry itself.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import math
import os
import random
import tempfile
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

POLL_S = 0.01
DEFAULT_DIR = Path(tempfile.gettempdir()) / "hermes-foundry-limits"


class RequestLimiter:
    """`async with limiter.slot():` around each request. One per (endpoint, cap) per process: `shared()`."""

    _shared: dict[tuple[str, int], "RequestLimiter"] = {}
    _shared_lock = threading.Lock()

    def __init__(self, base_url: str, cap: int, directory: Path | None = None) -> None:
        self.cap = cap
        self.window = float(cap) if cap else math.inf
        self.in_flight = 0
        self._lock = threading.Lock()
        self._held: set[int] = set()
        self._fds: list[int] = []
        if cap:
            folder = Path(directory or os.environ.get("HERMES_LIMITS_DIR") or DEFAULT_DIR)
            folder = folder / hashlib.sha256(base_url.encode()).hexdigest()[:16]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "endpoint").write_text(base_url + "\n")
            self._fds = [os.open(folder / f"slot-{i}.lock", os.O_RDWR | os.O_CREAT, 0o666) for i in range(cap)]

    @classmethod
    def shared(cls, base_url: str, cap: int) -> "RequestLimiter":
        with cls._shared_lock:
            key = (base_url, cap)
            if key not in cls._shared:
                cls._shared[key] = cls(base_url, cap)
            return cls._shared[key]

    def _try_take(self) -> int | None:
        """A free machine-wide slot (its index), or -1 without a cap; None when none is free now."""
        with self._lock:
            if self.in_flight >= self.window:
                return None
            if not self.cap:
                self.in_flight += 1
                return -1
            for index in random.sample(range(self.cap), self.cap):
                if index in self._held:
                    continue
                try:
                    fcntl.flock(self._fds[index], fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # another process holds it
                self._held.add(index)
                self.in_flight += 1
                return index
            return None

    def _give_back(self, index: int) -> None:
        with self._lock:
            self.in_flight -= 1
            if index >= 0:
                self._held.discard(index)
                fcntl.flock(self._fds[index], fcntl.LOCK_UN)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        while (index := self._try_take()) is None:
            await asyncio.sleep(POLL_S * (0.5 + random.random()))
        try:
            yield
        finally:
            self._give_back(index)

    def rate_limited(self) -> None:
        """A 429: halve the window (never below one request)."""
        with self._lock:
            self.window = max(1.0, min(self.window, max(self.in_flight, 1)) / 2)

    def succeeded(self) -> None:
        """Grow the window back by 1/window per success, up to the cap (or back to unlimited)."""
        with self._lock:
            if math.isinf(self.window):
                return
            self.window += 1.0 / self.window
            if self.cap and self.window >= self.cap:
                self.window = float(self.cap)
            elif not self.cap and self.window >= 1024:
                self.window = math.inf


def _forget_inherited_limiters() -> None:
    """In a forked child (batch worker processes): the parent's slot files are open file descriptions
    shared with it, and flock treats holders of one description as one, so two workers could take
    the same slot. Drop them (closing our copies releases nothing the parent holds); the child opens
    its own on first use."""
    for limiter in RequestLimiter._shared.values():
        for fd in limiter._fds:
            os.close(fd)
    RequestLimiter._shared = {}
    RequestLimiter._shared_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_inherited_limiters)
