"""An endpoint outage seen from the UI (issue 29, item 1): with the endpoint down, "Materialize all"
after appending rows failed every partition of the run's range, finished batches with data included,
and named the cause only in a nested error. Now the finished partitions keep their state and data
version, the new ones fail with "model endpoint unreachable" as the step's first line and on their
own pages, and once the endpoint is back the next "Materialize all" sends exactly the new samples.
And (item 2) every run of it, from a backfill or an asset page, is found by its `hermes/run` tag,
with no bookkeeping tag of ours on show."""

from __future__ import annotations

import json
import time

import dagster as dg

from hermes_assets.cli import batch_main
from hermes_core.config import data_root
from hermes_core.endpoints.simulated import SimulatedModelServer
from batch_runs import write_dataset
from dagster_ui import LOCATION, REPOSITORY, SharedDev, graphql, reload_location

RUN = "outage"
GROUP = ["prompts", "toolset_assignments", "raw_trajectories", "filtered_trajectories", "statistics", "samples"]
BACKFILL = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } ... on Error { message } } }"""
PARTITIONS = """query($s: AssetKeyInput!) { assetNodeOrError(assetKey: $s) { ... on AssetNode { partitionKeys } } }"""
STEP_FAILURES = """query($id: ID!) { runOrError(runId: $id) { ... on Run { eventConnection { events {
  __typename ... on ExecutionStepFailureEvent { stepKey error { message } } } } } } }"""
RUNS = """query($f: RunsFilter!) { runsOrError(filter: $f) { ... on Runs { results { runId tags { key value } } } } }"""
LAUNCH_ASSETS = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on Error { message } } }"""
OBSERVATIONS = """query($k: AssetKeyInput!, $p: [String!]) { assetOrError(assetKey: $k) { ... on Asset {
  assetObservations(partitions: $p) { partition description } } } }"""
RAW = dg.AssetKey([RUN, "raw_trajectories"])


def materialize_all(port: int, instance: dg.DagsterInstance) -> dg.PartitionBackfill:
    """The group's "Materialize all" (a backfill of every asset, all partitions), waited for."""
    launched = graphql(port, BACKFILL, {"p": {"assetSelection": [{"path": [RUN, name]} for name in GROUP],
                                              "allPartitions": True}})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    deadline = time.monotonic() + 240
    while (backfill := instance.get_backfill(launched["backfillId"])).status.value in ("REQUESTED", "FAILING"):
        assert time.monotonic() < deadline, "the backfill did not finish within 240 s"
        time.sleep(2)
    return backfill


def partition_keys(port: int) -> list[str]:
    return graphql(port, PARTITIONS, {"s": {"path": RAW.path}})["assetNodeOrError"]["partitionKeys"]


def data_versions(instance: dg.DagsterInstance, keys: list[str]) -> dict[str, str]:
    latest = {}
    for key in keys:
        (record,) = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=RAW, asset_partitions=[key]),
                                                    limit=1).records
        latest[key] = record.asset_materialization.tags["dagster/data_version"]
    return latest


def statuses(instance: dg.DagsterInstance, keys: list[str]) -> dict[str, str]:
    found = instance.get_status_by_partition(RAW, keys, dg.DynamicPartitionsDefinition(name=f"{RUN}__batches"))
    return {key: found[key].value for key in keys}


