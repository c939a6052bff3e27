"""Scheduled backfills (SPEC §5): a sensor per run that notices new or changed dataset rows, plans
them into batch partitions, requests the partitions with pending samples, then the final assets.

One tick does one phase, in this order:
1. the dataset changed since the last planning (its sha256 differs from `<run>/dataset.json`, or the
   planning never finished) → one run of `prompts` + `toolset_assignments` (registers new batches);
2. batches with pending samples (`pipeline.plan`) that are not in flight → one run per
   `raw_trajectories` partition;
3. nothing pending, but `statistics` is older than the newest raw/assignments materialization → one
   run of `filtered_trajectories` + `statistics` (and their checks).

Run keys encode the state that caused the request (dataset sha + mtime, ledger records of the batch,
newest upstream storage id), so the daemon never launches the same request twice, and a batch whose run
failed is retried once its ledger has new records. The cursor caches the dataset's size/mtime/sha256
(hashing only when size or mtime moved) and the keys already requested, so evaluating again is a no-op.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from hermes_core.batch import pipeline
from hermes_core.batch.ledgers import open_ledger
from hermes_core.batch.pipeline import RunPaths
from hermes_assets.compression_assets import recipe_compression
from hermes_core.batch.recipe import Recipe, run_dir
from hermes_assets.run_assets import batches_partitions
from hermes_assets.slots import reap_dead_runs
from hermes_assets.versions import run_tags

if TYPE_CHECKING:  # no public alias for what define_asset_job returns
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

INTERVAL_ENV = "HERMES_SENSOR_INTERVAL_S"
DEFAULT_INTERVAL_S = 60


def _key(run: str, name: str) -> dg.AssetKey:
    return dg.AssetKey([run, name])


def plan_job_name(run: str) -> str:
    return f"{run}__plan_job"


def raw_job_name(run: str) -> str:
    return f"{run}__batch_job"


def finalize_job_name(run: str) -> str:
    return f"{run}__finalize_job"


def build_run_jobs(recipe: Recipe) -> list[UnresolvedAssetJobDefinition]:
    """The asset jobs the sensor targets (also handy in the UI's Launchpad)."""
    run = recipe.run_name
    return [
        dg.define_asset_job(plan_job_name(run), selection=[_key(run, "prompts"), _key(run, "toolset_assignments")],
                            description="Load the dataset and plan new samples into batch partitions."),
        dg.define_asset_job(raw_job_name(run), selection=[_key(run, "raw_trajectories")],
                            description="Run the pending samples of one batch partition."),
        dg.define_asset_job(finalize_job_name(run), selection=[
                                _key(run, "filtered_trajectories"), _key(run, "statistics"),
                                *([_key(run, "compressed_trajectories")] if recipe_compression(recipe) else [])],
                            description="Merge the kept trajectories, run the checks, compute statistics."),
    ]


def _interval(minimum_interval_seconds: int | None) -> int:
    if minimum_interval_seconds is not None:
        return minimum_interval_seconds
    raw = os.environ.get(INTERVAL_ENV, "")
    try:
        return int(raw) if raw.strip() else DEFAULT_INTERVAL_S
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV}={raw!r}: expected whole seconds, e.g. 300") from None


def dataset_state(path: Path, cached: dict[str, Any] | None) -> dict[str, Any]:
    """size, mtime_ns and sha256 of the dataset; the hash is reused while size and mtime are unchanged."""
    stat = path.stat()
    if cached and cached.get("size") == stat.st_size and cached.get("mtime_ns") == stat.st_mtime_ns:
        return cached
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest.hexdigest()}


def planned_sha256(paths: RunPaths) -> str | None:
    """The dataset hash of the last finished planning: `prompts` records it in dataset.json, and the
    planning counts as finished once `toolset_assignments` wrote its file after that."""
    if not (paths.dataset.is_file() and paths.assignments.is_file()):
        return None
    if paths.assignments.stat().st_mtime_ns < paths.dataset.stat().st_mtime_ns:
        return None  # prompts ran, toolset_assignments did not (yet, or it failed)
    return json.loads(paths.dataset.read_text()).get("sha256")


def _newest_storage_id(instance: dg.DagsterInstance, key: dg.AssetKey) -> int:
    records = instance.fetch_materializations(key, limit=1).records
    return records[0].storage_id if records else 0


