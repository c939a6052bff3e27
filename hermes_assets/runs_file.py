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
only while the saved run has no ledger yet, else the saved run keeps its saved recipe and the conflict
is reported.

Problems are collected, never fatal to the code location (`resolve_runs`): each is a `RunsFileProblem`
naming the file, the entry and the field, so one bad entry is reported on that run alone
(hermes_assets/declarations.py) while every other run loads. `load_runs_file` and `resolve_recipes`
are the strict forms: they raise one `RunsFileError` listing every problem.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, NamedTuple

from hermes_assets.compression_assets import validate_compression_settings
from hermes_assets.yaml_entries import YamlFileError, read_list, scalar_of

from hermes_core.config import ledger_location
from hermes_core.environments.env_run import EnvRun, EnvRunError
from hermes_core.fileio import atomic_write_text
from hermes_core.batch.ledgers import has_records
from hermes_core.batch.recipe import (FINGERPRINT_FIELDS, Recipe, RecipeError, list_recipes, run_dir,
                                      save_recipe)

RUNS_FILE_ENV = "HERMES_RUNS_FILE"
DEFAULT_NAME = "runs.yaml"
REQUIRED = ("run_name", "dataset_file", "model")
PATH_FIELDS = ("dataset_file", "distributions_file")
KNOWN = tuple(f.name for f in dataclasses.fields(Recipe))
ENV_KEY = "tasks_file"  # an entry with one is an environment run (hermes_core.environments.env_run)
ENV_FIELDS = tuple(f.name for f in dataclasses.fields(EnvRun))
SHORT = reprlib.Repr()  # a wrong value in a problem line: its start, however large the value
SHORT.maxstring, SHORT.maxother = 80, 80
# Fingerprinted only when set (Recipe._compute_fingerprint), so named when they differ in a conflict.
LATE_FINGERPRINT_FIELDS = ("tool_call_mode", "discard_incomplete", "max_sample_cost_usd", "max_sample_tokens",
                           "hermes_text_sha256")


@dataclasses.dataclass(frozen=True)
class RunsFileProblem:
    """One problem of the runs file: the file, the entry (1-based; None for the whole file), the entry's
    run_name when it has a string one, the setting at fault, and what is wrong."""

    file: Path | str
    what: str
    entry: int | None = None
    run_name: str | None = None
    field: str | None = None

    def where(self) -> str:
        return ", ".join([str(self.file)]
                         + ([f"entry #{self.entry}"] if self.entry is not None else [])
                         + ([f"run {self.run_name!r}"] if self.run_name is not None else [])
                         + ([f"field {self.field!r}"] if self.field else []))

    def __str__(self) -> str:
        return f"{self.where()}: {self.what}"


