"""Runs launched through dagster-docker's DockerRunLauncher on a real engine (the CI's own dockerd,
scripts/dockerd.sh), with the instance on PostgreSQL: the plan job, then a batch whose tools run in
sibling sandbox containers through the engine's socket."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from hermes_assets.cli import batch_main
from hermes_core.config import data_root
from hermes_core.batch.ledger import Ledger
from hermes_core.sandbox.docker_engine import engine_location
from code_image import BUILD, SANDBOX_IMAGE, engine_answers, remove_code_image
from dagster_runs import launch, story, wait_for
from postgres_server import postgres_url  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not engine_answers(), reason=f"no Docker engine with {SANDBOX_IMAGE} ({engine_location()}; "
                                "`make test` starts one as root: scripts/dockerd.sh and scripts/test_images.sh)")


@pytest.fixture(scope="module")
def code_image() -> Iterator[str]:
    yield BUILD.result()  # started when this test was collected (tests/conftest.py)
    remove_code_image()


def test_runs_launched_into_containers_succeed_and_their_sandboxes_work(postgres_url, code_image, isolated_homes,
                                                                        sim_url, tmp_path, monkeypatch) -> None:
    home = isolated_homes / "dagster_home"
    config = yaml.safe_load((ROOT / "deploy/docker/dagster.yaml").read_text())
    volumes = [f"{ROOT}:{ROOT}:ro", f"{data_root()}:{data_root()}"]
    docker_host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    socket_path = docker_host.removeprefix("unix://")
    config["run_launcher"]["config"]["container_kwargs"].update(
        volumes=[*volumes, f"{socket_path}:{socket_path}"], working_dir=str(ROOT))
    # Launch at once: in a deployment the daemon dequeues runs (`dagster-daemon run`); here no daemon runs.
    config["run_coordinator"] = {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    data_root().mkdir(parents=True, exist_ok=True)
    for name, value in {"DAGSTER_POSTGRES_URL": postgres_url, "HERMES_CODE_IMAGE": code_image,
                        "HERMES_BASE_URL": sim_url, "HERMES_API_KEY": "k", "HERMES_TERMINAL_BACKEND": "docker",
                        "DOCKER_HOST": docker_host}.items():
        monkeypatch.setenv(name, value)
    dataset = data_root() / "d.jsonl"  # the run container sees the data root only
    dataset.write_text("".join(json.dumps({"prompt": f"Run a command that prints {i}", "image": SANDBOX_IMAGE}) + "\n"
                               for i in range(3)))
    # The CLI saves the run's recipe and plans it (in process); the code location then defines its jobs.
    assert batch_main([f"--dataset_file={dataset}", "--run_name=dock", f"--base_url={sim_url}", "--api_key=k",
                       "--distribution=terminal_only", "--batch_size=3", "--plan_only"]) == 0
    plan = wait_for(launch("dock__plan_job", home))
    assert plan.status == dg.DagsterRunStatus.SUCCESS, story(plan.run_id)
    batch = json.loads((data_root() / "dock" / "batches.json").read_text())["batches"][0]["key"]
    run = wait_for(launch("dock__batch_job", home, {"dagster/partition": batch}))
    assert run.status == dg.DagsterRunStatus.SUCCESS, story(run.run_id)
    records = Ledger(data_root() / "dock" / "raw").latest
    assert len(records) == 3 and all(r["disposition"] == "kept" and r["sandbox_created"] for r in records.values())
    assert {r["dagster_run_id"] for r in records.values()} == {run.run_id}
    launched = [e for e in dg.DagsterInstance.get().all_logs(run.run_id) if "Launching run in a new container" in (e.message or "")]
    assert launched  # the run worker was a container, not a process of this host
