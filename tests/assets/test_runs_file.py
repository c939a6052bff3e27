"""Runs declared in a YAML runs file: validation, path resolution, merging with runs the CLI saved,
and the code location picking them up before the CLI ever ran them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from hermes_assets.declarations import problem_label
from hermes_assets.definitions import build_definitions
from hermes_assets.runs_file import (RunsFileError, adopt_recipe, load_runs_file, read_runs_file, resolve_recipes,
                                     resolve_runs, runs_file_path)
from hermes_core.config import data_root
from hermes_core.fileio import append_record
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
        load_runs_file(write_runs(tmp_path / "a.yaml", "runs: [{run_name: x,\n"))
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
    append_record(root / "r" / "raw" / "b00001-x.jsonl", {"sample_key": "k", "disposition": "kept"})
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
    append_record(root / "saved" / "raw" / "b00001-x.jsonl", {"sample_key": "k", "disposition": "kept"})
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
    runs = write_runs(root / "runs.yaml", "runs: {run_name: x, dataset_file: p.jsonl\n")
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


def test_a_file_that_stops_parsing_keeps_the_runs_it_declared(isolated_homes):
    """Issue 29: a YAML syntax error outside every entry dropped every declared run whose prompts were
    never materialized (they exist only in the file). The runs of the file as it last parsed now keep
    loading, the syntax error shown beside them, until the file is fixed."""
    root = data_root()
    write_dataset(root / "p.jsonl")
    good = "".join(f"- {{run_name: r{i}, dataset_file: p.jsonl, model: hermes-sim}}\n" for i in range(2))
    runs = write_runs(root / "runs.yaml", good)
    assert {k for k in _asset_nodes(build_definitions(root)) if k.endswith("/prompts")} == {"r0/prompts", "r1/prompts"}

    write_runs(runs, "runs: [\n" + good)  # an error outside every entry: the whole file is broken
    nodes = _asset_nodes(build_definitions(root))
    assert {k for k in nodes if k.endswith("/prompts")} == {"r0/prompts", "r1/prompts"}
    problem = nodes["runs_file/declaration"].description
    assert problem.startswith(f"{runs}: YAML syntax error") and "the runs it declared when it last loaded" in problem

    write_runs(runs, good.replace("r1", "r2"))  # fixed: the file as it is now, and no problem
    nodes = _asset_nodes(build_definitions(root))
    assert {k for k in nodes if k.endswith("/prompts")} == {"r0/prompts", "r2/prompts"}
    assert "runs_file/declaration" not in nodes


def alias_bomb(levels: int = 9) -> str:
    """Anchors `a: &a [x,x,...]`, `b: &b [*a,*a,...]`, ...: 9**levels strings written in a few hundred
    bytes, the last one named by the alias `*<its letter>`."""
    names = "abcdefghijklmnop"[:levels]
    lines = [f"    a: &a [{','.join('x' * 9)}]"]
    lines += [f"    {name}: &{name} [{','.join([f'*{prev}'] * 9)}]" for prev, name in zip(names, names[1:])]
    return "\n".join(lines)


@pytest.mark.timeout(60)  # before the fix, the bomb's entry alone took minutes and gigabytes
def test_an_alias_bomb_costs_only_its_entry_and_merges_keep_working(isolated_homes):
    root = data_root()
    write_dataset(root / "p.jsonl")
    runs = write_runs(root / "runs.yaml", f"""- &base
  run_name: first
  dataset_file: p.jsonl
  model: hermes-sim
  batch_size: 3
- <<: *base
  run_name: merged
- run_name: bomb
  dataset_file: p.jsonl
  tool_backends:
{alias_bomb()}
  model: *i
