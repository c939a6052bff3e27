"""Pool slots and runs left behind by processes that died (`kill -9`, a second Ctrl-C, an OOM kill).

Dagster frees a run's pool slots when its steps end; a process that dies mid-step never does, so
its run stays STARTED and its slot stays claimed, and after `limit` such deaths every later run
waits forever. Every run of ours carries the identity of the process executing it (host, pid and
the pid's kernel start time, so a reused pid does not count). Before a run claims a slot, runs of
this host whose process is gone are marked failed and their slots freed, as are slots still held
by runs that already ended. A run that must wait for a slot waits here, on the console and
interruptible, not in Dagster's claim loop.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import TextIO

import dagster as dg
from dagster._core.storage.dagster_run import FINISHED_STATUSES, NOT_FINISHED_STATUSES

from hermes_core.sandbox.processes import owner_alive, process_start_time

# Bookkeeping, not for filtering by hand: under Dagster's hidden prefix, so the UI does not list them.
HIDDEN = ".dagster/hermes_"  # one "/" only: Dagster deprecates tag keys with more
HOST_TAG, PID_TAG, START_TAG = f"{HIDDEN}host", f"{HIDDEN}pid", f"{HIDDEN}pid_start"
POLL_S = 1.0


def process_tags() -> dict[str, str]:
    """Tags naming this process as the one executing a run."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid()), START_TAG: process_start_time(os.getpid()) or ""}


def tag_run(context: dg.AssetExecutionContext) -> None:
    """Record the executing process on a run launched elsewhere (the UI, a sensor, the daemon)."""
    if context.run.tags.get(PID_TAG) != str(os.getpid()):
        context.instance.add_run_tags(context.run.run_id, process_tags())


def _process_gone(run: dg.DagsterRun) -> bool:
    """Whether the run's process, on this host, no longer exists (False when unknown or elsewhere)."""
    tags = run.tags
    if PID_TAG not in tags or tags.get(HOST_TAG) != socket.gethostname():
        return False
    if int(tags[PID_TAG]) == os.getpid():
        return False
    if _zombie(int(tags[PID_TAG])):
        return True
    return not owner_alive(tags[PID_TAG], tags.get(START_TAG))


def _zombie(pid: int) -> bool:
    """A killed process its parent has not reaped yet is dead for our purposes."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def reap_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed the unfinished runs of this host whose process is gone, and free the pool slots
    of every run that no longer runs. Returns the ids of the runs marked failed."""
    storage = instance.event_log_storage
    failed = []
    unfinished = instance.get_runs(dg.RunsFilter(statuses=list(NOT_FINISHED_STATUSES),
                                                 tags={HOST_TAG: socket.gethostname()}))
    for run in unfinished:
        if _process_gone(run):
            instance.report_run_failed(run, f"the process running it (pid {run.tags[PID_TAG]} on "
                                            f"{run.tags[HOST_TAG]}) exited without finishing it")
            failed.append(run.run_id)
    if storage.supports_global_concurrency_limits:
        for run_id in storage.get_concurrency_run_ids():
            run = instance.get_run_by_id(run_id)
            if run is None or run.status in FINISHED_STATUSES or run_id in failed:
                storage.free_concurrency_slots_for_run(run_id)
    return failed


def wait_for_slot(instance: dg.DagsterInstance, pool: str, out: TextIO | None = None) -> None:
    """Reap dead runs, then wait until `pool` has a free slot, saying once on `out` (default: stderr as
    it is now, not as it was when this module was imported) who holds the slots. Ctrl-C raises
    KeyboardInterrupt here as anywhere in the main thread."""
    out = out or sys.stderr
    storage = instance.event_log_storage
    announced = False
    while True:
        reaped = reap_dead_runs(instance)
        if reaped:
            print(f"marked {len(reaped)} run(s) whose process had died as failed and freed their slots: "
                  f"{', '.join(reaped)}", file=out)
        if not storage.supports_global_concurrency_limits:
            return
        info = storage.get_concurrency_info(pool)
        if info.limit is None or info.active_slot_count < info.limit:
            return
        if not announced:
            holders = ", ".join(sorted(info.active_run_ids))
            print(f"waiting for a slot in pool {pool!r}: all {info.limit} are held by running run(s) {holders} "
                  "(Ctrl-C to stop; `dagster instance concurrency` changes the limit)", file=out, flush=True)
            announced = True
        time.sleep(POLL_S)


def abandon_run(instance: dg.DagsterInstance, run: dg.DagsterRun) -> None:
    """A run this process gives up on at once (a second Ctrl-C): marked failed, its slots freed."""
    instance.report_run_failed(run, "aborted by a second interrupt; finished samples are saved")
    instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
