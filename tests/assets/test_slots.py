"""Unclean exits release what they held (issue 17.1): after `kill -9` or a second Ctrl-C no pool
slot stays claimed and no run stays STARTED, and a run that must wait for a slot says so and stops
on Ctrl-C. Real `hermes-batch` processes against the simulated endpoint and a real instance."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg

from hermes_assets.instance import get_instance
from hermes_assets.resources import MODEL_POOL
from procs import wait_until
from batch_runs import prompts, read_jsonl, write_dataset

BIN = Path(sys.executable).parent


def start(dataset: Path, url: str, run_name: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "hermes-batch"), f"--dataset_file={dataset}", f"--run_name={run_name}", f"--base_url={url}",
         "--distribution=terminal_only", "--batch_size=10", "--num_workers=2"],
        stdout=subprocess.DEVNULL, stderr=log.open("w"))


def recorded(run_dir: Path) -> int:
    """Whole records in the run's ledger (a kill may leave a torn last line: not counted)."""
    return sum(path.read_bytes().count(b"\n") for path in (run_dir / "raw").glob("*.jsonl"))


def runs_of(instance: dg.DagsterInstance, status: dg.DagsterRunStatus) -> list[dg.DagsterRun]:
    return list(instance.get_runs(dg.RunsFilter(statuses=[status])))


def held_slots(instance: dg.DagsterInstance) -> int:
    return instance.event_log_storage.get_concurrency_info(MODEL_POOL).active_slot_count


def test_five_kill_9s_then_another_run_finishes_and_the_killed_run_resumes(isolated_homes, sim_server):
    rows = prompts(40, "slow", latency=0.3)
    dataset = write_dataset(isolated_homes / "slow.jsonl", rows)
    run_dir = isolated_homes / "data" / "killed"
    for attempt in range(5):
        before = recorded(run_dir)
        batch = start(dataset, sim_server.base_url, "killed", isolated_homes / f"killed{attempt}.log")
        assert wait_until(lambda: recorded(run_dir) > before, 90)
        batch.send_signal(signal.SIGKILL)
        batch.wait(timeout=10)
    instance = get_instance()
    # What the kill left: a run STARTED for ever, holding its slot (the next run on this host frees it).
    assert len(runs_of(instance, dg.DagsterRunStatus.STARTED)) == 1 and held_slots(instance) == 1

    other = write_dataset(isolated_homes / "other.jsonl", [{"prompt": f"other {uuid.uuid4().hex[:6]}: run ls"}])
    done = subprocess.run(
        [str(BIN / "hermes-batch"), f"--dataset_file={other}", "--run_name=other", f"--base_url={sim_server.base_url}",
         "--distribution=terminal_only"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "exited without finishing" not in done.stderr and "marked 1 run(s)" in done.stderr
    assert runs_of(instance, dg.DagsterRunStatus.STARTED) == [] and held_slots(instance) == 0
    assert len(runs_of(instance, dg.DagsterRunStatus.FAILURE)) == 5  # each kill's batch run: failed, not running

    resumed = subprocess.run(
        [str(BIN / "hermes-batch"), f"--dataset_file={dataset}", "--run_name=killed",
         f"--base_url={sim_server.base_url}", "--distribution=terminal_only", "--batch_size=10", "--num_workers=4"],
        capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    output = read_jsonl(run_dir / "trajectories.jsonl")
    assert [r["prompt_index"] for r in output] == list(range(len(rows)))  # every prompt, once


def test_a_second_ctrl_c_frees_the_slot_and_fails_the_run(isolated_homes, sim_server):
    dataset = write_dataset(isolated_homes / "slow.jsonl", prompts(40, "slow", latency=0.3))
    run_dir = isolated_homes / "data" / "twice"
    log = isolated_homes / "twice.log"
    batch = start(dataset, sim_server.base_url, "twice", log)
    assert wait_until(lambda: recorded(run_dir) > 0, 90)
    batch.send_signal(signal.SIGINT)
    assert wait_until(lambda: "finishing the samples in flight" in log.read_text(), 10)
    batch.send_signal(signal.SIGINT)
    assert batch.wait(timeout=20) == 130
    instance = get_instance()
    assert runs_of(instance, dg.DagsterRunStatus.STARTED) == [] and held_slots(instance) == 0
    assert len(runs_of(instance, dg.DagsterRunStatus.FAILURE)) == 1


def test_a_run_waiting_for_a_slot_says_so_and_stops_on_ctrl_c(isolated_homes, sim_server):
    dataset = write_dataset(isolated_homes / "slow.jsonl", prompts(40, "slow", latency=1.0))
    holder = start(dataset, sim_server.base_url, "holder", isolated_homes / "holder.log")
    try:
        assert wait_until(lambda: (isolated_homes / "data" / "holder" / "raw").exists(), 90)
        instance = get_instance()
        instance.event_log_storage.set_concurrency_slots(MODEL_POOL, 1)
        assert wait_until(lambda: held_slots(instance) == 1, 30)
        waiting_log = isolated_homes / "waiting.log"
        few = write_dataset(isolated_homes / "w.jsonl", prompts(3, "slow", latency=0.3))
        waiting = start(few, sim_server.base_url, "waiting", waiting_log)
        assert wait_until(lambda: "waiting for a slot in pool 'hermes_model_endpoint'" in waiting_log.read_text(), 60)
        started = time.monotonic()
        waiting.send_signal(signal.SIGINT)
        assert waiting.wait(timeout=15) == 130 and time.monotonic() - started < 15
        assert recorded(isolated_homes / "data" / "waiting") == 0  # nothing was sent
    finally:
        holder.kill()
        holder.wait(timeout=10)
