"""Scheduled backfills in one tick, as a Dagster user sees them (issue 18, item 3): a real `dagster dev`
(webserver, daemon, code server), the run's dataset sensor turned on through the GraphQL API, 7 rows
appended to the dataset; one tick starts the refresh, the refresh chain runs their batch in one run and
then refreshes the statistics, while the UI shows the statistics stale, then fresh. Meanwhile a second run,
with its own endpoint, gets rows appended and "Materialize all": the backfill daemon's passes (one every
30 s) overlap the refresh instead of following it."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg

from hermes_assets.checks import CURRENT_CHECK
from hermes_assets.cli import batch_main
from hermes_assets.sensors import REFRESH_TAG
from hermes_core.config import data_root
from hermes_core.endpoints.simulated import SimulatedModelServer
from batch_runs import write_dataset
from dagster_ui import LOCATION, REPOSITORY, SharedDev, graphql, reload_location

START = """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) {
  __typename ... on Sensor { id sensorState { status } } ... on PythonError { message } } }"""
BACKFILL = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } ... on Error { message } } }"""
STOP = """mutation($id: String!) { stopSensor(id: $id) { __typename } }"""
PARTITIONS = """query($s: AssetKeyInput!) { assetNodeOrError(assetKey: $s) { ... on AssetNode { partitionKeys } } }"""
NODES = """query($keys: [AssetKeyInput!]) { assetNodes(assetKeys: $keys) {
  assetKey { path } staleStatus dataVersion staleCauses { key { path } reason } } }"""


def asset_states(port: int, run: str, *names: str) -> dict[str, dict]:
    keys = [{"path": [run, name]} for name in names]
    return {node["assetKey"]["path"][-1]: node for node in graphql(port, NODES, {"keys": keys})["assetNodes"]}


def currency_check(instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation:
    key = dg.AssetCheckKey(dg.AssetKey(["all", "filtered_trajectories"]), CURRENT_CHECK)
    return instance.get_latest_asset_check_evaluation_record(key).evaluation


def runs_of(instance: dg.DagsterInstance, run: str, since: float) -> list[dg.DagsterRun]:
    return [record.dagster_run for record in instance.get_run_records(dg.RunsFilter(tags={"hermes/run": run}))
            if record.create_timestamp.timestamp() >= since]


def finished_refresh(instance: dg.DagsterInstance, since: float) -> list[dg.DagsterRun] | None:
    """The refresh's runs once its final-assets run ended, else None."""
    runs = [r for r in runs_of(instance, "ui", since) if REFRESH_TAG in r.tags]
    return runs if any(r.job_name == "ui__finalize_job" and r.is_finished for r in runs) else None


def done_run(run: str, base_url: str) -> Path:
    """Run `run` over 4 rows with hermes-batch; returns its dataset."""
    dataset = write_dataset(data_root() / f"{run}.jsonl",
                            [{"prompt": f"Run a command that prints {i}"} for i in range(4)])
    assert batch_main([f"--dataset_file={dataset}", f"--run_name={run}", f"--base_url={base_url}",
                       "--api_key=k", "--distribution=terminal_only", "--batch_size=10"]) == 0
    return dataset


def test_appended_rows_are_refreshed_in_one_tick_with_one_batch_run(ui_dev: SharedDev, sim_server):
    data_root().mkdir(parents=True, exist_ok=True)
    dataset = done_run("ui", sim_server.base_url)
    abandoned = threading.Event()
    with SimulatedModelServer() as other, ThreadPoolExecutor(1) as background:
        backfilled = done_run("all", other.base_url)  # its own endpoint: each part counts only its requests
        port = ui_dev.port()  # `make dev`, with HERMES_SENSOR_INTERVAL_S=5
        assert reload_location(port)["locationOrLoadError"]["__typename"] == "RepositoryLocation"  # both runs
        materialized = background.submit(materialize_all_after_appending, port, other, backfilled, abandoned)
        try:
            refresh_by_the_dataset_sensor(port, sim_server, dataset)
        except BaseException:
            abandoned.set()  # the backfill stops waiting: the failure above is the one to see
            raise
        materialized.result()  # the backfill's own assertions


def refresh_by_the_dataset_sensor(port: int, sim_server, dataset: Path) -> None:
    """Run "ui": its dataset sensor on, 7 rows appended, one tick's refresh, then the sensor off again."""
    instance = dg.DagsterInstance.get()
    before = asset_states(port, "ui", "prompts", "statistics")
    assert before["statistics"]["staleStatus"] == "FRESH", before
    sensor = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "sensorName": "ui__dataset_sensor"}
    started = graphql(port, START, {"s": sensor})["startSensor"]
    assert started["sensorState"]["status"] == "RUNNING", started
    try:
        time.sleep(7)  # a tick of the up-to-date run: it requests nothing
        assert [r for r in runs_of(instance, "ui", 0) if REFRESH_TAG in r.tags] == []
        sent, appended_at = sim_server.log.requests, time.time()
        with open(dataset, "a") as handle:
            handle.writelines(json.dumps({"prompt": f"Run a command that prints new {i}"}) + "\n" for i in range(7))

        stale_seen, deadline = False, time.monotonic() + 180
        while (runs := finished_refresh(instance, appended_at)) is None and time.monotonic() < deadline:
            stale_seen |= asset_states(port, "ui", "statistics")["statistics"]["staleStatus"] == "STALE"
            time.sleep(1)
        assert runs, "the refresh did not finish within 180 s"
        print(f"appended -> fresh statistics: {time.time() - appended_at:.0f} s (sensor interval 5 s)")
        after = asset_states(port, "ui", "prompts", "statistics")
        time.sleep(7)  # another tick: nothing left to do, nothing requested
        assert len([r for r in runs_of(instance, "ui", appended_at) if REFRESH_TAG in r.tags]) == len(runs)
        assert sim_server.log.requests - sent == 14  # 7 samples x 2 model calls, nothing paid twice
    finally:
        graphql(port, STOP, {"id": started["id"]})  # off again, also for the next tests of the shared dev
    assert sorted(r.job_name for r in runs) == ["ui__batch_job", "ui__finalize_job", "ui__plan_job"]
    assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), runs
    stats = json.loads((data_root() / "ui" / "statistics.json").read_text())
    assert stats["counts"]["kept"] == 11 and stats["counts"]["pending"] == 0
    assert after["prompts"]["dataVersion"] != before["prompts"]["dataVersion"]
    assert stale_seen and after["statistics"]["staleStatus"] == "FRESH"
    exports = asset_states(port, "ui", "hf_dataset", "trl_messages")  # refreshed too: the group is all fresh
    assert {name: node["staleStatus"] for name, node in exports.items()} == dict.fromkeys(exports, "FRESH"), exports


