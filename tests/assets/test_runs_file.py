"""Runs declared in a YAML runs file: validation, path resolution, merging with runs the CLI saved,
and the code location picking them up before the CLI ever ran them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from hermes_assets.declarations import problem_label
from hermes_assets.definitions import build_definitions
from hermes_assets.runs_file import (RunsFileError, adopt_recipe, load_runs_file, read_runs_file, resolve_recipes,
                                     resolve_runs, runs_file_path)
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


def test_every_problem_is_one_error_naming_the_file_the_entry_and_the_field(tmp_path):
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
- {run_name: dist, dataset_file: p.jsonl, model: m, distribution: nope}
- {run_name: squeeze, dataset_file: p.jsonl, model: m, compression: {target_max_tokenz: 5}}
""")
    with pytest.raises(RunsFileError) as error:
        load_runs_file(runs)
    lines = str(error.value).splitlines()
    assert all(line.startswith(f"{runs}, entry #") for line in lines), lines
    assert f"{runs}, entry #2, run 'typo', field 'batchsize': unknown setting; did you mean 'batch_size'?" in lines
    assert f"{runs}, entry #3, run 'badtype', field 'batch_size': expected int, got str '10'" in lines
    assert f"{runs}, entry #4, field 'run_name': required setting is missing" in lines
    assert f"{runs}, entry #4, field 'model': required setting is missing" in lines
    assert f"{runs}, entry #5, run 'good', field 'run_name': run 'good' is already declared by entry #1; " \
           "this entry is ignored" in lines
    assert any(line.startswith(f"{runs}, entry #6, run 'bad-name', field 'run_name': ") for line in lines)
    assert f"{runs}, entry #7: expected a mapping of settings, got str" in lines
    assert any(line.startswith(f"{runs}, entry #8, run 'dist', field 'distribution': unknown distribution 'nope'")
               for line in lines)
    assert f"{runs}, entry #9, run 'squeeze', field 'compression': unknown compression setting " \
           "'target_max_tokenz'; known: target_max_tokens" in str(error.value)
    assert len(lines) == 9
    assert isinstance(error.value, RecipeError)  # the CLI reports it like any recipe error
    # Collected rather than raised, the good entry still loads.
    declared, problems = read_runs_file(runs)
    assert [(d.entry, d.recipe.run_name) for d in declared] == [(1, "good")]
    assert [str(p) for p in problems] == lines


def test_unreadable_or_misshapen_files_are_reported(tmp_path, monkeypatch):
    with pytest.raises(RunsFileError, match="a.yaml: YAML syntax error at line 2, column 1: expected the node"):
        load_runs_file(write_runs(tmp_path / "a.yaml", "- {run_name: x,\n- [unclosed\n"))
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


def _asset_nodes(defs: dg.Definitions) -> dict[str, Any]:
    graph = defs.resolve_asset_graph()
    return {key.to_user_string(): graph.get(key) for key in graph.get_all_asset_keys()}


def _fails_with(defs: dg.Definitions, key: str) -> str:
    """Materialize one asset of the definitions; the message of its step failure."""
    result = dg.materialize([defs.resolve_assets_def(dg.AssetKey.from_user_string(key))],
                            instance=dg.DagsterInstance.get(), raise_on_error=False)
    [failure] = result.get_step_failure_events()
    assert not result.success
    return failure.step_failure_data.user_failure_data.description


