"""Data versions that follow the data, code versions that follow the row-shaping code, and
partition-true metadata and run tags, read back from the Dagster instance a user's UI reads."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import dagster as dg
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver  # what the UI's staleStatus uses

from hermes_assets.cli import batch_main
from hermes_assets.resources import ModelEndpointResource
from hermes_assets.run_assets import build_run_assets
from hermes_assets.sensors import REFRESH_TAG, build_dataset_sensor
from hermes_core.batch.code_versions import ROW_SHAPING, source_version
from hermes_assets.versions import CODE_VERSIONS
from hermes_core import __version__
from hermes_core.batch.recipe import Recipe, load_recipe, save_recipe
from hermes_core.config import data_root
from batch_runs import Sent, write_dataset

REPO = Path(__file__).resolve().parents[2]
ROWS = [{"prompt": f"Run a command that prints {i}", "id": f"p{i}"} for i in range(4)]


def run(dataset: Path, url: str, run_name: str = "v1") -> int:
    return batch_main([f"--dataset_file={dataset}", f"--run_name={run_name}", f"--base_url={url}", "--api_key=k",
                       "--batch_size=2", "--num_workers=2", "--distribution=terminal_only"])


def key(name: str, run_name: str = "v1") -> dg.AssetKey:
    return dg.AssetKey([run_name, name])


def data_version(instance: dg.DagsterInstance, name: str) -> str:
    record = instance.get_latest_data_version_record(key(name), is_source=name == "dataset_file")
    assert record is not None, name
    event = record.asset_materialization or record.asset_observation
    return event.tags["dagster/data_version"]  # type: ignore[union-attr]


def status(instance: dg.DagsterInstance, assets: list, name: str) -> StaleStatus:
    return get_stale_status_resolver(instance, assets).get_status(key(name))


def test_code_version_moves_with_row_shaping_sources_only(tmp_path):
    trees = []
    for name in ("a", "b"):
        shutil.copytree(REPO / "hermes_core", tmp_path / name / "hermes_core",
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO / "tests" / "assets", tmp_path / name / "tests" / "assets",
                        ignore=shutil.ignore_patterns("__pycache__"))
        trees.append(tmp_path / name / "hermes_core")
    a, b = trees

    def versions(root: Path) -> dict[str, str]:
        return {asset: source_version(files, root) for asset, files in ROW_SHAPING.items()}

    assert versions(a) == versions(b) == CODE_VERSIONS  # the copy hashes as the installed package does
    (b.parent / "tests" / "assets" / "test_versions.py").write_text("# a test changed\n")
    assert versions(a) == versions(b)
    with open(b / "batch" / "records.py", "a") as handle:
        handle.write("\n# a row-shaping change\n")
    changed = {asset for asset, version in versions(b).items() if version != versions(a)[asset]}
    assert changed == {"raw_trajectories"}
    assert __version__ not in CODE_VERSIONS.values()


def test_data_versions_follow_the_dataset_and_partitions_keep_their_state(isolated_homes, sim_server, monkeypatch):
    dataset = write_dataset(isolated_homes / "d.jsonl", ROWS)
    sent = Sent(sim_server)
    assert run(dataset, sim_server.base_url) == 0
    assert sum(sent.counts().values()) == 4
    root = data_root()
    recipe = load_recipe(root, "v1")
    assets = build_run_assets(recipe, root)
    instance = dg.DagsterInstance.get()
    monkeypatch.setenv("HERMES_API_KEY", "k")

    def materialize(*names: str, **options) -> dg.ExecuteInProcessResult:
        return dg.materialize(assets, selection=[key(n) for n in names], instance=instance,
                              resources={"model_endpoint": ModelEndpointResource()}, **options)

    # Each CLI run names the run, model, distribution and dataset, for the Runs page's filter.
    sha = data_version(instance, "dataset_file")
    runs = instance.get_runs(filters=dg.RunsFilter(tags={"hermes/run": "v1", "hermes/dataset_sha256": sha}))
    assert runs and len(runs) == len(instance.get_runs())  # every run of the CLI (plan, batches, finish)
    assert all(r.tags["hermes/model"] == "hermes-sim" and r.tags["hermes/distribution"] == "terminal_only"
               for r in runs)
    # Partition events: the partition's state, lineage, recipe, and a data version from the ledger.
    partitions = sorted(instance.get_dynamic_partitions("v1__batches"))
    assert len(partitions) == 2
    first = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key("raw_trajectories"), asset_partitions=[partitions[0]]), limit=1
    ).records[0].asset_materialization
    meta = {name: value.value for name, value in first.metadata.items()}  # type: ignore[union-attr]
    kept = meta["kept"]
    assert meta["members"] == 2 and kept + meta["discarded"] + meta["failed_terminal"] == 2
    assert meta["samples_run"] == 2 and meta["dataset_sha256"] == sha and meta["batch_num"] == 1
    assert meta["recipe"]["run_name"] == "v1" and meta["recipe_fingerprint"] == recipe.fingerprint()
    assert first.tags["dagster/code_version"] == CODE_VERSIONS["raw_trajectories"]  # type: ignore[union-attr]
    assert meta["code_version"] == CODE_VERSIONS["raw_trajectories"]
    # ... and every row names the same code: a row leads to the code that shaped it.
    rows = [json.loads(line) for line in (data_root() / "v1" / "trajectories.jsonl").read_text().splitlines()]
    assert rows and {row["metadata"]["code_version"] for row in rows} == {CODE_VERSIONS["raw_trajectories"]}
    partition_version = first.tags["dagster/data_version"]  # type: ignore[union-attr]
    for name in ("prompts", "toolset_assignments", "filtered_trajectories", "statistics"):
        assert status(instance, assets, name) == StaleStatus.FRESH, name

    # A no-op re-materialization of a done partition: nothing sent, the partition's counts still shown.
    sent = Sent(sim_server)
    again = materialize("raw_trajectories", partition_key=partitions[0])
    assert again.success and not sent.counts()
    latest = again.get_asset_materialization_events()[0].materialization
    assert latest.metadata["kept"].value == kept and latest.metadata["samples_run"].value == 0
    assert latest.metadata["samples_skipped"].value == 2
    assert latest.tags["dagster/data_version"] == partition_version  # type: ignore[index]

    # The same rows, reformatted: a new file hash, the same keyed sample set.
    prompts_version = data_version(instance, "prompts")
    dataset.write_text("".join(json.dumps(row, indent=None, separators=(" , ", " : ")) + "\n" for row in ROWS))
    assert materialize("dataset_file").success  # the UI's "Observe sources"
    assert data_version(instance, "dataset_file") != sha
    assert status(instance, assets, "prompts") == StaleStatus.STALE
    assert materialize("prompts").success
    assert data_version(instance, "prompts") == prompts_version
    for name in ("toolset_assignments", "filtered_trajectories", "statistics"):  # the same samples: nothing moved
        assert status(instance, assets, name) == StaleStatus.FRESH, name

    # New rows: a new dataset version, a new prompts version; statistics stale until it is rebuilt.
    write_dataset(dataset, ROWS + [{"prompt": "Run a command that prints 9"}])
    assert materialize("dataset_file").success  # the UI's "Observe sources"
    assert status(instance, assets, "prompts") == StaleStatus.STALE
    sent = Sent(sim_server)
    assert run(dataset, sim_server.base_url) == 0
    assert sum(sent.counts().values()) == 1
    (latest_partition,) = set(instance.get_dynamic_partitions("v1__batches")) - set(partitions)
    assert data_version(instance, "prompts") != prompts_version
    statistics_version = data_version(instance, "statistics")
    for name in ("prompts", "toolset_assignments", "filtered_trajectories", "statistics"):
        assert status(instance, assets, name) == StaleStatus.FRESH, name

    write_dataset(dataset, ROWS + [{"prompt": "Run a command that prints 9"}, {"prompt": "Say 10"}])
    assert materialize("prompts", "toolset_assignments").success
    assert status(instance, assets, "statistics") == StaleStatus.STALE  # it counts the dataset's samples: moved
    (added,) = set(instance.get_dynamic_partitions("v1__batches")) - set(partitions) - {latest_partition}
    assert materialize("raw_trajectories", partition_key=added).success
    assert materialize("filtered_trajectories").success
    assert status(instance, assets, "statistics") == StaleStatus.STALE  # filtered moved under it
    assert materialize("statistics").success
    assert status(instance, assets, "statistics") == StaleStatus.FRESH
    assert data_version(instance, "statistics") != statistics_version  # 6 samples, not 5


def test_sensor_requests_carry_the_run_tags(isolated_homes):
    root = data_root()
    dataset = write_dataset(isolated_homes / "d.jsonl", ROWS)
    recipe = Recipe(run_name="v2", dataset_file=str(dataset), model="hermes-sim", base_url="http://127.0.0.1:9/v1",
                    distribution="terminal_only", batch_size=2)
    save_recipe(root, recipe)
    with dg.instance_for_test() as instance:
        result = build_dataset_sensor(recipe, root)(dg.build_sensor_context(instance=instance))
    (request,) = result.run_requests
    sha = hashlib.sha256(dataset.read_bytes()).hexdigest()
    assert {k: v for k, v in request.tags.items() if k.startswith("hermes/")} == {
        "hermes/run": "v2", "hermes/model": "hermes-sim", "hermes/distribution": "terminal_only",
        "hermes/dataset_sha256": sha}
    assert request.tags[REFRESH_TAG] == request.run_key  # bookkeeping, under Dagster's hidden prefix


def test_counts_equal_the_dataset_after_rows_are_deleted_and_edited(isolated_homes, sim_server, monkeypatch):
    """Issue 29, item 5: after rows were deleted or edited, statistics.json still counted the old samples'
    API calls (34 against the per-sample table's 30) and a partition's `kept` a deleted row. Now all three
    count the dataset as loaded now, and the samples of deleted or edited rows are `orphaned`, apart."""
    root = data_root()
    rows = [{"prompt": f"Run a command that prints {i}"} for i in range(6)]
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    argv = [f"--dataset_file={dataset}", "--run_name=c1", f"--base_url={sim_server.base_url}", "--api_key=k",
            "--distribution=terminal_only", "--batch_size=3"]
    assert batch_main(argv) == 0
    write_dataset(dataset, [{"prompt": "Run a command that prints 4, edited"} if i == 4 else row
                            for i, row in enumerate(rows) if i != 0])  # row 0 deleted, row 4 edited
    assert batch_main(argv) == 0
    monkeypatch.setenv("HERMES_API_KEY", "k")
    instance = dg.DagsterInstance.get()
    partitions = sorted(instance.get_dynamic_partitions("c1__batches"))
    assets = build_run_assets(load_recipe(root, "c1"), root)
    for partition in partitions:  # "Materialize all": the finished batches again, as the UI does
        assert dg.materialize(assets, selection=[key("raw_trajectories", "c1")], partition_key=partition,
                              instance=instance, resources={"model_endpoint": ModelEndpointResource()}).success

    stats = json.loads((root / "c1" / "statistics.json").read_text())
    from hermes_core.batch.sample_table import sample_table  # pandas: only where the table is wanted
    table = sample_table(root / "c1")
    assert len(table) == stats["total_prompts"] == 5 and stats["counts"]["kept"] == 5
    assert stats["api_calls"] == int(table["api_calls"].sum()) == 10  # 5 samples x 2 calls, nothing else
    assert stats["usage"]["total_tokens"] == int(table["total_tokens"].sum())
    assert stats["orphaned"]["samples"] == 2 and stats["orphaned"]["api_calls"] == 4  # deleted, edited
    metadata = [{name: value.value for name, value in instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key("raw_trajectories", "c1"), asset_partitions=[partition]), limit=1,
    ).records[0].asset_materialization.metadata.items()} for partition in partitions]
    assert sum(m["kept"] for m in metadata) == 5 and sum(m["members"] for m in metadata) == 5
    assert sum(m["api_calls"] for m in metadata) == 10 and sum(m["orphaned"] for m in metadata) == 2
