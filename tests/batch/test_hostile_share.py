"""A batch where the model makes five samples start 300 processes each (issue 28's attacker, many at
once): each stays within its own limit (100), and all of them within the host's share (350), which
they use up; the orchestrator and the host go on, and no sample is lost: one whose sandbox could not
start in the full share is left for the next command, which finishes it. The run is a `hermes-batch`
in a cgroup namespace of its own, so that the share it sets and uses up is not the one the rest of
this machine's sandboxes share."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_core.sandbox.cgroups import Hierarchy, detect
from batch_runs import ledger_records, write_dataset
from cgroup_folders import own_cgroup_folders
from procs import marker
from upstreams import Upstream, attacker

BIN = Path(sys.executable).parent
SHARE, OWN = 350, 100  # processes: the host's share of this run's sandboxes, and each session's own limit
TAG = marker()
CALLS = {
    **{f"greedy-{n}": ("terminal", {"command": f"for i in $(seq 300); do sleep {TAG} & done 2>/dev/null; sleep 4"})
       for n in range(5)},
    **{f"fine-{n}": ("terminal", {"command": f"echo fine-{n}"}) for n in range(4)},
}
attacker_upstream = attacker(CALLS)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or detect() is None,
                                reason="a cgroup namespace of the test's own, with its controllers, needs root")


@pytest.fixture
def own_cgroups() -> Iterator[tuple[Hierarchy, list[Path]]]:
    """Cgroup folders of this test's own (cgroup_folders.py): the host's hierarchy, as a process in them
    sees it from its own cgroup namespace, and the folders, as this process sees them."""
    host = detect()
    with own_cgroup_folders(host) as own:
        yield host, list(own.mounts.values())


def namespaced(host: Hierarchy, folders: list[Path], argv: list[str]) -> list[str]:
    """`argv` run in `folders` (one per controller), in a cgroup and a mount namespace of its own where
    the controllers are mounted again at their usual places: there, `folders` are their roots."""
    mounts = {line.split()[1]: line.split() for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.split()[2] in ("cgroup", "cgroup2")}
    remount = " && ".join(f"umount {point} && mount -t {mounts[str(point)][2]} -o {mounts[str(point)][3]} cgroup {point}"
                          for point in host.mounts.values())
    enter = " && ".join(f"echo $$ > {folder / 'cgroup.procs'}" for folder in folders)
    inner = f'{remount} && exec "$@"'
    return ["sh", "-c", f'{enter} && exec unshare --cgroup --mount --propagation private sh -c {shlex.quote(inner)} sh '
            '"$@"', "sh", *argv]


def run(home: Path, upstream: Upstream, host: Hierarchy, folders: list[Path], rows: list[dict]) -> int:
    dataset = write_dataset(home / "greedy.jsonl", rows)
    (home / "dist.yaml").write_text("distributions:\n  attack:\n    description: terminal\n"
                                    "    toolsets: {terminal: 100}\n")
    env = {**os.environ, "HERMES_SANDBOX_HOST_PIDS": str(SHARE), "HERMES_SANDBOX_PIDS": str(OWN),
           "HERMES_SANDBOX_STATE_ROOT": str(home / "sandboxes")}
    argv = [str(BIN / "hermes-batch"), f"--dataset_file={dataset}", "--run_name=greedy",
            f"--base_url={upstream.base_url}", "--api_key=k", "--model=attacker",
            f"--distributions_file={home / 'dist.yaml'}", "--distribution=attack", "--max_retries=0",
            f"--num_workers={len(rows)}"]
    done = subprocess.run(namespaced(host, folders, argv), env=env, capture_output=True, text=True, timeout=300)
    print(done.stderr[-3000:])  # shown if the test fails
    return done.returncode


def test_greedy_samples_use_up_their_share_and_nothing_else(isolated_homes, attacker_upstream, own_cgroups):
    host, folders = own_cgroups
    pids = next(folder for folder, controller in zip(folders, host.mounts) if controller in ("pids", ""))
    peak, done = [0], threading.Event()

    def watch() -> None:  # what the run's sandboxes hold together, seen from outside its namespace
        while not done.wait(0.05):
            try:
                peak[0] = max(peak[0], int((pids / "hermes-foundry" / "pids.current").read_text()))
            except (OSError, ValueError):
                pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    rows = [{"prompt": f"Go [attack={name}]"} for name in CALLS]
    try:
        first = run(isolated_homes, attacker_upstream, host, folders, rows)
    finally:
        done.set()
        watcher.join()
    assert (pids / "hermes-foundry" / "pids.max").read_text().strip() == str(SHARE)
    assert OWN < peak[0] <= SHARE  # the greedy ones together reached the share (1,500 processes asked for)
    records = {record["prompt_index"]: record for record in ledger_records(isolated_homes / "data" / "greedy")}
    # Every sample either has a final record, or its sandbox could not start in a full share: it
    # stays pending (failed_retryable), for the next command; none is lost or kept as broken data.
    assert {record["disposition"] for record in records.values()} <= {"kept", "failed_retryable"}
    assert first in (0, 1)
    assert subprocess.run(["true"]).returncode == 0  # this process starts processes as ever

    assert run(isolated_homes, attacker_upstream, host, folders, rows) == 0  # resumed: the rest is done now
    records = {record["prompt_index"]: record for record in ledger_records(isolated_homes / "data" / "greedy")}
    assert {index for index, record in records.items() if record["disposition"] == "kept"} == set(range(len(CALLS)))