def test_bad_and_conflicting_entries_are_reported_on_their_run_alone(isolated_homes, sim_url, caplog):
    root = data_root()
    dataset = write_dataset(root / "p.jsonl")
    # A run the CLI started, with ledger records: the runs file now declares it with another distribution.
    save_recipe(root, Recipe(run_name="saved", dataset_file=str(dataset), model="hermes-sim",
                             distribution="terminal_only"))
    append_jsonl_durable(root / "saved" / "raw" / "b00001-x.jsonl", {"sample_key": "k", "disposition": "kept"})
    runs = write_runs(root / "runs.yaml", f"""
- {{run_name: good, dataset_file: p.jsonl, model: hermes-sim, base_url: "{sim_url}", distribution: terminal_only}}
- {{run_name: typed, dataset_file: p.jsonl, model: hermes-sim, batch_size: ten}}
- {{run_name: twice, dataset_file: p.jsonl, model: hermes-sim}}
- {{run_name: twice, dataset_file: p.jsonl, model: other}}
- {{run_name: saved, dataset_file: p.jsonl, model: hermes-sim, distribution: development}}
- {{run_name: bad-name, dataset_file: p.jsonl, model: hermes-sim}}
""")
    defs = build_definitions(root)  # loads: nothing above takes the code location down
    nodes = _asset_nodes(defs)
    by_group: dict[str, set[str]] = {}
    for key, node in nodes.items():
        by_group.setdefault(node.group_name, set()).add(key.split("/", 1)[1])
    assert by_group == {"good": RUN_KEYS, "twice": RUN_KEYS | {"declaration"},
                        "saved": RUN_KEYS | {"declaration"},  # the saved run loads, its conflict beside it
                        "typed": {"declaration"}, "runs_file_entry_6": {"declaration"}}
    assert defs.resolve_sensor_def("good__dataset_sensor") and defs.resolve_job_def("saved__plan_job")

    typed = nodes["typed/declaration"]
    assert f"{runs}, entry #2, run 'typed', field 'batch_size': expected int, got str 'ten'" in typed.description
    assert typed.metadata["problem"].text in typed.description
    assert (typed.metadata["entry"], typed.metadata["field"]) == ("2", "batch_size")
    assert typed.tags["hermes/stage"] == "input" and typed.owners == ["team:hermes-foundry"]
    twice = nodes["twice/declaration"].description
    assert f"{runs}, entry #4, run 'twice', field 'run_name': run 'twice' is already declared by entry #3" in twice
    saved = nodes["saved/declaration"].description
    assert f"{runs}, entry #5, run 'saved', field 'distribution': the declared recipe" in saved
    assert str(root / "saved" / "recipe.json") in saved and "keeps its saved recipe" in saved
    assert f"{runs}, entry #6, run 'bad-name', field 'run_name'" in nodes["runs_file_entry_6/declaration"].description

    # The conflicting run keeps its saved recipe (its data was made under it); the declared one is refused.
    recipes, problems = resolve_runs(root)
    assert {r.run_name: r.distribution for r in recipes} == {"good": "terminal_only", "saved": "terminal_only",
                                                             "twice": "default"}
    assert len(problems) == 4
    assert [problem_label(p) for p in problems] == ["typed", "twice", "runs_file_entry_6", "saved"]
    assert [r.getMessage() for r in caplog.records if "runs file problem" in r.getMessage()] == [
        f"runs file problem, shown on {problem_label(p)}/declaration: {p}" for p in problems]  # one warning each

    # "Materialize" on a declaration asset fails with the message.
    assert _fails_with(defs, "typed/declaration").startswith(
        f"{runs}, entry #2, run 'typed', field 'batch_size': expected int")
    assert "Reload" in _fails_with(defs, "saved/declaration")


def test_a_broken_runs_file_leaves_the_saved_runs_loading(isolated_homes, monkeypatch):
    root = data_root()
    dataset = write_dataset(root / "p.jsonl")
    save_recipe(root, Recipe(run_name="from_cli", dataset_file=str(dataset), model="hermes-sim"))
    runs = write_runs(root / "runs.yaml", "- {run_name: x, dataset_file: p.jsonl\n- [\n")
    nodes = _asset_nodes(build_definitions(root))
    assert {k for k in nodes if k.startswith("from_cli/")} == {f"from_cli/{k}" for k in RUN_KEYS}
    whole = nodes["runs_file/declaration"]
    assert whole.group_name == "runs_file" and whole.description.startswith(f"{runs}: YAML syntax error at line 2")
    assert whole.metadata["entry"] == "whole file"

    write_runs(runs, "run_name: x\n")
    misshapen = _asset_nodes(build_definitions(root))["runs_file/declaration"]
    assert f"{runs}: expected a YAML list of runs, got dict" in misshapen.description
    monkeypatch.setenv("HERMES_RUNS_FILE", str(root / "gone.yaml"))
    nodes = _asset_nodes(build_definitions(root))
    assert f"{root / 'gone.yaml'}: runs file not found" in nodes["runs_file/declaration"].description
    assert "from_cli/statistics" in nodes
