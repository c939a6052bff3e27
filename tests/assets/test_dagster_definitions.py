"""The code location as the Dagster UI loads it: asset groups per run, partitions, validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from hermes_assets.definitions import build_definitions
from hermes_core.config import data_root
from hermes_core.batch.recipe import Recipe, save_recipe

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def save_run(root: Path, dataset: Path, url: str, run_name: str = "ui_run") -> Recipe:
    dataset.write_text("".join(json.dumps({"prompt": f"Run a command that prints {i}"}) + "\n" for i in range(3)))
    recipe = Recipe(run_name=run_name, dataset_file=str(dataset), model="hermes-sim", base_url=url,
                    distribution="terminal_only", batch_size=2)
    save_recipe(root, recipe)
    return recipe


def test_each_run_is_an_asset_group_materializable_per_partition(isolated_homes, sim_url):
    root = data_root()
    save_run(root, isolated_homes / "d.jsonl", sim_url)
    defs = build_definitions(root)
    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert keys == {f"ui_run/{name}" for name in
                    ("dataset_file", "prompts", "toolset_assignments", "raw_trajectories", "filtered_trajectories",
                     "statistics", "hf_dataset", "trl_messages", "samples")}
    assets = list(defs.assets)
    with dg.instance_for_test() as instance:
        planned = dg.materialize(assets, instance=instance, resources=defs.resources, selection=["ui_run/prompts", "ui_run/toolset_assignments"])
        assert planned.success
        partitions = instance.get_dynamic_partitions("ui_run__batches")
        assert len(partitions) == 2
        # What a user does in the UI: materialize one partition (the endpoint comes from the recipe).
        one = dg.materialize(assets, instance=instance, resources=defs.resources, selection=["ui_run/raw_trajectories"],
                             partition_key=partitions[0])
        assert one.success
        assert instance.get_materialized_partitions(dg.AssetKey(["ui_run", "raw_trajectories"])) == {partitions[0]}
        final = dg.materialize(assets, instance=instance, resources=defs.resources,
                               selection=["ui_run/filtered_trajectories", "ui_run/statistics"])
        assert final.success
    stats = json.loads((root / "ui_run" / "statistics.json").read_text())
    assert stats["counts"]["kept"] == 2 and stats["counts"]["pending"] == 1


def test_dagster_definitions_validate(isolated_homes, sim_url):
    save_run(data_root(), isolated_homes / "d.jsonl", sim_url)
    env = {**os.environ, "HERMES_DATA_DIR": str(data_root())}
    result = subprocess.run([str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Validation successful" in result.stdout + result.stderr


def test_a_broken_recipe_is_reported_and_the_other_runs_still_load(isolated_homes, sim_url):
    import pytest

    root = data_root()
    save_run(root, isolated_homes / "d.jsonl", sim_url)
    (root / "broken").mkdir()
    (root / "broken" / "recipe.json").write_text("{not json")
    with pytest.warns(UserWarning, match="broken/recipe.json"):
        defs = build_definitions(root)
    assert dg.AssetKey(["ui_run", "prompts"]) in defs.resolve_asset_graph().get_all_asset_keys()


def test_every_asset_and_check_of_a_run_is_catalogued(isolated_homes, sim_url, monkeypatch):
    """What the catalog shows for a run's group: a description, owners (from $HERMES_ASSET_OWNERS, read
    when the definitions load), kinds and the `hermes/stage` tag on every asset; checks (which take
    no owners, kinds or tags in Dagster) a description, and the stage and owners in their metadata."""
    from hermes_assets.compression_assets import COMPRESSION_ENV
    from hermes_assets.metadata import STAGE_TAG, STAGES

    monkeypatch.setenv(COMPRESSION_ENV, "1")  # so compressed_trajectories is in the group too
    monkeypatch.setenv("HERMES_ASSET_OWNERS", "team:auditors, me@example.com")
    root = data_root()
    save_run(root, isolated_homes / "d.jsonl", sim_url)
    graph = build_definitions(root).get_repository_def().asset_graph
    nodes = [graph.get(key) for key in graph.get_all_asset_keys()]
    assert {node.key.path[-1] for node in nodes} >= {"dataset_file", "raw_trajectories", "compressed_trajectories",
                                                     "hf_dataset", "samples"}
    for node in nodes:
        name = node.key.to_user_string()
        assert node.group_name == "ui_run", name
        assert node.description, name
        assert str(isolated_homes) not in node.description, name  # no folder of this machine in a definition
        assert node.tags.get(STAGE_TAG) in STAGES, name
        assert 1 <= len(node.kinds) <= 3, name
        if node.is_materializable:  # a source asset's decorator takes no owners
            assert node.owners == ["team:auditors", "me@example.com"], name
    assert "openai" in graph.get(dg.AssetKey(["ui_run", "raw_trajectories"])).kinds
    assert "pandas" in graph.get(dg.AssetKey(["ui_run", "samples"])).kinds
    check_keys = graph.asset_check_keys
    assert len(check_keys) >= 5
    for key in check_keys:
        spec = graph.get_check_spec(key)
        assert spec.description, key
        assert spec.metadata[STAGE_TAG] in STAGES, key
        assert spec.metadata["owners"] == "team:auditors, me@example.com", key


def test_loading_the_definitions_prints_no_beta_warnings(isolated_homes, sim_url):
    """`dagster dev` printed 323 BetaWarning lines in 35 minutes: one per run's group at every load."""
    save_run(data_root(), isolated_homes / "d.jsonl", sim_url)
    code = "from hermes_assets.definitions import defs; defs().get_repository_def().get_all_jobs()"
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "BetaWarning" not in done.stderr and "PreviewWarning" not in done.stderr, done.stderr