class RunsFileError(RecipeError):
    """The runs file is unusable, or a declared run conflicts with a run already under way."""

    def __init__(self, problems: list[RunsFileProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(map(str, problems)))


class Declared(NamedTuple):
    entry: int  # its position in the runs file, 1-based
    recipe: Recipe


def runs_file_path(root: Path) -> Path | None:
    """`$HERMES_RUNS_FILE` (must exist), else `<root>/runs.yaml` if present, else None."""
    configured = os.environ.get(RUNS_FILE_ENV)
    if configured:
        path = Path(configured).expanduser().resolve()
        if not path.is_file():
            raise RunsFileError([RunsFileProblem(path, f"runs file not found (set by ${RUNS_FILE_ENV})")])
        return path
    default = root / DEFAULT_NAME
    return default if default.is_file() else None


def _type_problem(name: str, value: Any, hint: Any) -> str | None:
    """Why `value` does not fit the Recipe field's type, or None. YAML gives us the real types, so a
    quoted number or a list where a string belongs is caught here with the field's name."""
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        return None if type(None) in allowed else "a value is required"
    if name == "compression" and isinstance(value, dict):
        try:
            validate_compression_settings(value)
            return None
        except ValueError as exc:
            return str(exc)
    for kind in allowed:
        if kind is bool and isinstance(value, bool):
            return None
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return None
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if kind is str and isinstance(value, str):
            return None
        if typing.get_origin(kind) is dict and isinstance(value, dict):
            return None
        if typing.get_origin(kind) is list and isinstance(value, list):
            item = typing.get_args(kind)[0]  # list[str] wants strings; list[dict] items: the Recipe checks
            if item is not str or all(isinstance(element, str) for element in value):
                return None
    wanted = " or ".join("null" if k is type(None) else getattr(k, "__name__", "mapping") for k in allowed)
    return f"expected {wanted}, got {type(value).__name__} {SHORT.repr(value)}"


def _field_named(message: str) -> str | None:
    """The Recipe field a RecipeError talks about (its messages name it), for the problem's `field`."""
    words = message.replace(":", " ").replace("'", " ").split()
    return next((word for word in words if word in KNOWN), None)


def _already_declared(name: str, first: int, first_name: str) -> str:
    """Why a later entry whose run_name equals an earlier one, ignoring case, is left out."""
    spelled = "" if first_name == name else (
        f" as {first_name!r} (run names that differ only in case are one run: they would share a folder "
        "on a case-insensitive file system)")
    return f"run {name!r} is already declared by entry #{first}{spelled}; this entry is ignored"


def _entry_problems(path: Path, number: int, entry: Any,
                    seen: dict[str, tuple[int, str]]) -> tuple[Recipe | None, list[RunsFileProblem]]:
    """The entry's recipe, or the problems that keep it from loading (one per field at fault). `seen`
    holds the run names declared so far (casefolded: their entry and spelling)."""
    if not isinstance(entry, dict):
        return None, [RunsFileProblem(path, f"expected a mapping of settings, got {type(entry).__name__}", number)]
    if ENV_KEY in entry:
        return None, []  # an environment run: environment_runs reads it
    name = entry.get("run_name") if isinstance(entry.get("run_name"), str) else None
    at = {"file": path, "entry": number, "run_name": name}
    problems = []
    for key in (k for k in entry if k not in KNOWN):
        close = difflib.get_close_matches(str(key), KNOWN, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known settings: {', '.join(KNOWN)}"
        problems.append(RunsFileProblem(**at, field=str(key), what=f"unknown setting; {hint}"))
    problems += [RunsFileProblem(**at, field=key, what="required setting is missing")
                 for key in REQUIRED if entry.get(key) in (None, "")]
    if problems:
        return None, problems
    if name.casefold() in seen:
        return None, [RunsFileProblem(**at, field="run_name", what=_already_declared(name, *seen[name.casefold()]))]
    seen[name.casefold()] = (number, name)
    hints = typing.get_type_hints(Recipe)
    problems = [RunsFileProblem(**at, field=key, what=wrong) for key, value in entry.items()
                if (wrong := _type_problem(key, value, hints[key]))]
    if problems:
        return None, problems
    settings = dict(entry)
    for key in PATH_FIELDS:
        if settings.get(key):
            settings[key] = str((path.parent / Path(settings[key]).expanduser()).resolve())
    if settings.get("hermes_agent_python"):  # not through symlinks: a venv's python links to another
        settings["hermes_agent_python"] = os.path.abspath(path.parent / Path(settings["hermes_agent_python"]).expanduser())
    try:
        return Recipe(**settings), []
    except (RecipeError, TypeError, ValueError) as exc:
        return None, [RunsFileProblem(**at, field=_field_named(str(exc)), what=str(exc))]


def read_runs_file(path: Path, last_good: Path | None = None) -> tuple[list[Declared], list[RunsFileProblem]]:
    """Every valid declared run, and every problem of the file (a whole-file problem has no entry).
    A bad entry costs only itself, its YAML included (hermes_assets.yaml_entries): the others are
    still returned. With `last_good`, a copy of the file as it last parsed is kept there, and a file
    that no longer parses at all (a syntax error outside every entry) declares what that copy does,
    its problem reported beside them: the runs it declared never vanish from the UI meanwhile."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [], [RunsFileProblem(path, f"cannot read the runs file: {exc}")]
    try:
        entries = read_list(text, "runs", wrapper="runs")  # `runs: [...]` too
    except YamlFileError as exc:  # one line, with the place: the UI shows it as the problem
        try:
            entries = read_list(last_good.read_text(encoding="utf-8"), "runs", wrapper="runs") if last_good else None
        except (OSError, UnicodeDecodeError, YamlFileError):
            entries = None
        if entries is None:
            return [], [RunsFileProblem(path, str(exc))]
        return _declared(path, entries)[0], [RunsFileProblem(path, f"{exc}; until it is fixed, the runs it declared "
                                                                   f"when it last loaded are used ({last_good})")]
    if last_good is not None and (not last_good.is_file() or last_good.read_text(encoding="utf-8") != text):
        atomic_write_text(last_good, text)
    return _declared(path, entries)


def _declared(path: Path, entries: list | None) -> tuple[list[Declared], list[RunsFileProblem]]:
    declared: list[Declared] = []
    problems: list[RunsFileProblem] = []
    seen: dict[str, tuple[int, str]] = {}
    for entry in entries or []:
        if entry.problem:
            problems.append(RunsFileProblem(path, entry.problem, entry.number, scalar_of(entry.node, "run_name")))
            continue
        recipe, entry_problems = _entry_problems(path, entry.number, entry.value, seen)
        problems += entry_problems
        if recipe is not None:
            declared.append(Declared(entry.number, recipe))
    return declared, problems


def environment_runs(root: Path, run_names: set[str] = frozenset()) -> tuple[list[EnvRun], list[RunsFileProblem]]:
    """The runs file's environment runs (entries with a `tasks_file`) and their problems, each naming
    the entry and the setting; a bad entry, or one named like a batch run in `run_names` (they would
    share a folder and an asset group), costs only itself."""
    taken = {name.casefold() for name in run_names}
    try:
        path = runs_file_path(root)
        entries = read_list(path.read_text(encoding="utf-8"), "runs", wrapper="runs") if path else []
    except (RunsFileError, OSError, UnicodeDecodeError, YamlFileError):
        return [], []  # resolve_runs reports what is wrong with the file itself
    runs, problems, seen = [], [], set()
    for entry in entries or []:
        value = entry.value
        if entry.problem or not isinstance(value, dict) or ENV_KEY not in value:
            continue
        name = value.get("env_name") if isinstance(value.get("env_name"), str) else None
        try:
            run = EnvRun.from_mapping(value, path.parent)
            if run.env_name.casefold() in seen:
                raise EnvRunError(f"env_name {run.env_name!r} is declared twice; this entry is ignored")
            if run.env_name.casefold() in taken:
                raise EnvRunError(f"env_name {run.env_name!r} is the name of a batch run (they would share a "
                                  "folder); this entry is ignored")
        except EnvRunError as exc:
            field = next((w.strip("'") for w in str(exc).split() if w.strip("'") in ENV_FIELDS), None)
            problems.append(RunsFileProblem(path, str(exc), entry.number, name, field))
            continue
        seen.add(run.env_name.casefold())
        runs.append(run)
    return runs, problems


def load_runs_file(path: Path) -> list[Recipe]:
    """Every declared run (the strict validator): any problem raises one error listing them all."""
    declared, problems = read_runs_file(path)
    if problems:
        raise RunsFileError(problems)
    return [recipe for _, recipe in declared]


def _has_ledger(root: Path, run_name: str) -> bool:
    return has_records(ledger_location(run_dir(root, run_name)))


def _saved_json(root: Path, run_name: str) -> dict[str, Any] | None:
    path = run_dir(root, run_name) / "recipe.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None  # unreadable: list_recipes already warned; the declared recipe replaces it


def _conflict(root: Path, recipe: Recipe, origin: Path | str, entry: int | None = None) -> RunsFileProblem | None:
    """The problem when `recipe` would replace a saved recipe with another fingerprint of a run that has
    ledger records (its data was made under the saved one); None when it may replace it."""
    saved = _saved_json(root, recipe.run_name) or {}
    if saved.get("fingerprint") in (None, recipe.fingerprint()) or not _has_ledger(root, recipe.run_name):
        return None
    changed = [n for n in (*FINGERPRINT_FIELDS, *LATE_FINGERPRINT_FIELDS) if saved.get(n) != getattr(recipe, n)]
    return RunsFileProblem(
        origin, entry=entry, run_name=recipe.run_name, field=", ".join(changed) or "distributions_file",
        what=f"the declared recipe (fingerprint {recipe.fingerprint()}) differs from the one saved in "
        f"{run_dir(root, recipe.run_name) / 'recipe.json'} (fingerprint {saved['fingerprint']}), and that run "
        "already has ledger records, so it keeps its saved recipe; declare it under a new run_name, or "
        "restore the saved settings")


def _case_clash(root: Path, recipe: Recipe, saved: dict[str, str], origin: Path | str,
                entry: int) -> RunsFileProblem | None:
    """The problem when a saved run's name equals the declared one's but for case (`saved`: casefolded
    name -> saved name); the saved run keeps loading."""
    name = saved.get(recipe.run_name.casefold(), recipe.run_name)
    if name == recipe.run_name:
        return None
    return RunsFileProblem(origin, entry=entry, run_name=recipe.run_name, field="run_name",
                           what=f"run {recipe.run_name!r} differs only in case from the run {name!r} saved in "
                           f"{run_dir(root, name)} (they would share a folder on a case-insensitive file "
                           "system); this entry is ignored")


def resolve_runs(root: Path, runs_file: Path | None = None) -> tuple[list[Recipe], list[RunsFileProblem]]:
    """Saved runs plus the valid declared runs (declared settings win, see the module doc), sorted by
    name, and every problem of the runs file. Never raises for the runs file: a conflicting run keeps
    its saved recipe and a bad entry is left out, each reported once in the problems."""
    recipes = {recipe.run_name: recipe for recipe in list_recipes(root)}
    try:
        runs_file = runs_file or runs_file_path(root)
    except RunsFileError as exc:
        return [recipes[name] for name in sorted(recipes)], exc.problems
    declared, problems = read_runs_file(runs_file, last_good_copy(root, runs_file)) if runs_file else ([], [])
    saved = {name.casefold(): name for name in recipes}
    for entry, recipe in declared:
        conflict = (_case_clash(root, recipe, saved, runs_file, entry)
                    or (_conflict(root, recipe, runs_file, entry) if recipe.run_name in recipes else None))
        if conflict:
            problems.append(conflict)
        else:
            recipes[recipe.run_name] = recipe
    return [recipes[name] for name in sorted(recipes)], problems


def last_good_copy(root: Path, runs_file: Path) -> Path:
    """Where the runs file's content is kept as it last parsed (one copy per runs file path)."""
    return root / ".runs-file" / f"{hashlib.sha256(str(runs_file.resolve()).encode()).hexdigest()[:16]}.yaml"


def resolve_recipes(root: Path, runs_file: Path | None = None) -> list[Recipe]:
    """`resolve_runs`, strict: any problem of the runs file raises one error listing them all."""
    recipes, problems = resolve_runs(root, runs_file)
    if problems:
        raise RunsFileError(problems)
    return recipes


def adopt_recipe(root: Path, recipe: Recipe) -> Path:
    """Save a declared run's recipe into its folder (creating it) before its first materialization, so
    the CLI and later loads see it. A changed fingerprint replaces the saved one only while the run has
    no ledger records; otherwise nothing is written and the error names both recipes."""
    try:
        origin: Path | str = runs_file_path(root) or "the code location"
    except RunsFileError:
        origin = "the code location"
    conflict = _conflict(root, recipe, origin)
    if conflict:
        raise RunsFileError([conflict])
    return save_recipe(root, recipe, force_new_fingerprint=True)
