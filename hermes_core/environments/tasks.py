"""Task files: what an RL environment rolls out, one task a line, validated like datasets are.

A line is a JSON object: `id` (unique string), `prompt`, optionally `image` / `cwd` (as dataset rows),
`verifier` (a spec, `hermes_core.environments.verifiers`), `category` and `split` (`train` or `eval`).
Every line is checked before anything runs; a bad file is one `TaskFileError` naming each bad line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes_core.batch.dataset import MAX_REPORTED_LINES, check_row, dataset_path, numbered_lines, DatasetError
from hermes_core.environments.verifiers import VerifierSpec, VerifierSpecError, parse_spec

SPLITS = ("train", "eval")
BUILTIN_PREFIX = "builtin:"
BUILTIN = Path(__file__).parent / "builtin"  # shipped environments: coding, terminal, task_folders


class TaskFileError(ValueError):
    """The task file cannot be used; the message names the file and each bad line."""


@dataclass(frozen=True)
class Task:
    id: str
    prompt: str
    verifier: VerifierSpec | None = None  # None: the environment scores the task itself (HermesEnv.verify)
    line: int = 0
    image: str | None = None
    cwd: str | None = None
    category: str = "default"
    split: str = "train"
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The task's content key: a changed prompt, image, cwd or verifier is a new task."""
        verifier = self.verifier.identity() if self.verifier else None
        identity = json.dumps({"id": self.id, "prompt": self.prompt, "image": self.image, "cwd": self.cwd,
                               "verifier": verifier}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(identity.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TaskSet:
    path: Path
    sha256: str
    tasks: list[Task]

    def split(self, name: str) -> list[Task]:
        return [task for task in self.tasks if task.split == name]


def _task(row: dict[str, Any], line: int, base: Path) -> Task:
    """One checked row as a Task; ValueError says which field is wrong."""
    task_id = row.get("id")
    if not isinstance(task_id, str) or not task_id.strip():
        raise ValueError("field 'id' must be a non-empty string")
    for key in ("category", "split"):
        if row.get(key) is not None and not isinstance(row[key], str):
            raise ValueError(f"field '{key}' must be a string")
    split = row.get("split") or "train"
    if split not in SPLITS:
        raise ValueError(f"field 'split' must be one of {', '.join(SPLITS)} (got {split!r})")
    if "verifier" not in row:
        raise ValueError("missing field 'verifier'")
    try:
        verifier = parse_spec(row["verifier"], base)
    except VerifierSpecError as exc:
        raise ValueError(f"field 'verifier': {exc}") from None
    return Task(id=task_id, prompt=row["prompt"], verifier=verifier, line=line,
                image=row.get("image") or row.get("docker_image"), cwd=row.get("cwd"),
                category=row.get("category") or "default", split=split, metadata=row.get("metadata") or {})


def builtin_names() -> list[str]:
    return sorted(folder.name for folder in BUILTIN.iterdir() if (folder / "tasks.jsonl").is_file())


def task_file_path(name: str | Path) -> Path:
    """`builtin:NAME` → the shipped environment's task file; anything else is a path."""
    text = str(name)
    if not text.startswith(BUILTIN_PREFIX):
        return Path(name)
    builtin = text.removeprefix(BUILTIN_PREFIX)
    if builtin not in builtin_names():
        raise TaskFileError(f"{text}: no such built-in environment (built in: {', '.join(builtin_names())})")
    return BUILTIN / builtin / "tasks.jsonl"


def load_tasks(path: str | Path) -> TaskSet:
    """Every line validated (JSON, prompt, image/cwd, id unique, verifier spec and the files it names);
    any bad line refuses the whole file, nothing run. `builtin:coding` and the like name shipped files."""
    path = task_file_path(path)
    try:
        resolved = dataset_path(path)
    except DatasetError as exc:
        raise TaskFileError(str(exc).replace("dataset file", "task file")) from None
    raw = resolved.read_bytes()
    tasks: list[Task] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for number, text, undecodable in numbered_lines(raw):
        if undecodable:
            problems.append(f"line {number}: {undecodable}")
            continue
        if not text.strip():
            continue
        row, reason = check_row(text)
        if row is not None:
            try:
                task = _task(row, number, resolved.parent)
            except ValueError as exc:
                reason = str(exc)
            else:
                if task.id in seen:
                    reason = f"id {task.id!r} repeats line {seen[task.id]}"
                else:
                    seen[task.id] = number
                    tasks.append(task)
        if reason:
            problems.append(f"line {number}: {reason}")
    if problems:
        shown = "\n".join(f"  {p}" for p in problems[:MAX_REPORTED_LINES])
        more = f"\n  ... and {len(problems) - MAX_REPORTED_LINES} more" if len(problems) > MAX_REPORTED_LINES else ""
        raise TaskFileError(f"{path}: {len(problems)} invalid line(s); nothing was run:\n{shown}{more}")
    if not tasks:
        raise TaskFileError(f"{path}: the task file has no tasks")
    return TaskSet(path=resolved, sha256=hashlib.sha256(raw).hexdigest(), tasks=tasks)
