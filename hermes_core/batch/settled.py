"""A run left settled by the last command: a resume with nothing to do, told without Dagster.

A `hermes-batch` invocation that ends cleanly (every sample final, outputs written, checks run)
saves what it left: the size and mtime of every file of the run folder (the ledger's included) and
of the dataset, the identity of the instance's run storage and the variables its config reads, the
source files, and the check lines it printed. A later command that finds all of these unchanged has
nothing to plan, run or rebuild, so it prints the same summary without importing Dagster or starting
its three runs (~3 s). Anything that changed since, a UI materialization included, makes the full
path run as before.

A `--plan_only` command saves the same after its plan run, for the plan's scope only: the next
`--plan_only` of the unchanged run prints its plan without the plan run (at 100k rows ~1 s instead
of ~3 s), while a command that runs samples takes the full path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from hermes_core.config import VERSION
from hermes_core.fileio import atomic_write_json
from hermes_core.batch.pipeline import RunPaths
from hermes_core.batch import prompt_table

STATE_FILE = "settled.json"
_ENV_REFERENCE = re.compile(r"\benv:\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")
RUN, PLAN = "run", "plan"  # what a settled state vouches for: the whole command, or its plan only
CODE_ROOTS = [Path(__file__).resolve().parents[2] / package for package in ("hermes_core", "hermes_assets")]


def _stat(path: Path) -> list[int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return [stat.st_ino, stat.st_size, stat.st_mtime_ns]


def _identity(path: Path) -> dict[str, int] | None:
    """The dataset's identity with its change time (an edit that sets the mtime back changes it)."""
    try:
        return prompt_table.file_identity(path)
    except OSError:
        return None


def _instance_env(instance_files: list[Path]) -> str | None:
    """One digest of the environment variables the instance's config reads (`env: NAME`, such as a
    Postgres URL): the same dagster.yaml can name another instance. A digest, as the values may
    hold passwords; None when the config reads none."""
    names = sorted({name for path in instance_files if path.suffix == ".yaml" and path.is_file()
                    for name in _ENV_REFERENCE.findall(path.read_text(errors="replace"))})
    if not names:
        return None
    return hashlib.sha256("".join(f"{name}={os.environ.get(name, '')}\0" for name in names).encode()).hexdigest()


def _code_state(roots: list[Path]) -> str:
    """A hash over the size and mtime of every source file: the code versions of the assets hash
    their sources (versions.py), so changed code is a new state too."""
    digest = hashlib.sha256(VERSION.encode())
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            stat = path.stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def folder_state(paths: RunPaths, dataset: Path, instance_files: list[Path]) -> dict[str, Any] | None:
    """What the run looks like now; None when its ledger is not a local folder (object storage: a
    listing would cost what it saves)."""
    if not isinstance(paths.raw, Path):
        return None
    raw = sorted(os.scandir(paths.raw), key=lambda entry: entry.name) if paths.raw.is_dir() else []
    return {
        "code": _code_state(CODE_ROOTS),
        # By content: every command saves the recipe again.
        "recipe": hashlib.sha256(paths.recipe.read_bytes()).hexdigest() if paths.recipe.is_file() else None,
        "dataset": [str(dataset), _identity(dataset)],
        # The instance's config as a whole (an edit may point it at other storage); its run storage
        # by identity only: other runs write there all the time, and a wiped instance is a new file.
        "instance": {str(path): _stat(path) if path.suffix == ".yaml" else (_stat(path) or [None])[0]
                     for path in instance_files},
        "instance_env": _instance_env(instance_files),
        # The files steps write (the recipe is compared by content, the ledger's files apart).
        "files": {path.name: _stat(path) for path in paths.step_files()},
        "raw": {entry.name: _stat(Path(entry.path)) for entry in raw},
    }


class Printed(NamedTuple):
    """What the command that left the run settled printed beside the run's summary."""

    check_lines: list[str]  # before it, on stderr
    after_summary: list[str]  # after it, on stdout (e.g. the compression's lines)


def save_settled(paths: RunPaths, dataset: Path, instance_files: list[Path], printed: Printed,
                 scope: str = RUN) -> None:
    """Record that the run is settled as it is now for `scope` (RUN or PLAN), and what the command
    printed beside its summary. Not while the dataset changed < RACY_S ago: a second edit within the
    same timestamp tick could keep its identity (prompt_table.py), so the next command checks it."""
    state = folder_state(paths, dataset, instance_files)
    path = paths.root / STATE_FILE
    if state is None or not state["dataset"][1] or prompt_table.too_recent(state["dataset"][1]):
        path.unlink(missing_ok=True)  # what it vouched for is gone, whatever this command changed
        return
    atomic_write_json(path, {"scope": scope, "state": state, "check_lines": printed.check_lines,
                             "after_summary": printed.after_summary})


def settled_lines(paths: RunPaths, dataset: Path, instance_files: list[Path], scope: str = RUN) -> Printed | None:
    """What the command that left the run settled printed beside its summary, if nothing changed
    since and its state covers `scope` (a settled run covers its plan too); else None."""
    try:
        saved = json.loads((paths.root / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("scope", RUN) not in (RUN, scope):
        return None
    state = folder_state(paths, dataset, instance_files)
    if state is None or saved.get("state") != json.loads(json.dumps(state)):
        return None
    return Printed(list(saved.get("check_lines") or []), list(saved.get("after_summary") or []))
