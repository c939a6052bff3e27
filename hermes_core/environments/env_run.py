"""An environment run: a task file rolled out in groups against one model, its groups kept in
`<data root>/<name>/groups.jsonl`, resumed by content key (the Dagster assets and the CLI drive it)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hermes_core.batch.recipe import RUN_NAME
from hermes_core.config import Endpoint
from hermes_core.environments.groups import GroupFailed, GroupLedger, group_key, run_groups, settings_fingerprint
from hermes_core.environments.rollout import RolloutSettings
from hermes_core.environments.tasks import BUILTIN_PREFIX, Task, TaskSet, load_tasks
from hermes_core.sandbox import get_backend
from hermes_core.tools.distributions import BUILTIN_DISTRIBUTIONS

REQUIRED = ("env_name", "tasks_file", "model")


class EnvRunError(ValueError):
    """An environment run's settings are unusable; the message names the setting."""


@dataclass(frozen=True)
class EnvRun:
    env_name: str = field(metadata={"doc": "the environment run's name: its folder and asset group"})
    tasks_file: str = field(metadata={"doc": "JSONL task file (relative to the runs file), or builtin:NAME"})
    model: str
    base_url: str | None = None
    group_size: int = 4
    groups_per_task: int = field(default=1, metadata={"doc": "groups of rollouts per task"})
    distribution: str = "terminal_only"
    sandbox: str = "local"
    max_turns: int = 10
    seed: int = 0
    temperature: float | None = None
    tokenizer: str | None = None  # a folder or a .gguf file; default: the local model's
    min_reward: float = field(default=1.0, metadata={"doc": "the SFT export keeps a group's best rollout at or above this reward"})
    retries: int = field(default=2, metadata={"doc": "retries of a rollout whose model, sandbox or verifier failed"})
    concurrency: int = field(default=8, metadata={"doc": "groups rolled out at once"})

    def __post_init__(self) -> None:
        if not RUN_NAME.match(self.env_name):
            raise EnvRunError(f"env_name {self.env_name!r}: letters, digits and _ only, starting with a letter")
        for name in ("group_size", "groups_per_task", "max_turns", "concurrency"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise EnvRunError(f"{name} must be a whole number ≥ 1")
        if self.distribution not in BUILTIN_DISTRIBUTIONS:
            raise EnvRunError(f"distribution {self.distribution!r}: one of {', '.join(BUILTIN_DISTRIBUTIONS)}")

    @classmethod
    def from_mapping(cls, settings: dict[str, Any], base: Path) -> "EnvRun":
        """From a runs-file entry: unknown or missing settings and bad values are EnvRunErrors naming them;
        tasks_file resolves against `base` (the runs file's folder)."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise EnvRunError(f"unknown setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
        missing = [key for key in REQUIRED if settings.get(key) in (None, "")]
        if missing:
            raise EnvRunError(f"required setting {missing[0]!r} is missing")
        tasks_file = str(settings["tasks_file"])
        if not tasks_file.startswith(BUILTIN_PREFIX):
            tasks_file = str((base / Path(tasks_file).expanduser()).resolve())
        resolved = {**settings, "tasks_file": tasks_file}
        try:
            return cls(**resolved)
        except TypeError as exc:
            raise EnvRunError(str(exc)) from None

    def folder(self, root: Path) -> Path:
        return root / self.env_name

    def ledger(self, root: Path) -> GroupLedger:
        return GroupLedger(self.folder(root) / "groups.jsonl")

    def settings(self, endpoint: Endpoint) -> RolloutSettings:
        return RolloutSettings(endpoint=endpoint, distribution=BUILTIN_DISTRIBUTIONS[self.distribution],
                               seed=self.seed, max_turns=self.max_turns, temperature=self.temperature)

    def tasks(self) -> TaskSet:
        return load_tasks(self.tasks_file)

    def fingerprint(self) -> str:
        """What every group key of this run shares (the model, not where it is served)."""
        anywhere = Endpoint("http://127.0.0.1/v1", "", self.model)  # the fingerprint holds the model name only
        return settings_fingerprint(self.settings(anywhere), self.group_size)

    def current_records(self, root: Path, tasks: list[Task]) -> list[dict[str, Any]]:
        """The ledger's groups for these tasks under these settings, in task then group order."""
        fingerprint = self.fingerprint()
        records = self.ledger(root).records()
        keys = [group_key(task, group, fingerprint) for task in tasks for group in range(self.groups_per_task)]
        return [records[key] for key in keys if key in records]


def partition_key(task: Task) -> str:
    """A task's Dagster partition: its id (the content key decides whether its groups are done)."""
    return task.id


def run_tasks(run: EnvRun, root: Path, tasks: list[Task], endpoint: Endpoint,
              on_group: Callable[[dict[str, Any] | GroupFailed], None] = lambda _: None) -> dict[str, int]:
    """Every group of `tasks` that the ledger lacks, rolled out, scored and appended (blocking)."""
    from hermes_core.environments.tokenizer import load_rollout_tokenizer  # only when there is work

    jobs = [(task, group) for task in tasks for group in range(run.groups_per_task)]
    settings = run.settings(endpoint)
    ledger = run.ledger(root)
    fingerprint = settings_fingerprint(settings, run.group_size)
    done = ledger.records()
    if all(group_key(task, group, fingerprint) in done for task, group in jobs):
        return {"run": 0, "skipped": len(jobs), "failed": 0}
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizer is used in forked workers
    tokenizer = load_rollout_tokenizer(run.tokenizer)
    with get_backend(run.sandbox) as backend:
        return run_groups(jobs, settings, run.group_size, backend, tokenizer, ledger, retries=run.retries,
                          concurrency=run.concurrency, done=done, on_group=on_group)
