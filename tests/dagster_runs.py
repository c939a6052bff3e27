"""Launching runs through a run launcher with the `dagster` CLI, and waiting for them (the docker and
Kubernetes launcher tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg

ROOT = Path(__file__).resolve().parents[1]
DAGSTER = str(Path(sys.executable).with_name("dagster"))


def launch(job: str, home: Path, tags: dict[str, str] | None = None, workspace: Path = ROOT / "workspace.yaml") -> str:
    """`dagster job launch` against the workspace; returns the run id (the launcher starts its worker)."""
    before = {run.run_id for run in dg.DagsterInstance.get().get_runs()}
    command = [DAGSTER, "job", "launch", "-w", str(workspace), "-j", job]
    if tags:
        command += ["--tags", json.dumps(tags)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "DAGSTER_HOME": str(home)})
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = [run for run in dg.DagsterInstance.get().get_runs() if run.run_id not in before]
    return run.run_id


def wait_for(run_id: str, timeout: float = 60) -> dg.DagsterRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = dg.DagsterInstance.get().get_run_by_id(run_id)
        if run and run.is_finished:
            return run
        time.sleep(1)
    raise AssertionError(f"run {run_id} did not finish within {timeout:.0f} s:\n{story(run_id)}")


def story(run_id: str) -> str:
    """The run's last events, for a failure message."""
    logs = [f"{e.dagster_event_type}: {e.message}" + (f" {e.dagster_event.step_failure_data.error.message}"
                                                      if e.dagster_event and e.dagster_event.is_step_failure else "")
            for e in dg.DagsterInstance.get().all_logs(run_id)]
    return "\n".join(logs[-12:])
