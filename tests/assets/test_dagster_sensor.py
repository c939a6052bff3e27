"""Scheduled backfills: the dataset sensor of a run, evaluated against the real Dagster instance the
CLI used, with every requested run executed as the daemon would (its job, partition and tags)."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from hermes_assets.cli import batch_main
from hermes_assets.definitions import build_definitions
from hermes_assets.resources import ModelEndpointResource
from hermes_assets.sensors import (
    build_run_sensor, dataset_state, finalize_job_name, plan_job_name, raw_job_name,
)
from hermes_core.config import data_root
from hermes_core.batch.recipe import load_recipe

PROMPTS = [{"prompt": f"Run a command that prints {i}", "id": f"p{i}"} for i in range(4)]
NEW_ROWS = [{"prompt": f"Run a command that prints new {i}"} for i in range(3)]


def write_rows(path: Path, rows: list[dict], mode: str = "w") -> None:
    with open(path, mode) as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)


def cli(dataset: Path, url: str, *extra: str) -> int:
    return batch_main([f"--dataset_file={dataset}", "--run_name=t1", f"--base_url={url}", "--api_key=k",
                       "--batch_size=2", "--num_workers=3", "--distribution=terminal_only", *extra])


def ledger(run_dir: Path) -> list[dict]:
    return [json.loads(line) for path in sorted((run_dir / "raw").glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


def batch_keys(run_dir: Path) -> list[str]:
    return [b["key"] for b in json.loads((run_dir / "batches.json").read_text())["batches"]]


class Daemon:
    """Ticks the sensor like the daemon: carries the cursor forward, executes the requested runs."""

    def __init__(self, defs: dg.Definitions, instance: dg.DagsterInstance, sensor_name: str = "t1__dataset_sensor"):
        self.defs, self.instance, self.cursor = defs, instance, None
        self.sensor = defs.resolve_sensor_def(sensor_name)

    def tick(self) -> tuple[list[dg.RunRequest], str | None]:
        # instance_ref too: the daemon's context has one, and partitioned requests are validated through it.
        context = dg.build_sensor_context(instance=self.instance, instance_ref=self.instance.get_ref(),
                                          definitions=self.defs, cursor=self.cursor)
        data = self.sensor.evaluate_tick(context)
        self.cursor = data.cursor
        for request in data.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return list(data.run_requests or []), data.skip_message

    def execute(self, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        job = self.defs.resolve_job_def(request.job_name)
        return job.execute_in_process(instance=self.instance, partition_key=request.partition_key,
                                      tags=request.tags, raise_on_error=False)


def test_new_rows_are_planned_then_only_their_batches_run_then_the_run_is_finalized(isolated_homes, sim_url):
    dataset = isolated_homes / "d.jsonl"
    write_rows(dataset, PROMPTS)
    assert cli(dataset, sim_url) == 0
    run_dir = data_root() / "t1"
    old_batches, old_records = batch_keys(run_dir), ledger(run_dir)
    assert len(old_records) == 4

    daemon = Daemon(build_definitions(), dg.DagsterInstance.get())
    requests, skip = daemon.tick()
    assert requests == [] and "up to date" in skip  # the CLI left nothing to do

    write_rows(dataset, NEW_ROWS, mode="a")
    requests, _ = daemon.tick()
    assert [r.job_name for r in requests] == [plan_job_name("t1")]
    again, skip = daemon.tick()  # evaluated again before the run happened: no second request
    assert again == [] and "planning" in skip
    assert daemon.execute(requests[0]).success

    requests, _ = daemon.tick()
    new_batches = [key for key in batch_keys(run_dir) if key not in old_batches]
    assert len(new_batches) == 2  # 3 new rows, batch_size 2
    assert {r.job_name for r in requests} == {raw_job_name("t1")}
    assert sorted(r.partition_key for r in requests) == sorted(new_batches)
    assert len({r.run_key for r in requests}) == len(requests)
    assert daemon.tick()[0] == []  # idempotent while the runs are outstanding
    for request in requests:
        assert daemon.execute(request).success

    records = ledger(run_dir)
    new_records = records[len(old_records):]
    prompts = [json.loads(line) for line in (run_dir / "prompts.jsonl").read_text().splitlines()]
    new_keys = {p["sample_key"] for p in prompts if p["prompt"].startswith("Run a command that prints new")}
    assert len(records) == 7 and [r["sample_key"] for r in records[:4]] == [r["sample_key"] for r in old_records]
    assert {r["sample_key"] for r in new_records} == new_keys and len(new_records) == 3

    requests, _ = daemon.tick()
    assert [r.job_name for r in requests] == [finalize_job_name("t1")]
    final = daemon.execute(requests[0])
    assert final.success
    assert {e.check_name for e in final.get_asset_check_evaluations()} >= {"every_sample_accounted_for"}
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["counts"]["kept"] == 7 and stats["counts"]["pending"] == 0
    requests, skip = daemon.tick()
    assert requests == [] and "up to date" in skip
    assert len(ledger(run_dir)) == 7  # no sample was paid for twice


def test_a_failed_batch_is_retried_until_terminal_then_finalized(isolated_homes, sim_url):
    dataset = isolated_homes / "d.jsonl"
    write_rows(dataset, PROMPTS[:1])
    assert cli(dataset, sim_url, "--max_attempts=2") == 0
    run_dir = data_root() / "t1"
    fast = ModelEndpointResource(max_retries=0, backoff_base_s=0.01)  # the failure is scripted: fail fast
    daemon = Daemon(build_definitions(model_endpoint=fast), dg.DagsterInstance.get())
    assert daemon.tick()[0] == []

    write_rows(dataset, [{"prompt": "Run ls [sim:always-fail]"}], mode="a")
    assert daemon.execute(daemon.tick()[0][0]).success  # planning
    first, _ = daemon.tick()
    assert len(first) == 1
    assert not daemon.execute(first[0]).success  # a retryable failure fails the step
    assert daemon.instance.get_status_by_partition(
        dg.AssetKey(["t1", "raw_trajectories"]), [first[0].partition_key],
        dg.DynamicPartitionsDefinition(name="t1__batches"))[first[0].partition_key] == dg.AssetPartitionStatus.FAILED

    retry, _ = daemon.tick()  # the ledger moved: same partition, new run key
    assert [r.partition_key for r in retry] == [first[0].partition_key] and retry[0].run_key != first[0].run_key
    assert daemon.execute(retry[0]).success  # second attempt: failed_terminal, the batch is done
    finalize, _ = daemon.tick()
    assert [r.job_name for r in finalize] == [finalize_job_name("t1")]
    assert daemon.execute(finalize[0]).success
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["counts"]["failed_terminal"] == 1 and stats["counts"]["pending"] == 0


def test_batches_unknown_to_the_instance_are_registered(isolated_homes, sim_url, monkeypatch):
    """A run folder planned against another Dagster instance: the sensor registers its pending batches."""
    dataset = isolated_homes / "d.jsonl"
    write_rows(dataset, PROMPTS[:2])
    assert cli(dataset, sim_url) == 0
    write_rows(dataset, NEW_ROWS[:1], mode="a")
    with dg.instance_for_test() as other:  # plan on another instance
        daemon = Daemon(build_definitions(), other)
        assert daemon.execute(daemon.tick()[0][0]).success
    daemon = Daemon(build_definitions(), dg.DagsterInstance.get())
    requests, _ = daemon.tick()
    assert len(requests) == 1
    assert requests[0].partition_key in daemon.instance.get_dynamic_partitions("t1__batches")
    assert daemon.execute(requests[0]).success


def test_dataset_hash_is_reused_while_size_and_mtime_stand_still(tmp_path):
    path = tmp_path / "d.jsonl"
    write_rows(path, PROMPTS)
    state = dataset_state(path, None)
    assert dataset_state(path, {**state, "sha256": "cached"})["sha256"] == "cached"  # no re-hash
    write_rows(path, NEW_ROWS, mode="a")
    assert dataset_state(path, {**state, "sha256": "cached"})["sha256"] not in ("cached", state["sha256"])


def test_sensor_is_stopped_by_default_with_a_configurable_interval(isolated_homes, sim_url, monkeypatch):
    dataset = isolated_homes / "d.jsonl"
    write_rows(dataset, PROMPTS[:1])
    assert cli(dataset, sim_url) == 0
    recipe = load_recipe(data_root(), "t1")
    sensor = build_run_sensor(recipe, data_root(), minimum_interval_seconds=5)
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED and sensor.minimum_interval_seconds == 5
    monkeypatch.setenv("HERMES_SENSOR_INTERVAL_S", "900")
    defs = build_definitions()
    assert defs.resolve_sensor_def("t1__dataset_sensor").minimum_interval_seconds == 900
    assert {plan_job_name("t1"), raw_job_name("t1"), finalize_job_name("t1")} <= {
        job.name for job in defs.resolve_all_job_defs()}
    monkeypatch.setenv("HERMES_SENSOR_INTERVAL_S", "soon")
    with pytest.raises(ValueError, match="HERMES_SENSOR_INTERVAL_S"):
        build_definitions()


def test_a_batch_in_flight_is_not_requested_again(isolated_homes, sim_url):
    dataset = isolated_homes / "d.jsonl"
    write_rows(dataset, PROMPTS[:1])
    assert cli(dataset, sim_url) == 0
    daemon = Daemon(build_definitions(), dg.DagsterInstance.get())
    daemon.tick()
    write_rows(dataset, NEW_ROWS[:1], mode="a")
    assert daemon.execute(daemon.tick()[0][0]).success
    daemon.cursor = None  # forget what was requested: only the instance's view of the run stops a duplicate
    (request,), _ = daemon.tick()
    job = daemon.defs.resolve_job_def(request.job_name)
    daemon.instance.create_run_for_job(job, tags={"dagster/partition": request.partition_key},
                                       asset_selection=frozenset({dg.AssetKey(["t1", "raw_trajectories"])}))
    daemon.cursor = None
    requests, skip = daemon.tick()
    assert requests == [] and "in flight" in skip
