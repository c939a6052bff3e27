"""Runs are data (issue 18, item 1), as a Dagster user sees it: a run appended to the runs file appears in
a running `dagster dev` after one reload of the code location and launches from the UI's GraphQL API,
sending exactly its samples; a conflicting and a bad entry written next to it leave the code location
loaded and every other run listed, each problem shown on its own run as a `declaration` asset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg

from hermes_assets.sensors import plan_job_name, raw_job_name
from hermes_core.config import data_root
from dagster_runs import story, wait_for
from dagster_ui import LOCATION, REPOSITORY, SharedDev, graphql, launch_job, location, reload_location

RUN_KEYS = {"dataset_file", "prompts", "toolset_assignments", "raw_trajectories", "filtered_trajectories",
            "statistics", "hf_dataset", "trl_messages", "samples"}
GROUP = """query($group: AssetGroupSelector!) { assetNodes(group: $group) {
  assetKey { path } description metadataEntries { label ... on TextMetadataEntry { text } } } }"""


def group_assets(port: int, group: str) -> dict[str, dict[str, Any]]:
    """The asset nodes of one asset group as the UI lists them, by asset name."""
    selector = {"groupName": group, "repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}
    nodes = graphql(port, GROUP, {"group": selector})["assetNodes"]
    return {node["assetKey"]["path"][-1]: node for node in nodes}


def entry(run: str, dataset: str, sim_url: str, **settings: Any) -> str:
    fields = {"run_name": run, "dataset_file": dataset, "model": "hermes-sim", "base_url": sim_url,
              "distribution": "terminal_only", "batch_size": 2, **settings}
    return "- " + json.dumps(fields) + "\n"  # JSON is YAML: one entry per line


def launched(port: int, job: str, tags: dict[str, str] | None = None) -> dg.DagsterRun:
    result = launch_job(port, job, tags)
    assert result["__typename"] == "LaunchRunSuccess", result
    run = wait_for(result["run"]["runId"], timeout=120)
    assert run.status == dg.DagsterRunStatus.SUCCESS, story(run.run_id)
    return run


def write_dataset(path: Path, count: int) -> None:
    path.write_text("".join(json.dumps({"prompt": f"Run a command that prints {i}"}) + "\n" for i in range(count)))


def test_a_run_added_to_the_runs_file_appears_after_one_reload_and_launches(ui_dev: SharedDev, sim_server, sim_url):
    root = data_root()
    root.mkdir(parents=True, exist_ok=True)
    write_dataset(root / "first.jsonl", 2)
    write_dataset(root / "second.jsonl", 3)
    runs = root / "runs.yaml"  # the default runs file: <data root>/runs.yaml
    runs.write_text(entry("first", "first.jsonl", sim_url))

    port = ui_dev.port()
    try:
        # `make dev` as it starts with this runs file (it may be running already: one reload).
        assert reload_location(port)["locationOrLoadError"]["__typename"] == "RepositoryLocation"
        assert set(group_assets(port, "first")) == RUN_KEYS and group_assets(port, "second") == {}

        # Declare a second run: one reload of the code location, and its group is there.
        runs.write_text(runs.read_text() + entry("second", "second.jsonl", sim_url))
        assert reload_location(port)["locationOrLoadError"]["__typename"] == "RepositoryLocation"
        assert set(group_assets(port, "second")) == RUN_KEYS

        # It launches from the UI's API: plan, then every batch in one run over the partition range.
        before = sim_server.log.requests
        launched(port, plan_job_name("second"))
        batches = dg.DagsterInstance.get().get_dynamic_partitions("second__batches")
        assert len(batches) == 2  # 3 samples, batch_size 2
        launched(port, raw_job_name("second"), {"dagster/asset_partition_range_start": batches[0],
                                                "dagster/asset_partition_range_end": batches[-1]})
        assert sim_server.log.requests - before == 3 * 2  # each sample: a tool call, then the final answer
        assert sorted(p.stem for p in (root / "second" / "raw").glob("*.jsonl")) == sorted(batches)

        # A conflicting entry (the run has records now) and a bad one, next to the good runs.
        runs.write_text(entry("first", "first.jsonl", sim_url)
                        + entry("second", "second.jsonl", sim_url, distribution="development")
                        + entry("third", "second.jsonl", sim_url, batch_size="ten"))
        assert reload_location(port)["locationOrLoadError"]["__typename"] == "RepositoryLocation"
        assert location(port)["__typename"] == "RepositoryLocation"
        assert set(group_assets(port, "first")) == RUN_KEYS
        second = group_assets(port, "second")
        assert set(second) == RUN_KEYS | {"declaration"}  # the run keeps loading, its conflict beside it
        conflict = {e["label"]: e.get("text") for e in second["declaration"]["metadataEntries"]}
        assert conflict["field"] == "distribution"
        assert f"{runs}, entry #2, run 'second', field 'distribution': the declared recipe" in conflict["problem"]
        assert "keeps its saved recipe" in second["declaration"]["description"]
        third = group_assets(port, "third")
        assert set(third) == {"declaration"}
        assert (f"{runs}, entry #3, run 'third', field 'batch_size': expected int, got str 'ten'"
                in third["declaration"]["description"])
        assert sim_server.log.requests - before == 6  # loading and reloading never called the model
    finally:
        runs.unlink()  # the shared code location loads without these entries from its next reload on
