"""Runs declared in a YAML runs file: validation, path resolution, merging with runs the CLI saved,
and the code location picking them up before the CLI ever ran them."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from hermes_assets.definitions import build_definitions
from hermes_assets.runs_file import RunsFileError, adopt_recipe, load_runs_file, resolve_recipes, runs_file_path
from hermes_core.config import data_root
from hermes_core.fileio import append_jsonl_durable
from hermes_core.batch.recipe import Recipe, RecipeError, load_recipe, save_recipe

RUN_KEYS = {"dataset_file", "prompts", "toolset_assignments", "raw_trajectories", "filtered_trajectories",
            "statistics", "hf_dataset", "trl_messages", "samples"}


def write_dataset(path: Path, count: int = 3) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": f"Run a command that prints {i}"}) + "\n" for i in range(count)))
    return path


def write_runs(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_declared_runs_load_with_defaults_and_paths_relative_to_the_file(tmp_path):
    write_dataset(tmp_path / "conf" / "data" / "p.jsonl")
    runs = write_runs(tmp_path / "conf" / "runs.yaml", """
- run_name: nightly
  dataset_file: data/p.jsonl
  model: hermes-sim
  base_url: http://127.0.0.1:9/v1
  distribution: terminal_only
  batch_size: 2
  temperature: 1
- run_name: weekly
  dataset_file: data/p.jsonl
  model: other
""")
    nightly, weekly = load_runs_file(runs)
    assert nightly.dataset_file == str(tmp_path / "conf" / "data" / "p.jsonl")
    assert (nightly.batch_size, nightly.distribution, nightly.temperature) == (2, "terminal_only", 1)
    assert (weekly.batch_size, weekly.distribution, weekly.seed, weekly.base_url) == (10, "default", 0, None)
    wrapped = write_runs(tmp_path / "conf" / "wrapped.yaml", "runs:\n  - {run_name: a, dataset_file: x, model: m}\n")
    assert [r.run_name for r in load_runs_file(wrapped)] == ["a"]
    assert load_runs_file(write_runs(tmp_path / "empty.yaml", "")) == []


def test_every_problem_is_one_error_naming_the_file_and_the_runs(tmp_path):
    runs = write_runs(tmp_path / "runs.yaml", """
- run_name: good
  dataset_file: p.jsonl
  model: m
- run_name: typo
  dataset_file: p.jsonl
  model: m
  batchsize: 5
- run_name: badtype
  dataset_file: p.jsonl
  model: m
  batch_size: "10"
- dataset_file: p.jsonl
- run_name: good
  dataset_file: p.jsonl
  model: m
- run_name: bad-name
  dataset_file: p.jsonl
  model: m
- just a string
""")
    with pytest.raises(RunsFileError) as error:
        load_runs_file(runs)
    message = str(error.value)
    assert message.startswith(str(runs))
    assert "run 'typo': unknown key(s) batchsize" in message and "batch_size" in message  # the known keys
    assert "run 'badtype': batch_size: expected int, got str '10'" in message
    assert "run #4: missing run_name, model" in message
    assert "run 'good': declared more than once" in message
    assert "run 'bad-name'" in message and "run_name" in message
    assert "run #7: expected a mapping" in message
    assert isinstance(error.value, RecipeError)  # the CLI reports it like any recipe error


def test_unreadable_or_misshapen_files_are_reported(tmp_path, monkeypatch):
    with pytest.raises(RunsFileError, match="cannot read"):
        load_runs_file(write_runs(tmp_path / "a.yaml", "- [unclosed\n"))
    with pytest.raises(RunsFileError, match="expected a YAML list"):
        load_runs_file(write_runs(tmp_path / "b.yaml", "run_name: x\n"))
    monkeypatch.setenv("HERMES_RUNS_FILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(RunsFileError, match="missing.yaml: runs file not found"):
        runs_file_path(tmp_path)


def test_runs_file_location(tmp_path, monkeypatch):
    monkeypatch.delenv("HERMES_RUNS_FILE", raising=False)
    assert runs_file_path(tmp_path) is None
    default = write_runs(tmp_path / "runs.yaml", "[]\n")
    assert runs_file_path(tmp_path) == default
    elsewhere = write_runs(tmp_path / "etc" / "mine.yaml", "[]\n")
    monkeypatch.setenv("HERMES_RUNS_FILE", str(elsewhere))
    assert runs_file_path(tmp_path) == elsewhere


def test_declared_run_is_an_asset_group_before_any_cli_run(isolated_homes, sim_url):
    root = data_root()
    write_dataset(root / "inputs" / "p.jsonl")
    write_runs(root / "runs.yaml", f"""
