"""A run left settled by the last command: a resume with nothing to do, told without Dagster.

A `hermes-batch` invocation that ends cleanly (every sample final, outputs written, checks run)
saves what it left: the size and mtime of every file of the run folder (the ledger's included) and
of the dataset, the identity of the instance's run storage, the source files, and the check lines
it printed. A later command that finds all of these unchanged has nothing to plan, run or rebuild, so it prints
the same summary without importing Dagster or starting its three runs (~3 s). Anything that
changed since, a UI materialization included, makes the full path run as before.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from hermes_core.config import VERSION
from hermes_core.fileio import atomic_write_json
from hermes_core.batch.pipeline import RunPaths

STATE_FILE = "settled.json"
CODE_ROOTS = [Path(__file__).resolve().parents[2] / package for package in ("hermes_core", "hermes_assets")]
# The run folder's files a step writes (the recipe is compared by content; the ledger's files, raw/, apart).
_RUN_FILES = ("dataset.json", "prompts.jsonl", "assignments.jsonl", "batches.json",
              "invocations.jsonl", "trajectories.jsonl", "statistics.json", "checkpoint.json")


def _stat(path: Path) -> list[int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return [stat.st_ino, stat.st_size, stat.st_mtime_ns]


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
        "dataset": [str(dataset), _stat(dataset)],
        # The instance's config as a whole (an edit may point it at other storage); its run storage
        # by identity only: other runs write there all the time, and a wiped instance is a new file.
        "instance": {str(path): _stat(path) if path.suffix == ".yaml" else (_stat(path) or [None])[0]
                     for path in instance_files},
        "files": {name: _stat(paths.root / name) for name in _RUN_FILES},
        "raw": {entry.name: _stat(Path(entry.path)) for entry in raw},
    }


def save_settled(paths: RunPaths, dataset: Path, instance_files: list[Path], check_lines: list[str]) -> None:
    """Record that the run is settled as it is now, and the check lines the command printed."""
    state = folder_state(paths, dataset, instance_files)
    if state is not None:
        atomic_write_json(paths.root / STATE_FILE, {"state": state, "check_lines": check_lines})


def settled_check_lines(paths: RunPaths, dataset: Path, instance_files: list[Path]) -> list[str] | None:
    """The check lines of the command that left the run settled, if nothing changed since; else None."""
    try:
        saved = json.loads((paths.root / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    state = folder_state(paths, dataset, instance_files)
    if state is None or not isinstance(saved, dict) or saved.get("state") != json.loads(json.dumps(state)):
        return None
    return list(saved.get("check_lines") or [])
