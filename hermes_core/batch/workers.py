"""Sessions spread over worker processes, one event loop each, so one Python thread (the GIL) no longer
paces a large run.

The parent keeps everything that must stay single: the job queue, the stop decision (signals,
budgets) and the ledger. A worker's session asks the parent for its next job when it is free, and
sends each finished record back; the parent appends it (one writer per run folder), checks the
budgets and draws the progress bar exactly as in one process. Workers are forked once the jobs are
known, so they share the plan, recipe and sandbox backend without pickling or re-importing anything.

Workers ignore SIGINT/SIGTERM (the parent decides: after a signal it hands out no new job, the
workers finish their samples in flight, send the records and exit) and die with the parent
(PR_SET_PDEATHSIG, and the parent's pipe end closing), so a kill -9 of the command leaves none. A
worker that dies unexpectedly is reported when the run ends; its samples in flight have no record,
so the next invocation runs them again.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import multiprocessing
import os
import queue
import signal
import sys
import threading
import traceback
from collections import deque
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Awaitable, Callable

from hermes_core.config import usable_cores

WORKERS_ENV = "HERMES_WORKER_PROCESSES"
# Fewer sessions than this stay in one process: they do not load one core, and a worker costs a fork
# (bench/throughput.py: 4 x 200 is no faster with 2 processes; 64 x 2,000 is, see docs/explanation/performance.md).
MIN_SESSIONS_FOR_PROCESSES = 16
PR_SET_PDEATHSIG = 1
POLL_S = 1.0  # how often the parent looks for a worker that died without closing its pipe
MAX_MESSAGES = 1024  # taken from one worker per round: the others' wait at most that long

NextIndex = Callable[[int], Awaitable[int | None]]  # a session's position -> its next job's index, or None
Serve = Callable[[list[int], NextIndex, Callable[[int, dict[str, Any]], None]], Awaitable[None]]


class WorkerFailed(RuntimeError):
    """A worker process died or raised; the samples it had in flight have no record (the next
    invocation runs them again)."""


def process_count(sessions: int) -> int:
    """How many worker processes to spread `sessions` over; 1 means all in this process.
    $HERMES_WORKER_PROCESSES overrides the choice (1 keeps one process)."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"${WORKERS_ENV}={raw!r}: expected a whole number of worker processes, at least 1 "
                             "(1 runs every session in this process)")
        wanted = int(raw)
    else:
        wanted = usable_cores() if sessions >= MIN_SESSIONS_FOR_PROCESSES else 1
    return max(1, min(wanted, sessions))


@dataclass
class _Worker:
    number: int
    process: Any  # multiprocessing.Process (fork context)
    conn: Connection
    in_flight: set[int] = field(default_factory=set)  # job indices handed out and not recorded yet
    error: str | None = None  # the traceback it sent before exiting, if any

    def failure(self) -> str | None:
        """Why this finished worker lost samples, or None if it ended cleanly."""
        code = self.process.exitcode
        if code == 0 and not self.in_flight and not self.error:
            return None
        how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}")
        detail = f": {self.error.strip().splitlines()[-1]}" if self.error else ""
        return (f"worker process {self.number} (pid {self.process.pid}) {how}{detail}; "
                f"{len(self.in_flight)} of its samples in flight were not recorded")


def run_in_processes(count: int, sessions: int, processes: int, serve: Serve, backend: AbstractContextManager,
                     on_records: Callable[[list[dict[str, Any]]], None], stop: Callable[[], str | None]) -> None:
    """Blocking: run jobs 0..count-1 with `sessions` sessions over `processes` forked workers. Each
    worker runs `serve(positions, next_index, on_done)` inside `with backend:`; session positions
    interleave across workers so starts stay staggered run-wide. `on_records` gets the records that
    arrived together. Raises WorkerFailed at the end if a worker died (the others carry on with the
    remaining jobs)."""
    context = multiprocessing.get_context("fork")  # shares the plan copy-on-write; a spawn re-imports ~1 s
    workers: list[_Worker] = []
    print(f"{sessions} sessions over {processes} worker processes", file=sys.stderr, flush=True)
    try:
        for number in range(processes):
            parent_end, child_end = context.Pipe()
            inherited = [w.conn for w in workers]  # closed in the child: only the parent may hold them
            process = context.Process(
                target=_worker_main, name=f"hermes-worker-{number}", daemon=True,
                args=(child_end, inherited, os.getpid(), list(range(number, sessions, processes)), serve, backend))
            process.start()
            child_end.close()
            workers.append(_Worker(number, process, parent_end))
        failures = _dispatch(workers, deque(range(count)), on_records, stop)
    finally:
        for worker in workers:  # only on an error here: an exception in on_record, KeyboardInterrupt
            if worker.process.exitcode is None:
                worker.process.kill()
            worker.process.join()
            worker.conn.close()
    if failures:
        raise WorkerFailed("; ".join(failures) + ". The other samples were recorded; run the same command "
                           "to run the missing ones again.")


