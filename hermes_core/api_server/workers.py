"""The API server's worker threads: where every agent run's tool calls and sandbox opens and closes run.

Their number is fixed by the run cap: each run has at most PARALLEL_TOOLS_PER_RUN tool calls in flight
plus one thread for its sandbox, and a run ends (freeing its slot) only when its threads have returned
(a cancelled run's commands are stopped first: see hermes_core.agent.session). So the runs in progress can
never take the threads that another run needs, however their clients come and go.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

PARALLEL_TOOLS_PER_RUN = 4  # a model's read-only calls of one reply run at most this many at once


class Workers(concurrent.futures.ThreadPoolExecutor):
    """A thread pool that counts the threads busy right now (for observers: tests, metrics)."""

    def __init__(self, max_concurrent_runs: int) -> None:
        super().__init__(max_concurrent_runs * (PARALLEL_TOOLS_PER_RUN + 1), thread_name_prefix="hermes-api")
        self.busy = 0
        self._count = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        def counted() -> Any:
            with self._count:
                self.busy += 1
            try:
                return fn(*args, **kwargs)
            finally:
                with self._count:
                    self.busy -= 1

        return super().submit(counted)
