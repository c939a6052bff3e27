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