def _dispatch(workers: list[_Worker], queue: deque[int], on_records: Callable[[list[dict[str, Any]]], None],
              stop: Callable[[], str | None]) -> list[str]:
    """Answer the workers until every one has ended; returns the failures.

    Each round takes every message waiting (up to MAX_MESSAGES per worker), records first: sessions
    in step finish hundreds of samples at once, and one by one their fsyncs (~2 ms each here) held
    up every session's next job behind them. Their records go to `on_records` together, so they
    are durable after a few fsyncs, and counted (a budget met stops new jobs) before any request
    for a job in the same round is answered."""
    live = {worker.conn: worker for worker in workers}
    failures = []
    while live:
        ready = wait(list(live), timeout=POLL_S)
        # A worker whose process is gone but whose pipe a grandchild still holds open: ended too.
        ready += [c for c, w in live.items() if c not in ready and w.process.exitcode is not None and not c.poll()]
        records: list[dict[str, Any]] = []
        asking: list[tuple[_Worker, int]] = []
        for conn in ready:
            worker = live[conn]
            for _ in range(MAX_MESSAGES):
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    del live[conn]
                    worker.process.join()
                    if failure := worker.failure():
                        failures.append(failure)
                    break
                if message[0] == "next":
                    asking.append((worker, message[1]))
                elif message[0] == "record":
                    worker.in_flight.discard(message[1])
                    records.append(message[2])
                elif message[0] == "error":
                    worker.error = message[1]
                if not conn.poll():
                    break
        if records:
            on_records(records)
        for worker, position in asking:
            index = queue.popleft() if queue and not stop() else None
            if index is not None:
                worker.in_flight.add(index)
            try:
                worker.conn.send(("job", position, index))
            except OSError:
                pass  # it died: its end of the pipe says so next
    return failures


def _worker_main(conn: Connection, inherited: list[Connection], parent: int, positions: list[int], serve: Serve,
                 backend: AbstractContextManager) -> None:
    """A forked worker: run its sessions, asking the parent for jobs and sending it the records."""
    # What the parent made (the plan, the jobs, the parent's own garbage) stays out of this worker's
    # collections: its first one walked them all (~75 ms as the first requests went out) and wrote
    # to their pages, which the fork shares with the parent.
    gc.freeze()
    _die_with(parent)
    for other in inherited:
        other.close()
    # The parent decides what a signal means (finish in flight, start nothing): a Ctrl-C reaches the
    # whole process group, and a worker that died of it would lose its samples in flight.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with backend:  # frees this worker's sandbox slots
            asyncio.run(_work(conn, positions, serve))
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        os._exit(1)
    conn.close()
    # Not back through multiprocessing: it would flush stdio and run exit hooks copied from the
    # parent, whose locks another parent thread may have held at the fork.
    os._exit(0)


async def _work(conn: Connection, positions: list[int], serve: Serve) -> None:
    loop = asyncio.get_running_loop()
    waiting: dict[int, asyncio.Future[int | None]] = {}

    def readable() -> None:
        try:
            _, position, index = conn.recv()  # the parent's replies are small: whole once readable
        except (EOFError, OSError):
            os._exit(1)  # the parent is gone: nothing may outlive it, and nothing could be recorded
        waiting.pop(position).set_result(index)

    # Messages to the parent go out from a thread of their own: a send from the loop could block on
    # a full pipe while the parent blocks sending to this worker, whose replies only the loop reads
    # (a deadlock seen with 512 sessions per worker). The loop never blocks; order is kept.
    outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()

    def sender() -> None:
        while (message := outbox.get()) is not None:
            try:
                conn.send(message)
            except OSError:
                os._exit(1)  # the parent is gone, as above

    async def next_index(position: int) -> int | None:
        waiting[position] = loop.create_future()
        outbox.put(("next", position))
        return await waiting[position]

    def on_done(index: int, record: dict[str, Any]) -> None:
        outbox.put(("record", index, record))

    sending = threading.Thread(target=sender, name="hermes-worker-send", daemon=True)
    sending.start()
    loop.add_reader(conn.fileno(), readable)
    try:
        await serve(positions, next_index, on_done)
    finally:
        loop.remove_reader(conn.fileno())
        outbox.put(None)
        sending.join()  # every record sent before the worker reports its end


def _die_with(parent: int) -> None:
    """Be killed when the parent dies, even by kill -9 (Linux); the closed pipe is the fallback."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the prctl took effect
        os._exit(1)