def materialize_all_after_appending(port: int, sim_server: SimulatedModelServer, dataset: Path,
                                    abandoned: threading.Event) -> None:
    """Run "all", its dataset sensor off: rows appended, then "Materialize all" on the group (a backfill of
    every asset, all partitions). The datasets sensor showed `prompts` stale (the dataset's new version,
    no click, no run), warned on the outputs' `built_from_current_dataset` check, and listed the new rows' batch before the click, so the one backfill plans and
    runs them: no second click. Runs beside the refresh of run "ui" until it ends or `abandoned` is set."""
    instance = dg.DagsterInstance.get()
    raw = {"path": ["all", "raw_trajectories"]}
    known = graphql(port, PARTITIONS, {"s": raw})["assetNodeOrError"]["partitionKeys"]
    with open(dataset, "a") as handle:
        handle.writelines(json.dumps({"prompt": f"Run a command that prints more {i}"}) + "\n" for i in range(3))
    deadline = time.monotonic() + 60
    while (len(graphql(port, PARTITIONS, {"s": raw})["assetNodeOrError"]["partitionKeys"]) == len(known)
           or (prompts := asset_states(port, "all", "prompts")["prompts"])["staleStatus"] != "STALE"):
        assert time.monotonic() < deadline, "the datasets sensor did not list the new rows' batch or show them stale"
        assert not abandoned.wait(1), "abandoned: the refresh failed"
    assert {"key": {"path": ["all", "dataset_file"]}, "reason": "has a new data version"} in \
        prompts["staleCauses"], prompts
    current = currency_check(instance)  # the outputs say why too (Dagster marks only prompts stale)
    assert not current.passed and current.severity == dg.AssetCheckSeverity.WARN, current
    assert "the dataset changed since these outputs were planned" in current.description
    sent = sim_server.log.requests
    group = ["dataset_file", "prompts", "toolset_assignments", "raw_trajectories", "filtered_trajectories",
             "statistics", "samples"]
    launched = graphql(port, BACKFILL, {"p": {"assetSelection": [{"path": ["all", name]} for name in group[1:]],
                                              "allPartitions": True}})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    deadline = time.monotonic() + 240
    while instance.get_backfill(launched["backfillId"]).status.value == "REQUESTED":
        assert time.monotonic() < deadline, "the backfill did not finish within 240 s"
        assert not abandoned.wait(2), "abandoned: the refresh failed"
    assert instance.get_backfill(launched["backfillId"]).status.value == "COMPLETED_SUCCESS"
    assert currency_check(instance).passed
    assert sim_server.log.requests - sent == 6  # the 3 new rows, 2 calls each; the done batch sent nothing
    stats = json.loads((data_root() / "all" / "statistics.json").read_text())
    assert stats["counts"]["kept"] == 7 and stats["counts"]["pending"] == 0
