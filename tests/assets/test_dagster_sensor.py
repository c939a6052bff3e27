"""Scheduled backfills: the dataset sensor of a run, evaluated against the real Dagster instance the
CLI used, with every requested run executed as the daemon would (its job, partition and tags)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import DagsterEvent

from hermes_assets.cli import batch_main
from hermes_assets.datasets_sensor import DATASETS_SENSOR
from hermes_assets.definitions import build_definitions
from hermes_assets.launch import job_origin
from hermes_assets.resources import ModelEndpointResource
from hermes_assets.slots import PID_TAG
from hermes_assets.versions import dataset_state
from hermes_assets.sensors import (
    CHAIN_SENSOR, REFRESH_TAG, build_dataset_sensor, finalize_job_name, plan_job_name, raw_job_name,
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
    """Ticks a sensor like the daemon: carries the cursor forward, applies its partition requests, executes
    the requested runs (their job, partition range and tags), and skips a run key it already launched."""

    def __init__(self, defs: dg.Definitions, instance: dg.DagsterInstance, sensor_name: str = "t1__dataset_sensor"):
        self.defs, self.instance, self.cursor, self.launched = defs, instance, None, set()
        self.sensor = defs.resolve_sensor_def(sensor_name)

    def tick(self) -> tuple[list[dg.RunRequest], str | None]:
        # instance_ref too: the daemon's context has one, and partitioned requests are validated through it.
        context = dg.build_sensor_context(instance=self.instance, instance_ref=self.instance.get_ref(),
                                          definitions=self.defs, cursor=self.cursor)
        data = self.sensor.evaluate_tick(context)
        self.cursor = data.cursor
        for request in data.dynamic_partitions_requests or []:
            if isinstance(request, dg.AddDynamicPartitionsRequest):
                self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            else:
                for key in request.partition_keys:
                    self.instance.delete_dynamic_partition(request.partitions_def_name, key)
        fresh = [r for r in data.run_requests or [] if r.run_key not in self.launched]
        self.launched |= {r.run_key for r in fresh}  # the daemon creates the run in the same tick
        return fresh, data.skip_message

    def execute(self, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        job = self.defs.resolve_job_def(request.job_name)
        return job.execute_in_process(instance=self.instance, partition_key=request.partition_key,
                                      tags=request.tags, raise_on_error=False)

    def follow(self, result: dg.ExecuteInProcessResult) -> dg.RunRequest | dg.SkipReason:
        """What the refresh chain requests after this run succeeded."""
        chain = self.defs.resolve_sensor_def(CHAIN_SENSOR)
        run = self.instance.get_run_by_id(result.run_id)
        event = next(e for e in self.instance.all_logs(run.run_id) if e.dagster_event_type == "PIPELINE_SUCCESS")
        context = dg.build_run_status_sensor_context(
            sensor_name=CHAIN_SENSOR, dagster_instance=self.instance, dagster_run=run,
            dagster_event=event.dagster_event, context=None)
        return chain._run_status_sensor_fn(context)  # noqa: SLF001 - the sensor's body, as the daemon calls it


def queued_run(instance: dg.DagsterInstance, job: dg.JobDefinition, tags: dict[str, str]) -> dg.DagsterRun:
    """A run waiting in the run queue, enqueued as the queued run coordinator does it (a run created
    queued needs a code location's origin)."""
    run = instance.create_run_for_job(job, tags=tags, remote_job_origin=job_origin(job.name))
    instance.report_dagster_event(DagsterEvent.job_enqueue(run), run_id=run.run_id)
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.QUEUED
    return run


def batch_range(request: dg.RunRequest) -> tuple[str, str]:
    return request.tags["dagster/asset_partition_range_start"], request.tags["dagster/asset_partition_range_end"]


def test_new_rows_are_planned_then_their_batches_run_in_one_run_then_the_run_is_finalized(isolated_homes, sim_url):
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
    (plan,), _ = daemon.tick()
    assert plan.job_name == plan_job_name("t1") and plan.tags["hermes/run"] == "t1"
    assert daemon.tick()[0] == []  # evaluated again before the run happened: the same run key, not launched twice
    registered = daemon.instance.get_dynamic_partitions("t1__batches")
    assert len(registered) == len(old_batches) + 2  # the new rows' batches are listed before they are planned
    assert daemon.execute(plan).success
    new_batches = [key for key in batch_keys(run_dir) if key not in old_batches]
    assert new_batches == registered[len(old_batches):]  # planning made exactly the batches registered

    (batches,), _ = daemon.tick()  # every pending batch in ONE run
    assert batches.job_name == raw_job_name("t1") and batch_range(batches) == (new_batches[0], new_batches[-1])
    assert daemon.tick()[0] == []  # idempotent while the run is outstanding
    assert daemon.execute(batches).success

    records = ledger(run_dir)
    new_records = records[len(old_records):]
    prompts = [json.loads(line) for line in (run_dir / "prompts.jsonl").read_text().splitlines()]
    new_keys = {p["sample_key"] for p in prompts if p["prompt"].startswith("Run a command that prints new")}
    assert len(records) == 7 and [r["sample_key"] for r in records[:4]] == [r["sample_key"] for r in old_records]
    assert {r["sample_key"] for r in new_records} == new_keys and len(new_records) == 3

    (final,), _ = daemon.tick()
    assert final.job_name == finalize_job_name("t1")
    finished = daemon.execute(final)
    assert finished.success
    assert {e.check_name for e in finished.get_asset_check_evaluations()} >= {"every_sample_accounted_for"}
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["counts"]["kept"] == 7 and stats["counts"]["pending"] == 0
    for export in ("hf_dataset", "trl_messages"):  # refreshed with the rest: an idle group is all fresh
        event = daemon.instance.get_latest_materialization_event(dg.AssetKey(["t1", export]))
        assert event is not None and event.run_id == finished.run_id, export
    requests, skip = daemon.tick()
    assert requests == [] and "up to date" in skip
    assert len(ledger(run_dir)) == 7  # no sample was paid for twice


def test_a_command_that_plans_the_same_rows_again_counts_as_a_finished_planning(isolated_homes, sim_url):
    dataset = isolated_homes / "d.jsonl"
    write_rows(dataset, PROMPTS[:2])
    assert cli(dataset, sim_url) == 0
    run_dir = data_root() / "t1"
    # The next command takes the full path: it plans again. (A command that ends within 2 s of the
    # dataset's last change leaves no settled.json: its identity could not vouch for it yet.)
    (run_dir / "settled.json").unlink(missing_ok=True)
    assert cli(dataset, sim_url, "--plan_only") == 0  # the same rows: the toolset table is kept as it is
    (request,), _ = Daemon(build_definitions(), dg.DagsterInstance.get()).tick()
    # Planning counts as finished, not as left half done: no plan run again, on to the final assets
    # (the planning materialized prompts after statistics).
    assert request.job_name == finalize_job_name("t1")


def planned_refresh(isolated_homes: Path, sim_url: str) -> tuple[Daemon, dg.ExecuteInProcessResult]:
    """A run of two rows, three rows appended, and the dataset sensor's planning run of them, executed."""
    dataset = isolated_homes / "d.jsonl"
    write_rows(dataset, PROMPTS[:2])
    assert cli(dataset, sim_url) == 0
    daemon = Daemon(build_definitions(), dg.DagsterInstance.get())
    write_rows(dataset, NEW_ROWS, mode="a")
    (plan,), _ = daemon.tick()
    return daemon, daemon.execute(plan)


def test_the_refresh_chain_requests_each_next_phase_once(isolated_homes, sim_url):
    daemon, planned = planned_refresh(isolated_homes, sim_url)
    batches = daemon.follow(planned)  # at once, not at the dataset sensor's next tick
    assert batches.job_name == raw_job_name("t1") and batches.run_key == f"after:{planned.run_id}"
    assert batches.tags["hermes/run"] == "t1" and PID_TAG not in batches.tags
    (due,), _ = daemon.tick()  # the dataset sensor sees the same phase due, for the same refresh state ...
    assert due.tags[REFRESH_TAG] == batches.tags[REFRESH_TAG]
    queued = daemon.instance.create_run_for_job(daemon.defs.resolve_job_def(due.job_name), tags=due.tags)
    assert isinstance(daemon.follow(planned), dg.SkipReason)  # ... so once one of them has a run, the other skips
    daemon.instance.delete_run(queued.run_id)
    ran = daemon.execute(batches)
    final = daemon.follow(ran)
    assert final.job_name == finalize_job_name("t1")
    assert daemon.execute(final).success
    assert daemon.tick()[0] == []
    cli_run = daemon.instance.get_runs(filters=dg.RunsFilter(tags={"hermes/run": "t1"}))[-1]
    assert REFRESH_TAG not in cli_run.tags  # the chain leaves runs it did not start alone
    assert len(ledger(data_root() / "t1")) == 5


def test_the_refresh_chain_waits_while_another_run_of_the_refresh_is_queued_or_going(isolated_homes, sim_url):
    """The chain's next phase is keyed to the state it sees: a batch run that a dataset sensor's tick (or
    the Launchpad) started meanwhile moved that state, so the chain requested the batches a second time,
    then a second finalize run (seen in the UI refresh test)."""
    daemon, planned = planned_refresh(isolated_homes, sim_url)
    launched = queued_run(daemon.instance, daemon.defs.resolve_job_def(raw_job_name("t1")), {"hermes/run": "t1"})
    skipped = daemon.follow(planned)
    assert isinstance(skipped, dg.SkipReason) and launched.run_id in skipped.skip_message
    assert "queued or going" in skipped.skip_message
    daemon.instance.delete_run(launched.run_id)  # gone (say, canceled before it started): the chain goes on
    assert daemon.follow(planned).job_name == raw_job_name("t1")


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
    (first,), _ = daemon.tick()
    assert not daemon.execute(first).success  # a retryable failure fails the step
    partition = batch_range(first)[0]
    assert daemon.instance.get_status_by_partition(
        dg.AssetKey(["t1", "raw_trajectories"]), [partition],
        dg.DynamicPartitionsDefinition(name="t1__batches"))[partition] == dg.AssetPartitionStatus.FAILED

    (retry,), _ = daemon.tick()  # the ledger moved: same batch, new run key
    assert batch_range(retry) == (partition, partition) and retry.run_key != first.run_key
    assert daemon.execute(retry).success  # second attempt: failed_terminal, the batch is done
    (finalize,), _ = daemon.tick()
    assert finalize.job_name == finalize_job_name("t1")
    assert daemon.execute(finalize).success
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
    (request,), _ = daemon.tick()
    start, end = batch_range(request)
    assert start == end and start in daemon.instance.get_dynamic_partitions("t1__batches")
    assert daemon.execute(request).success


def test_the_datasets_sensor_registers_forecast_batches_and_drops_ones_never_planned(isolated_homes, sim_url):
    dataset = isolated_homes / "d.jsonl"
    write_rows(dataset, PROMPTS[:2])
    assert cli(dataset, sim_url) == 0
    planned = batch_keys(data_root() / "t1")
    daemon = Daemon(build_definitions(), dg.DagsterInstance.get(), DATASETS_SENSOR)
    write_rows(dataset, NEW_ROWS, mode="a")
    requests, _ = daemon.tick()
    assert requests == []  # it never launches anything
    forecast = daemon.instance.get_dynamic_partitions("t1__batches")
    assert forecast[:1] == planned and len(forecast) == 3  # 3 new rows, batch_size 2
    early = daemon.defs.resolve_job_def(raw_job_name("t1")).execute_in_process(
        instance=daemon.instance, partition_key=forecast[1], raise_on_error=False)  # before planning ran
    [failure] = [e for e in early.all_events if e.is_step_failure]
    assert "not planned yet: nothing was sent" in failure.step_failure_data.error.message  # the first line
    write_rows(dataset, PROMPTS[:2] + [{"prompt": "another row"}])  # the new rows changed before planning
    daemon.tick()
    now = daemon.instance.get_dynamic_partitions("t1__batches")
    assert now[:1] == planned and len(now) == 2 and not set(now[1:]) & set(forecast[1:])
    assert daemon.tick()[1] and daemon.instance.get_dynamic_partitions("t1__batches") == now  # stable


def test_dataset_hash_is_reused_while_size_and_mtime_stand_still(tmp_path):
    path = tmp_path / "d.jsonl"
    write_rows(path, PROMPTS)
    state = dataset_state(path, None)
    assert dataset_state(path, {**state, "sha256": "cached"})["sha256"] == "cached"  # no re-hash
    write_rows(path, NEW_ROWS, mode="a")
    assert dataset_state(path, {**state, "sha256": "cached"})["sha256"] not in ("cached", state["sha256"])


def test_sensors_default_status_and_configurable_interval(isolated_homes, sim_url, monkeypatch):
    dataset = isolated_homes / "d.jsonl"
    write_rows(dataset, PROMPTS[:1])
    assert cli(dataset, sim_url) == 0
    recipe = load_recipe(data_root(), "t1")
    dataset_sensor = build_dataset_sensor(recipe, data_root(), minimum_interval_seconds=5)
    assert dataset_sensor.default_status == dg.DefaultSensorStatus.STOPPED and dataset_sensor.minimum_interval_seconds == 5
    monkeypatch.setenv("HERMES_SENSOR_INTERVAL_S", "900")
    defs = build_definitions()
    chain, watch = defs.resolve_sensor_def(CHAIN_SENSOR), defs.resolve_sensor_def(DATASETS_SENSOR)
    assert chain.default_status == watch.default_status == dg.DefaultSensorStatus.RUNNING  # they never spend alone
    # One sensor per run, stopped; two for all runs: the daemon calls the code server for each running one.
    assert sorted(sensor.name for sensor in defs.sensors) == [DATASETS_SENSOR, CHAIN_SENSOR, "t1__dataset_sensor"]
    assert defs.resolve_sensor_def("t1__dataset_sensor").minimum_interval_seconds == 900
    hourly = dataclasses.replace(recipe, refresh_interval_s=3600)  # per run, e.g. from the runs file
    assert build_dataset_sensor(hourly, data_root()).minimum_interval_seconds == 3600
    assert hourly.fingerprint() == recipe.fingerprint()  # scheduling changes no sample
    assert {plan_job_name("t1"), raw_job_name("t1"), finalize_job_name("t1")} <= {
        job.name for job in defs.resolve_all_job_defs()}
    monkeypatch.setenv("HERMES_SENSOR_INTERVAL_S", "soon")
    with pytest.raises(ValueError, match="HERMES_SENSOR_INTERVAL_S"):
        build_definitions()


def one_row_appended(isolated_homes: Path, sim_url: str) -> Daemon:
    """A run the CLI finished, its sensor ticked once, then a row appended: the daemon before its next tick."""
    dataset = isolated_homes / "d.jsonl"
    write_rows(dataset, PROMPTS[:1])
    assert cli(dataset, sim_url) == 0
    daemon = Daemon(build_definitions(), dg.DagsterInstance.get())
    daemon.tick()
    write_rows(dataset, NEW_ROWS[:1], mode="a")
    return daemon


def test_a_cli_run_going_holds_the_refresh_chain_of_its_run_only(isolated_homes, sim_url):
    """hermes-batch plans and runs the batches in one run of the asset job, tagged with its run: while
    it goes, the dataset sensor requests no phase of that run; another run's asset job run holds nothing."""
    daemon = one_row_appended(isolated_homes, sim_url)
    asset_job = daemon.defs.resolve_implicit_global_asset_job_def()
    going = {name: daemon.instance.create_run_for_job(asset_job, tags={"hermes/run": name},
                                                      status=dg.DagsterRunStatus.STARTED).run_id
             for name in ("other", "t1")}
    requests, skip = daemon.tick()
    assert requests == [] and f"run(s) {going['t1']} of this refresh are queued or going" in skip
    assert going["other"] not in skip
    daemon.instance.report_run_canceled(daemon.instance.get_run_by_id(going["t1"]))
    (request,), _ = daemon.tick()
    assert request.job_name == "t1__plan_job"


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTED])
def test_a_batch_in_flight_is_not_requested_again(isolated_homes, sim_url, status):
    """Queued counts: Dagster's in-progress statuses leave it out, and a tick in the second before a
    queued run started requested the same phase again (a refresh in the UI ran two finalize runs)."""
    daemon = one_row_appended(isolated_homes, sim_url)
    assert daemon.execute(daemon.tick()[0][0]).success
    (request,), _ = daemon.tick()
    tags = {"dagster/partition": batch_range(request)[0]}  # the Launchpad's
    if status == dg.DagsterRunStatus.QUEUED:
        queued_run(daemon.instance, daemon.defs.resolve_job_def(request.job_name), tags)
    else:
        daemon.instance.create_run_for_job(daemon.defs.resolve_job_def(request.job_name), tags=tags, status=status,
                                           asset_selection=frozenset({dg.AssetKey(["t1", "raw_trajectories"])}))
    daemon.launched.clear()  # forget what was launched: only the instance's view of the run stops a duplicate
    requests, skip = daemon.tick()
    assert requests == [] and "queued or going" in skip
