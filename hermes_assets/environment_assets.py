"""One asset group per environment run (a runs-file entry with a `tasks_file`): task_set →
scored_rollouts (a partition per task, resumed by content key) → evaluation (blocking checks) →
sft_rows. Thin: the work is hermes_core.environments."""

import queue
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import dagster as dg

from hermes_assets.export_assets import export_assets
from hermes_assets.metadata import bar_chart, catalog
from hermes_assets.resources import MODEL_POOL, ModelEndpointResource
from hermes_assets.run_assets import fail_batches
from hermes_core.environments.env_run import EnvRun, partition_key, run_tasks
from hermes_core.environments.evaluation import best_of_n_rows, summary
from hermes_core.environments.groups import GroupFailed, alignment_problems
from hermes_core.environments.tasks import TaskFileError
from hermes_core.exports.rows import SFT_ROWS
from hermes_core.fileio import atomic_write_json, atomic_write_jsonl

ENV_TAG = "hermes/environment"


def tasks_partitions(name: str) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=f"{name}__tasks")


def _tasks(run: EnvRun):
    try:
        return run.tasks()
    except TaskFileError as exc:
        raise dg.Failure(description=str(exc)) from None


def build_environment_assets(run: EnvRun, root: Path) -> list[dg.AssetsDefinition]:
    name, folder = run.env_name, run.folder(root)
    partitions = tasks_partitions(name)
    common = {"key_prefix": [name], "group_name": name}

    @dg.asset(**common, **catalog("input", "json"), description=f"The task file {run.tasks_file}, validated; "
              "one scored_rollouts partition per task.")
    def task_set(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        tasks = _tasks(run)
        keys = [partition_key(task) for task in tasks.tasks]
        known = set(context.instance.get_dynamic_partitions(partitions.name))
        if new := [key for key in keys if key not in known]:
            context.instance.add_dynamic_partitions(partitions.name, new)
        for gone in sorted(known - set(keys)):
            context.instance.delete_dynamic_partition(partitions.name, gone)
        splits, categories = Counter(t.split for t in tasks.tasks), Counter(t.category for t in tasks.tasks)
        return dg.MaterializeResult(data_version=dg.DataVersion(tasks.sha256[:16]), metadata={
            "tasks": len(tasks.tasks), "train": splits["train"], "eval": splits["eval"], "new_partitions": len(new),
            "categories": dg.MetadataValue.md(bar_chart("tasks", dict(categories.most_common()))),
            "tasks_file": dg.MetadataValue.path(str(tasks.path)), "tasks_sha256": tasks.sha256})

    @dg.asset(**common, **catalog("generation", "openai"), deps=[task_set], partitions_def=partitions,
              backfill_policy=dg.BackfillPolicy.single_run(), pool=MODEL_POOL, output_required=False,
              description=f"{run.groups_per_task} group(s) of {run.group_size} scored rollouts per task, appended "
              f"to {folder / 'groups.jsonl'} as each ends; a group already there is never run again.")
    def scored_rollouts(context: dg.AssetExecutionContext, model_endpoint: ModelEndpointResource):
        context.instance.add_run_tags(context.run.run_id, {ENV_TAG: name})
        wanted = set(context.partition_keys)
        tasks = [task for task in _tasks(run).tasks if partition_key(task) in wanted]
        endpoint = model_endpoint.endpoint(run.model, run.base_url)
        yield from _score(context, run, root, tasks, endpoint)

    @dg.asset(**common, **catalog("output", "json"), deps=[scored_rollouts],
              description="Rewards of the current groups: pass rate, mean and spread per category and per split "
              "(eval: the held-out tasks), groups without GRPO signal (all scores equal), turns, tool errors, tokens.")
    def evaluation(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        records = run.current_records(root, _tasks(run).tasks)
        figures = summary(records)
        path = atomic_write_json(folder / "evaluation.json", figures)
        passes = {c: round(f["pass_rate"] * 100) for c, f in figures["categories"].items()}
        return dg.MaterializeResult(metadata={
            **{k: v for k, v in figures.items() if k not in ("categories", "splits")},
            "categories": dg.MetadataValue.json(figures["categories"]),
            "splits": dg.MetadataValue.json(figures["splits"]),
            "pass_rate_by_category": dg.MetadataValue.md(bar_chart("pass rate %", passes)),
            "path": dg.MetadataValue.path(str(path))})

    @dg.asset(**common, **catalog("output", "json"), deps=[evaluation],
              description=f"Each group's best rollout scoring at least {run.min_reward}, as rows that name their "
              "task, group, reward, run and model: ShareGPT `conversations` and TRL `messages` + `tools` "
              "(reward-filtered SFT).")
    def sft_rows(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        rows = best_of_n_rows(run.current_records(root, _tasks(run).tasks), run.min_reward, name)
        path = folder / SFT_ROWS
        atomic_write_jsonl(path, rows)
        return dg.MaterializeResult(metadata={"rows": len(rows), "path": dg.MetadataValue.path(str(path))})

    # The reward-filtered rows feed the batch runs' exports (HF dataset + card, Parquet, TRL messages).
    exports = export_assets(name, folder, [sft_rows.key], prepare=lambda context: None)
    return [task_set, scored_rollouts, evaluation, sft_rows, *exports]


def _score(context: dg.AssetExecutionContext, run: EnvRun, root: Path, tasks: list, endpoint) -> Iterator[Any]:
    """Run the tasks' missing groups in a thread; materialize each task's partition once all its groups
    are scored (so a failure elsewhere never marks it failed); fail the unfinished ones at the end."""
    events: queue.Queue[dict[str, Any] | GroupFailed | None] = queue.Queue()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["counts"] = run_tasks(run, root, tasks, endpoint, on_group=events.put)
        except BaseException as exc:  # re-raised in the step, with its own message
            outcome["error"] = exc
        finally:
            events.put(None)

    stored = Counter(record["task_id"] for record in run.current_records(root, tasks))
    done = {task.id for task in tasks if stored[task.id] == run.groups_per_task}
    for task in tasks:
        if task.id in done:
            yield dg.AssetMaterialization(context.asset_key, partition=partition_key(task), metadata={"groups_run": 0})
    threading.Thread(target=work, name=f"{run.env_name}-groups", daemon=True).start()
    scored: Counter[str] = Counter()
    failures: list[str] = []
    while (event := events.get()) is not None:
        if isinstance(event, GroupFailed):
            failures.append(str(event))
            context.log.warning(f"group failed: {event}")
            continue
        scored[event["task_id"]] += 1
        if scored[event["task_id"]] == run.groups_per_task:
            yield dg.AssetMaterialization(context.asset_key, partition=event["task_id"], metadata={
                "groups_run": scored[event["task_id"]], "scores": dg.MetadataValue.json(event["scores"])})
    if "error" in outcome:
        raise outcome["error"]
    unfinished = [partition_key(task) for task in tasks if task.id not in done and scored[task.id] < run.groups_per_task]
    if failures or unfinished:
        fail_batches(context, unfinished, f"{len(failures)} group(s) failed after their retries (their rollouts' "
                     f"errors are in the step's log); the scored groups are saved. Materialize the failed "
                     f"partitions again to retry them. First: {failures[0] if failures else 'none'}")


def build_environment_checks(run: EnvRun, root: Path) -> list[dg.AssetChecksDefinition]:
    """Blocking checks on evaluation: a failure stops sft_rows in the same run."""
    evaluation = dg.AssetKey([run.env_name, "evaluation"])

    @dg.asset_check(asset=evaluation, blocking=True, name="groups_aligned",
                    description="Tokens, masks and scores line up; every sequence trains at least one token.")
    def groups_aligned() -> dg.AssetCheckResult:
        problems = [f"{r['task_id']} group {r['group']}: {p}" for r in run.current_records(root, _tasks(run).tasks)
                    for p in alignment_problems(r)]
        return dg.AssetCheckResult(passed=not problems, metadata={"problems": len(problems),
                                                                   "first": problems[0] if problems else "-"})

    @dg.asset_check(asset=evaluation, blocking=True, name="atropos_schema_valid",
                    description="Every group validates against atroposlib's own ScoredData model.")
    def atropos_schema_valid() -> dg.AssetCheckResult:
        try:
            from hermes_core.environments.atropos_env import schema_problem
        except ImportError as exc:
            return dg.AssetCheckResult(passed=False, metadata={"first": f"needs the atropos extra: {exc}"})
        problems = [f"{r['task_id']} group {r['group']}: {p}" for r in run.current_records(root, _tasks(run).tasks)
                    if (p := schema_problem(r))]
        return dg.AssetCheckResult(passed=not problems, metadata={"problems": len(problems),
                                                                   "first": problems[0] if problems else "-"})

    return [groups_aligned, atropos_schema_valid]
