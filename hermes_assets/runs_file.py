"""Runs declared in a YAML file, so a run shows up in the Dagster UI before the CLI ever ran it.

`$HERMES_RUNS_FILE`, else `<data root>/runs.yaml` when present: a list of Recipe settings, e.g.

    - run_name: nightly
      dataset_file: prompts.jsonl      # relative paths resolve against this file's folder
      model: hermes-sim
      base_url: http://127.0.0.1:8000/v1
      distribution: terminal_only
      batch_size: 10

A declared run and a run saved by the CLI (`<root>/<run>/recipe.json`) with the same name are merged:
same fingerprint → the declared settings are used; different fingerprint → the declared recipe wins
only while the saved run has no ledger yet, else it is an error naming both files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from hermes_assets.compression_assets import validate_compression_settings

from hermes_core.config import ledger_location
from hermes_core.batch.ledgers import has_records
from hermes_core.batch.recipe import Recipe, RecipeError, list_recipes, run_dir, save_recipe

RUNS_FILE_ENV = "HERMES_RUNS_FILE"
DEFAULT_NAME = "runs.yaml"
REQUIRED = ("run_name", "dataset_file", "model")
PATH_FIELDS = ("dataset_file", "distributions_file")


class RunsFileError(RecipeError):
    """The runs file is unusable, or a declared run conflicts with a run already under way."""


def runs_file_path(root: Path) -> Path | None:
    """`$HERMES_RUNS_FILE` (must exist), else `<root>/runs.yaml` if present, else None."""
    configured = os.environ.get(RUNS_FILE_ENV)
    if configured:
        path = Path(configured).expanduser().resolve()
        if not path.is_file():
            raise RunsFileError(f"{path}: runs file not found (set by ${RUNS_FILE_ENV})")
        return path
    default = root / DEFAULT_NAME
    return default if default.is_file() else None


def _type_problem(name: str, value: Any, hint: Any) -> str | None:
    """Why `value` does not fit the Recipe field's type, or None. YAML gives us the real types, so a
    quoted number or a list where a string belongs is caught here with the field's name."""
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        return None if type(None) in allowed else f"{name}: a value is required"
    if name == "compression" and isinstance(value, dict):
        try:
            validate_compression_settings(value)
            return None
        except ValueError as exc:
            return f"{name}: {exc}"
    for kind in allowed:
        if kind is bool and isinstance(value, bool):
            return None
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return None
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if kind is str and isinstance(value, str):
            return None
    wanted = " or ".join("null" if k is type(None) else k.__name__ for k in allowed)
    return f"{name}: expected {wanted}, got {type(value).__name__} {value!r}"


def _recipe(entry: dict[str, Any], base: Path) -> Recipe:
    hints = typing.get_type_hints(Recipe)
    problems = [p for name, value in entry.items() if (p := _type_problem(name, value, hints[name]))]
    if problems:
        raise RecipeError("; ".join(problems))
    settings = dict(entry)
    for name in PATH_FIELDS:
        if settings.get(name):
            settings[name] = str((base / Path(settings[name]).expanduser()).resolve())
    return Recipe(**settings)


def load_runs_file(path: Path) -> list[Recipe]:
    """Every declared run; all problems of the file are reported in one error naming the file and runs."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise RunsFileError(f"{path}: cannot read the runs file: {exc}") from None
    if isinstance(data, dict) and set(data) == {"runs"}:
        data = data["runs"]  # `runs: [...]` is accepted too
    if data is None:
        return []
    if not isinstance(data, list):
        raise RunsFileError(f"{path}: expected a YAML list of runs, got {type(data).__name__}")
    known = [f.name for f in dataclasses.fields(Recipe)]
    recipes: list[Recipe] = []
    problems: list[str] = []
    seen: set[str] = set()
    for number, entry in enumerate(data, start=1):
        if not isinstance(entry, dict):
            problems.append(f"run #{number}: expected a mapping of settings, got {type(entry).__name__}")
            continue
        label = f"run {entry['run_name']!r}" if isinstance(entry.get("run_name"), str) else f"run #{number}"
        unknown = sorted(str(k) for k in entry if k not in known)
        missing = [k for k in REQUIRED if entry.get(k) in (None, "")]
        if unknown or missing:
            problems.append(f"{label}: " + "; ".join(
                ([f"unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})"] if unknown else [])
                + ([f"missing {', '.join(missing)}"] if missing else [])))
            continue
        if entry["run_name"] in seen:
            problems.append(f"{label}: declared more than once")
            continue
        seen.add(entry["run_name"])
        try:
            recipes.append(_recipe(entry, path.parent))
        except (RecipeError, TypeError, ValueError) as exc:
            problems.append(f"{label}: {exc}")
    if problems:
        raise RunsFileError(f"{path}: " + ("\n  ".join(["invalid runs file:", *problems])))
    return recipes


def _has_ledger(root: Path, run_name: str) -> bool:
    return has_records(ledger_location(run_dir(root, run_name)))


def _saved_fingerprint(root: Path, run_name: str) -> str | None:
    path = run_dir(root, run_name) / "recipe.json"
    try:
        return json.loads(path.read_text()).get("fingerprint") if path.is_file() else None
    except ValueError:
        return None  # unreadable: list_recipes already warned; the declared recipe replaces it


def _conflict(root: Path, recipe: Recipe, origin: Path | str) -> RunsFileError:
    return RunsFileError(
        f"run {recipe.run_name!r} is declared in {origin} with a recipe (fingerprint {recipe.fingerprint()}) "
        f"that differs from the one saved in {run_dir(root, recipe.run_name) / 'recipe.json'} "
        f"(fingerprint {_saved_fingerprint(root, recipe.run_name)}), and that run already has ledger records; "
        "declare it under a new run_name, or restore the declared settings"
    )


def resolve_recipes(root: Path, runs_file: Path | None = None) -> list[Recipe]:
    """Saved runs plus declared runs (declared settings win, see the module doc), sorted by name."""
    runs_file = runs_file or runs_file_path(root)
    recipes = {recipe.run_name: recipe for recipe in list_recipes(root)}
    for declared in load_runs_file(runs_file) if runs_file else []:
        saved = recipes.get(declared.run_name)
        if saved and saved.fingerprint() != declared.fingerprint() and _has_ledger(root, declared.run_name):
            raise _conflict(root, declared, runs_file)
        recipes[declared.run_name] = declared
    return [recipes[name] for name in sorted(recipes)]


def adopt_recipe(root: Path, recipe: Recipe) -> Path:
    """Save a declared run's recipe into its folder (creating it) before its first materialization, so
    the CLI and later loads see it. A changed fingerprint replaces the saved one only while the run has
    no ledger records; otherwise nothing is written and the error names both recipes."""
    saved = _saved_fingerprint(root, recipe.run_name)
    if saved is not None and saved != recipe.fingerprint() and _has_ledger(root, recipe.run_name):
        raise _conflict(root, recipe, runs_file_path(root) or "the code location")
    return save_recipe(root, recipe, force_new_fingerprint=True)