- {{<<: *base, run_name: after}}
""")
    assert len(runs.read_bytes()) < 1000
    declared, problems = read_runs_file(runs)
    assert [(d.entry, d.recipe.run_name, d.recipe.batch_size) for d in declared] == [
        (1, "first", 3), (2, "merged", 3), (4, "after", 3)]
    assert [str(p) for p in problems] == [
        f"{runs}, entry #3, run 'bomb': YAML alias refused at line 16, column 12: alias *e would make the file's "
        "aliases expand to more than 100000 nodes (an alias bomb?)"]

    # The code location, as `dagster` loads it in a process of its own: the other runs and the problem.
    listed = subprocess.run([str(Path(sys.executable).parent / "dagster"), "asset", "list", "-m",
                             "hermes_assets.definitions"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    groups = {line.split("/")[0] for line in listed.stdout.split()}
    assert groups == {"first", "merged", "after", "bomb"}
    assert "bomb/declaration" in listed.stdout.split() and "bomb/prompts" not in listed.stdout.split()


def test_a_yaml_problem_in_one_entry_costs_only_that_entry(isolated_homes, tmp_path):
    root = data_root()
    write_dataset(root / "p.jsonl")
    runs = write_runs(root / "runs.yaml", f"""- {{run_name: good, dataset_file: p.jsonl, model: hermes-sim}}
- run_name: tagged
  dataset_file: !!python/object/apply:os.system ["touch {tmp_path}/ran"]
  model: hermes-sim
- run_name: dated
  dataset_file: p.jsonl
  model: hermes-sim
  seed: 2024-13-45
- {{run_name: unanchored, dataset_file: p.jsonl, model: *nowhere}}
- {{run_name: looped, dataset_file: p.jsonl, model: m, providers_order: &r [*r]}}
- run_name: unclosed
  dataset_file: [p.jsonl
  model: hermes-sim
- {{run_name: last, dataset_file: p.jsonl, model: hermes-sim}}
""")
    declared, problems = read_runs_file(runs)
    assert [d.recipe.run_name for d in declared] == ["good", "last"]
    assert [str(p) for p in problems] == [
        f"{runs}, entry #2, run 'tagged': YAML error at line 3, column 17: could not determine a constructor for "
        "the tag 'tag:yaml.org,2002:python/object/apply:os.system'",
        f"{runs}, entry #3, run 'dated': YAML error at line 8, column 9: cannot read '2024-13-45' as timestamp: "
        "month must be in 1..12",
        f"{runs}, entry #4, run 'unanchored': YAML alias refused at line 9, column 56: undefined alias *nowhere",
        f"{runs}, entry #5, run 'looped': YAML alias refused at line 10, column 76: alias *r is inside the node it "
        "names",
        f"{runs}, entry #6: YAML syntax error at line 13, column 8: expected ',' or ']', but got ':' (while "
        "parsing a flow sequence at line 12, column 17)"]
    assert not (tmp_path / "ran").exists()

    nodes = _asset_nodes(build_definitions(root))
    assert {key.split("/")[0] for key in nodes} == {"good", "last", "tagged", "dated", "unanchored", "looped",
                                                    "runs_file_entry_6"}
    assert "good/prompts" in nodes and "last/prompts" in nodes
    assert nodes["runs_file_entry_6/declaration"].description.startswith(f"{runs}, entry #6: YAML syntax error")


def test_run_names_equal_but_for_case_are_refused(isolated_homes):
    root = data_root()
    dataset = write_dataset(root / "p.jsonl")
    save_recipe(root, Recipe(run_name="Nightly", dataset_file=str(dataset), model="hermes-sim"))
    runs = write_runs(root / "runs.yaml", """
- {run_name: Alpha, dataset_file: p.jsonl, model: hermes-sim}
- {run_name: alpha, dataset_file: p.jsonl, model: other}
- {run_name: nightly, dataset_file: p.jsonl, model: hermes-sim}
""")
    recipes, problems = resolve_runs(root)
    assert [(r.run_name, r.model) for r in recipes] == [("Alpha", "hermes-sim"), ("Nightly", "hermes-sim")]
    assert [str(p) for p in problems] == [
        f"{runs}, entry #2, run 'alpha', field 'run_name': run 'alpha' is already declared by entry #1 as "
        "'Alpha' (run names that differ only in case are one run: they would share a folder on a "
        "case-insensitive file system); this entry is ignored",
        f"{runs}, entry #3, run 'nightly', field 'run_name': run 'nightly' differs only in case from the run "
        f"'Nightly' saved in {root / 'Nightly'} (they would share a folder on a case-insensitive file system); "
        "this entry is ignored"]