def _raw_requests(
    recipe: Recipe, paths: RunPaths, instance: dg.DagsterInstance
) -> tuple[dict[str, dg.RunRequest], list[str], list[str]]:
    """Run requests by run key for pending batches not in flight; the pending batches in flight; the
    pending batches the instance does not know yet (e.g. planned by a run on another instance)."""
    pending = pipeline.plan(recipe, paths).partitions
    partitions = batches_partitions(recipe.run_name)
    known = set(instance.get_dynamic_partitions(partitions.name))
    statuses = instance.get_status_by_partition(
        _key(recipe.run_name, "raw_trajectories"), [p for p in pending if p in known], partitions) or {}
    in_flight = [p for p in pending if statuses.get(p) == dg.AssetPartitionStatus.IN_PROGRESS]
    recorded = open_ledger(paths.raw).records_per_partition  # once per tick: a refresh lists the ledger
    requests = {}
    for partition in pending:
        if partition in in_flight:
            continue
        # The record count moves on every attempt, so a failed batch gets a fresh key (a retry), while
        # an unchanged one keeps its key (no double request).
        run_key = f"raw:{partition}:{recorded.get(partition, 0)}"
        requests[run_key] = dg.RunRequest(run_key=run_key, job_name=raw_job_name(recipe.run_name),
                                          partition_key=partition)
    return requests, in_flight, [p for p in pending if p not in known]


def evaluate(context: dg.SensorEvaluationContext, recipe: Recipe, data_root: Path) -> dg.SensorResult:
    """One tick (see the module doc). Pure function of the files, the instance and the cursor."""
    run, paths = recipe.run_name, RunPaths(run_dir(data_root, recipe.run_name))
    cursor = json.loads(context.cursor) if context.cursor else {}
    requested = set(cursor.get("requested", []))
    dataset_file = Path(recipe.dataset_file)
    if not dataset_file.is_file():
        return dg.SensorResult(skip_reason=f"{dataset_file}: dataset file not found", cursor=context.cursor)
    dataset = dataset_state(dataset_file, cursor.get("dataset"))

    def result(candidates: dict[str, dg.RunRequest], waiting: str, **extra: Any) -> dg.SensorResult:
        hermes_tags = run_tags(recipe, dataset["sha256"])  # the Runs page filters on these
        fresh = [request.with_replaced_attrs(tags={**hermes_tags, **request.tags})
                 for key, request in candidates.items() if key not in requested]
        # Keep only keys still relevant, so the cursor stays small and stale keys can't block anything.
        kept = sorted((requested & set(candidates)) | {request.run_key for request in fresh})
        state = json.dumps({"dataset": dataset, "requested": kept}, sort_keys=True)
        skip = None if fresh else waiting
        return dg.SensorResult(run_requests=fresh, skip_reason=skip, cursor=state, **extra)

    if planned_sha256(paths) != dataset["sha256"]:
        run_key = f"plan:{dataset['sha256'][:16]}:{dataset['mtime_ns']}"
        request = dg.RunRequest(run_key=run_key, job_name=plan_job_name(run))
        return result({run_key: request}, f"planning of {dataset_file} (sha256 {dataset['sha256'][:12]}) was "
                      "requested; waiting for it (if it failed, fix the dataset: any change re-plans)")

    raw, in_flight, unknown = _raw_requests(recipe, paths, context.instance)
    if raw or in_flight:
        registering = [dg.AddDynamicPartitionsRequest(batches_partitions(run).name, unknown)] if unknown else []
        return result(raw, f"{len(raw) + len(in_flight)} batch(es) with pending samples are requested or in "
                      "flight; a failed batch is retried once its ledger has new records",
                      dynamic_partitions_requests=registering)

    upstream = max(_newest_storage_id(context.instance, _key(run, "raw_trajectories")),
                   _newest_storage_id(context.instance, _key(run, "toolset_assignments")))
    if upstream > _newest_storage_id(context.instance, _key(run, "statistics")):
        run_key = f"finalize:{upstream}"
        return result({run_key: dg.RunRequest(run_key=run_key, job_name=finalize_job_name(run))},
                      "the final assets were requested; waiting for them")
    return result({}, "up to date: no dataset change, no pending samples, statistics current")


def build_run_sensor(
    recipe: Recipe,
    data_root: Path,
    minimum_interval_seconds: int | None = None,
    jobs: list[UnresolvedAssetJobDefinition] | None = None,
) -> dg.SensorDefinition:
    """The run's dataset sensor, stopped by default (turn it on in the UI: Automation → Sensors).
    Interval: the argument, else $HERMES_SENSOR_INTERVAL_S, else 60 s. Pass the `build_run_jobs`
    list you also give to Definitions, so each job is defined once."""
    jobs = jobs if jobs is not None else build_run_jobs(recipe)

    @dg.sensor(
        name=f"{recipe.run_name}__dataset_sensor",
        jobs=jobs,
        minimum_interval_seconds=_interval(minimum_interval_seconds),
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"Watches {recipe.dataset_file}: plans new rows, backfills pending batches of run "
        f"{recipe.run_name!r} one run per partition, then refreshes the trajectories and statistics.",
    )
    def dataset_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        reap_dead_runs(context.instance)  # the daemon frees what runs killed on this host still hold
        return evaluate(context, recipe, data_root)

    return dataset_sensor