- run_name: declared
  dataset_file: inputs/p.jsonl
  model: hermes-sim
  base_url: {sim_url}
  distribution: terminal_only
  batch_size: 2
""")
    defs = build_definitions(root)
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {f"declared/{name}" for name in RUN_KEYS}
    assert defs.resolve_sensor_def("declared__dataset_sensor")
    assert not (root / "declared").exists()  # loading the code location writes nothing

    with dg.instance_for_test() as instance:
        planned = defs.resolve_job_def("declared__plan_job").execute_in_process(instance=instance)
        assert planned.success
        assert len(instance.get_dynamic_partitions("declared__batches")) == 2
    assert (root / "declared" / "prompts.jsonl").is_file()  # the run folder exists now
    assert (root / "declared" / "recipe.json").is_file()


def test_runs_file_from_the_environment_and_saved_runs_side_by_side(isolated_homes, sim_url, monkeypatch):
    root = data_root()
    dataset = write_dataset(isolated_homes / "p.jsonl")
    save_recipe(root, Recipe(run_name="from_cli", dataset_file=str(dataset), model="hermes-sim", base_url=sim_url))
    runs = write_runs(isolated_homes / "conf" / "runs.yaml", "- {run_name: from_file, dataset_file: ../p.jsonl, model: m}\n")
    monkeypatch.setenv("HERMES_RUNS_FILE", str(runs))
    assert [r.run_name for r in resolve_recipes(root)] == ["from_cli", "from_file"]
    groups = {key.path[0] for key in build_definitions(root).resolve_asset_graph().get_all_asset_keys()}
    assert groups == {"from_cli", "from_file"}


def test_declared_and_saved_recipes_merge(isolated_homes, monkeypatch):
    root = data_root()
    dataset = write_dataset(isolated_homes / "p.jsonl")
    saved = Recipe(run_name="r", dataset_file=str(dataset), model="hermes-sim", seed=1, batch_size=5)
    save_recipe(root, saved)
    runs = root / "runs.yaml"

    # Same fingerprint: the declared (non-meaning) settings are used.
    write_runs(runs, f"- {{run_name: r, dataset_file: {dataset}, model: hermes-sim, seed: 1, batch_size: 3}}\n")
    (recipe,) = resolve_recipes(root)
    assert recipe.batch_size == 3

    # A different fingerprint wins while the saved run has no ledger...
    write_runs(runs, f"- {{run_name: r, dataset_file: {dataset}, model: hermes-sim, seed: 2}}\n")
    (recipe,) = resolve_recipes(root)
    assert recipe.seed == 2
    adopt_recipe(root, recipe)  # what the prompts asset does on first materialization
    assert load_recipe(root, "r").seed == 2

    # ...but not once that run has paid for samples: one error naming both files.
    append_jsonl_durable(root / "r" / "raw" / "b00001-x.jsonl", {"sample_key": "k", "disposition": "kept"})
    write_runs(runs, f"- {{run_name: r, dataset_file: {dataset}, model: hermes-sim, seed: 3}}\n")
    with pytest.raises(RunsFileError) as error:
        resolve_recipes(root)
    assert str(runs) in str(error.value) and str(root / "r" / "recipe.json") in str(error.value)
    with pytest.raises(RunsFileError, match="ledger"):
        adopt_recipe(root, Recipe(run_name="r", dataset_file=str(dataset), model="hermes-sim", seed=3))
    assert load_recipe(root, "r").seed == 2  # nothing was overwritten
