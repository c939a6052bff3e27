"""The real daemon: runs queued by `dagster job launch` (QueuedRunCoordinator, as in deploy/docker and
deploy/k8s) are dequeued and launched by `dagster-daemon run`, and the model-endpoint pool keeps two
runs' batches from driving the endpoint at the same time."""

from __future__ import annotations

import json
import os
import subprocess

import dagster as dg
import yaml

from hermes_assets.cli import batch_main
from hermes_core.config import data_root
from hermes_core.batch.ledger import Ledger
from dagster_runs import DAGSTER, ROOT, launch, story, wait_for


def step_window(run_id: str, step_suffix: str) -> tuple[float, float]:
    events = {e.dagster_event_type: e.timestamp for e in dg.DagsterInstance.get().all_logs(run_id)
              if e.dagster_event and (e.step_key or "").endswith(step_suffix)}
    return events[dg.DagsterEventType.STEP_START], events[dg.DagsterEventType.STEP_SUCCESS]


def test_the_daemon_launches_queued_runs_and_the_pool_runs_their_batches_one_at_a_time(isolated_homes, sim_url):
    home = isolated_homes / "dagster_home"
    (home / "dagster.yaml").write_text(yaml.safe_dump({
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"},
        "concurrency": {"pools": {"default_limit": 1}, "runs": {"max_concurrent_runs": 4}},
        "telemetry": {"enabled": False}}))
    data_root().mkdir(parents=True)
    dataset = data_root() / "d.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"Run a command that prints {i} [sim:latency=0.3]"}) + "\n"
                               for i in range(4)))
    assert batch_main([f"--dataset_file={dataset}", "--run_name=dm", f"--base_url={sim_url}", "--api_key=k",
                       "--distribution=terminal_only", "--batch_size=2", "--plan_only"]) == 0
    keys = [b["key"] for b in json.loads((data_root() / "dm" / "batches.json").read_text())["batches"]]
    run_ids = [launch("dm__batch_job", home, {"dagster/partition": key}) for key in keys]
    instance = dg.DagsterInstance.get()
    assert [instance.get_run_by_id(r).status for r in run_ids] == [dg.DagsterRunStatus.QUEUED] * 2

    daemon = subprocess.Popen([DAGSTER + "-daemon", "run", "-w", str(ROOT / "workspace.yaml")],
                              cwd=ROOT, env={**os.environ, "DAGSTER_HOME": str(home)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        runs = [wait_for(run_id, timeout=240) for run_id in run_ids]
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    assert [run.status for run in runs] == [dg.DagsterRunStatus.SUCCESS] * 2, [story(r) for r in run_ids]
    first, second = sorted(step_window(run_id, "raw_trajectories") for run_id in run_ids)
    assert first[1] <= second[0], "the pool (limit 1) let two batches drive the endpoint at once"
    records = Ledger(data_root() / "dm" / "raw").latest
    assert len(records) == 4 and {r["dagster_run_id"] for r in records.values()} == set(run_ids)