def test_an_outage_fails_only_the_new_batches_and_says_the_endpoint_is_unreachable(ui_dev: SharedDev):
    data_root().mkdir(parents=True, exist_ok=True)
    instance = dg.DagsterInstance.get()
    with SimulatedModelServer() as endpoint:
        port_of_model = endpoint.port
        dataset = write_dataset(data_root() / f"{RUN}.jsonl", [{"prompt": f"Run a command that prints {i}"}
                                                               for i in range(6)])
        assert batch_main([f"--dataset_file={dataset}", f"--run_name={RUN}", f"--base_url={endpoint.base_url}",
                           "--api_key=k", "--distribution=terminal_only", "--batch_size=2"]) == 0
    port = ui_dev.port()
    assert reload_location(port)["locationOrLoadError"]["__typename"] == "RepositoryLocation"
    done = partition_keys(port)
    assert len(done) == 3 and set(statuses(instance, done).values()) == {"MATERIALIZED"}
    versions = data_versions(instance, done)

    with open(dataset, "a") as handle:  # the endpoint is down now: nothing listens on its port
        handle.writelines(json.dumps({"prompt": f"Run a command that prints new {i}"}) + "\n" for i in range(3))
    deadline = time.monotonic() + 60
    while len(everything := partition_keys(port)) < 5:
        assert time.monotonic() < deadline, "the datasets sensor did not list the new rows' batches"
        time.sleep(1)
    new = [key for key in everything if key not in done]  # 3 rows, batch_size 2
    backfill = materialize_all(port, instance)
    assert backfill.status.value in ("FAILED", "COMPLETED_FAILED"), backfill.status
    assert statuses(instance, done) == dict.fromkeys(done, "MATERIALIZED")  # finished work keeps its state
    assert statuses(instance, new) == dict.fromkeys(new, "FAILED")
    assert data_versions(instance, done) == versions

    (raw_run,) = [record.dagster_run for record in instance.get_run_records(
        dg.RunsFilter(tags={"dagster/backfill": backfill.backfill_id}))
        if RAW in (record.dagster_run.asset_selection or ())]
    events = graphql(port, STEP_FAILURES, {"id": raw_run.run_id})["runOrError"]["eventConnection"]["events"]
    (failure,) = [event for event in events if event["__typename"] == "ExecutionStepFailureEvent"]
    unreachable = f"model endpoint unreachable: cannot connect to http://127.0.0.1:{port_of_model}/v1"
    assert unreachable in failure["error"]["message"].split("\n")[0], failure  # its first line, not a cause
    observed = graphql(port, OBSERVATIONS, {"k": {"path": RAW.path}, "p": new})["assetOrError"]["assetObservations"]
    assert sorted(o["partition"] for o in observed) == sorted(new)
    assert all(o["description"].startswith(unreachable) for o in observed), observed

    with SimulatedModelServer(port=port_of_model) as endpoint:  # back, at the same address
        again = materialize_all(port, instance)
        assert again.status.value == "COMPLETED_SUCCESS"
        assert endpoint.log.requests == 6  # the 3 new rows, 2 calls each; the finished batches sent nothing
    assert set(statuses(instance, everything).values()) == {"MATERIALIZED"}
    stats = json.loads((data_root() / RUN / "statistics.json").read_text())
    assert stats["counts"]["kept"] == 9 and stats["counts"]["pending"] == 0

    # An asset page's "Materialize" runs Dagster's hidden asset job, launched with no tags of ours.
    params = {"selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "jobName": "__ASSET_JOB",
                           "assetSelection": [{"path": [RUN, "prompts"]}]}, "runConfigData": {}}
    launched = graphql(port, LAUNCH_ASSETS, {"p": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    deadline = time.monotonic() + 60
    while not instance.get_run_by_id(launched["run"]["runId"]).is_finished:
        assert time.monotonic() < deadline, "the asset page's run did not finish within 60 s"
        time.sleep(1)
    tagged = graphql(port, RUNS, {"f": {"tags": [{"key": "hermes/run", "value": RUN}]}})["runsOrError"]["results"]
    launched_ids = {record.dagster_run.run_id for done_backfill in (backfill, again) for record in
                    instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": done_backfill.backfill_id}))}
    assert len(launched_ids) >= 4  # each backfill: at least planning and the batches
    launched_ids.add(launched["run"]["runId"])
    assert launched_ids <= {run["runId"] for run in tagged}  # every one of them found by its run's name
    shown = {tag["key"] for run in tagged for tag in run["tags"]}
    assert {"hermes/model", "hermes/distribution", "hermes/dataset_sha256"} <= shown
    assert not [key for key in shown if "pid" in key or "refresh" in key or key.startswith(".")]
