"""A batch where a model is the attacker (issue 28): its tool calls write host kernel settings, build
a 1,200-deep folder, send execute_code's channel a 9 MiB request and flood a background command's log
on the host, among innocent samples. The
innocent samples are kept, the attacks change nothing on the host and cost only themselves, the
orchestrator keeps no file descriptor, and the next run on the same state root is unharmed."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_assets.cli import batch_main
from batch_runs import ledger_records, read_jsonl, write_dataset
from host_knobs import KNOBS, knob_writes
from leftover_trees import BUILD_COMMAND, no_deep_tree_left  # noqa: F401 (fixture)
from mounts import tmpfs
from upstreams import Upstream, attacker

BIG_REQUEST = """
from hermes_tools import terminal
print(terminal("echo " + "x" * (9 << 20)).get("error"))
print(terminal("echo still-served")["output"], end="")
"""
INNOCENT = 6
CALLS = {
    "knobs": ("terminal", {"command": knob_writes()[0]}),
    "deep": ("terminal", {"command": BUILD_COMMAND}),
    "rpc": ("execute_code", {"code": BIG_REQUEST}),
    "flood": ("terminal", {"command": "yes flood-the-host-disk", "background": True}),  # logged on the host
    **{f"fine-{n}": ("terminal", {"command": f"echo fine-{n}"}) for n in range(INNOCENT)},
}
DISTRIBUTIONS = "distributions:\n  attack:\n    description: terminal and code\n" \
                "    toolsets: {terminal: 100, code_execution: 100}\n"
# A flood, then a call that keeps the session on while the flood is logged.
FLOOD_ON = [CALLS["flood"], ("terminal", {"command": "sleep 2"})]
attacker_upstream = attacker({**CALLS, "flood-on": FLOOD_ON})


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def run(home: Path, upstream: Upstream, name: str, rows: list[dict]) -> int:
    dataset = write_dataset(home / f"{name}.jsonl", rows)
    (home / "dist.yaml").write_text(DISTRIBUTIONS)
    return batch_main([f"--dataset_file={dataset}", f"--run_name={name}", f"--base_url={upstream.base_url}",
                       "--api_key=k", "--model=attacker", f"--distributions_file={home / 'dist.yaml'}",
                       "--distribution=attack", "--max_retries=0", "--num_workers=4"])


def test_attacks_cost_only_themselves(isolated_homes, attacker_upstream, monkeypatch, no_deep_tree_left):
    state_root = isolated_homes / "sandboxes"
    monkeypatch.setenv("HERMES_SANDBOX_STATE_ROOT", str(state_root))
    monkeypatch.setenv("HERMES_SANDBOX_DISK_MB", "64")  # room for the 9 MiB request
    knobs_before = {knob: Path(knob).read_text() for knob in KNOBS if Path(knob).exists() and "trigger" not in knob}
    fds_before = open_fds()

    assert run(isolated_homes, attacker_upstream, "hostile", [{"prompt": f"Go [attack={name}]"} for name in CALLS]) == 0
    run_dir = isolated_homes / "data" / "hostile"
    records = {record["prompt_index"]: record for record in ledger_records(run_dir)}
    assert [records[index]["disposition"] for index in range(len(CALLS))] == ["kept"] * len(CALLS)
    outputs = {row["prompt_index"]: next(turn["value"] for turn in row["conversations"] if turn["from"] == "tool")
               for row in read_jsonl(run_dir / "trajectories.jsonl")}
    assert "WROTE" not in outputs[0] and outputs[0].count("Read-only file system") == knob_writes()[1]
    assert "built" in outputs[1]
    assert "is larger than 1 MiB" in outputs[2] and "still-served" in outputs[2], outputs[2]
    assert '"session_id"' in outputs[3], outputs[3]  # started; its log stops at the (small) disk quota
    assert [f"fine-{n}" in outputs[4 + n] for n in range(INNOCENT)] == [True] * INNOCENT
    assert {knob: Path(knob).read_text() for knob in knobs_before} == knobs_before
    assert open_fds() == fds_before  # every sandbox, server and channel fd released

    # The next run on the same state root starts and ends cleanly: nothing left to trip over.
    assert run(isolated_homes, attacker_upstream, "after", [{"prompt": "Go [attack=fine-0]"}]) == 0
    stats = json.loads((isolated_homes / "data" / "after" / "statistics.json").read_text())
    assert stats["counts"]["kept"] == 1 and stats["sandbox"]["failed"] == 0
    assert open_fds() == fds_before


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB file system of its own (a tmpfs), unmounted at the end of the test."""
    with tmpfs(tmp_path / "small", 8) as point:
        yield point


def test_floods_of_many_samples_leave_the_hosts_disk_its_reserve(isolated_homes, attacker_upstream, monkeypatch,
                                                                 small_disk):
    """Four samples flood their background logs at once, each within its own quota (64 MB, more than
    the 8 MiB file system their state is on): together they stop at the file system's reserve (a tenth
    of it), every sample is kept, and the orchestrator's file descriptors come back."""
    monkeypatch.setenv("HERMES_SANDBOX_STATE_ROOT", str(small_disk / "sandboxes"))
    monkeypatch.setenv("HERMES_SANDBOX_DISK_MB", "64")
    disk = os.statvfs(small_disk)
    size, reserve = disk.f_blocks * disk.f_frsize, disk.f_blocks * disk.f_frsize // 10
    lowest, done = [size], threading.Event()

    def watch() -> None:
        while not done.wait(0.001):
            free = os.statvfs(small_disk)
            lowest[0] = min(lowest[0], free.f_bavail * free.f_frsize)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    fds_before = open_fds()
    try:
        assert run(isolated_homes, attacker_upstream, "floods",
                   [{"prompt": f"Go [attack=flood-on] {n}"} for n in range(4)] + [{"prompt": "Go [attack=fine-0]"}]) == 0
    finally:
        done.set()
        watcher.join()
    records = ledger_records(isolated_homes / "data" / "floods")
    assert sorted(record["disposition"] for record in records) == ["kept"] * 5
    # The floods reached the reserve and kept it: at most one 64 KiB read per flood (and its note) past it.
    assert reserve - 4 * (65536 + 4096) <= lowest[0] <= reserve + (1 << 20), (lowest[0], reserve)
    assert open_fds() == fds_before
