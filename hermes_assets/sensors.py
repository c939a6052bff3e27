"""Scheduled backfills (SPEC §5): one sensor per run and one for all (and datasets_sensor.py's, for all).

- `<run>__dataset_sensor` (stopped by default: it spends). One tick looks at the dataset, the ledger and
  the instance and requests the first phase that has work: planning (the dataset changed), the
  batches (every pending batch in ONE run over their partition range), or the final assets.
- `hermes__refresh_chain` (one run status sensor for every run, running): when a phase requested by a
  dataset sensor succeeds, it requests the next one at once (planning → batches → final assets), so new
  rows reach fresh statistics within one dataset-sensor interval plus the work, not one interval per
  phase. One for all: the daemon evaluates every running sensor every few seconds, whatever it has to do.

Every request has a run key naming the state it answers (dataset hash + mtime, the pending batches and
their ledger record counts, the newest upstream materialization; or the run it follows), so the daemon
never launches the same request twice; a failed batch is requested again once its ledger has new
records; nothing is requested while a run of this refresh is queued or going.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster._core.definitions.assets.job.asset_job import IMPLICIT_ASSET_JOB_NAME
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES

from hermes_core.batch import pipeline
from hermes_core.batch.dataset import DatasetError
from hermes_core.batch.ledgers import open_ledger
from hermes_core.batch.pipeline import RunPaths
from hermes_core.batch.recipe import Recipe, RecipeError, run_dir
from hermes_assets.compression_assets import recipe_compression
from hermes_assets.export_assets import EXPORT_NAMES, REPO_ENV
from hermes_assets.run_assets import batches_partitions
from hermes_assets.slots import HIDDEN, reap_dead_runs
from hermes_assets.versions import dataset_state, run_tags

if TYPE_CHECKING:  # no public alias for what define_asset_job returns
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

INTERVAL_ENV = "HERMES_SENSOR_INTERVAL_S"
DEFAULT_INTERVAL_S = 60
CHAIN_INTERVAL_S = 5  # the sensor daemon's own loop: a refresh's next phase starts within seconds
CHAIN_SENSOR = "hermes__refresh_chain"
REFRESH_TAG = f"{HIDDEN}refresh"  # on runs the dataset sensor and the refresh chain start (hidden in the UI)


def _key(run: str, name: str) -> dg.AssetKey:
    return dg.AssetKey([run, name])


def plan_job_name(run: str) -> str:
    return f"{run}__plan_job"


def raw_job_name(run: str) -> str:
    return f"{run}__batch_job"


def finalize_job_name(run: str) -> str:
    return f"{run}__finalize_job"


def final_asset_names(recipe: Recipe) -> list[str]:
    """The unpartitioned assets after `raw_trajectories` that a refresh rebuilds, so an idle group is all
    fresh: the exports too, unless they push to the Hub ($HERMES_HF_REPO set), a deliberate act then."""
    return ["filtered_trajectories", "statistics", "samples",
            *(["compressed_trajectories"] if recipe_compression(recipe) else []),
            *([] if os.environ.get(REPO_ENV) else EXPORT_NAMES)]


def build_run_jobs(recipe: Recipe) -> list[UnresolvedAssetJobDefinition]:
    """The run's three phases as jobs (the CLI runs them; handy in the Launchpad). A job's assets bring
    their checks along."""
    run = recipe.run_name
    return [
        dg.define_asset_job(plan_job_name(run), selection=[_key(run, "prompts"), _key(run, "toolset_assignments")],
                            description="Load the dataset and plan new samples into batch partitions."),
        dg.define_asset_job(raw_job_name(run), selection=[_key(run, "raw_trajectories")],
                            description="Run the pending samples of the selected batch partitions."),
        dg.define_asset_job(finalize_job_name(run), selection=[_key(run, name) for name in final_asset_names(recipe)],
                            description="Merge the kept trajectories, run the checks, compute statistics."),
    ]


def _interval(minimum_interval_seconds: int | None, recipe: Recipe) -> int:
    """The argument, else the run's `refresh_interval_s` (runs file), else $HERMES_SENSOR_INTERVAL_S, else 60."""
    for given in (minimum_interval_seconds, recipe.refresh_interval_s):
        if given is not None:
            return given
    raw = os.environ.get(INTERVAL_ENV, "")
    try:
        return int(raw) if raw.strip() else DEFAULT_INTERVAL_S
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV}={raw!r}: expected whole seconds, e.g. 300") from None


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


def partition_changes(
    recipe: Recipe, forecast: pipeline.Forecast, instance: dg.DagsterInstance
) -> list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest]:
    """Register the batches planned or forecast that the instance lacks; remove registered ones that
    are neither (their rows changed before planning) and were never materialized."""
    name = batches_partitions(recipe.run_name).name
    registered = instance.get_dynamic_partitions(name)
    missing = _unregistered(forecast, registered)
    wanted = set(forecast.planned) | set(forecast.partitions)
    orphans = [key for key in registered if key not in wanted]
    if orphans:
        done = instance.get_materialized_partitions(_key(recipe.run_name, "raw_trajectories"))
        orphans = [key for key in orphans if key not in done]
    return ([dg.AddDynamicPartitionsRequest(name, missing)] if missing else []) + \
        ([dg.DeleteDynamicPartitionsRequest(name, orphans)] if orphans else [])


def register_partitions(instance: dg.DagsterInstance, recipe: Recipe, forecast: pipeline.Forecast) -> None:
    """Register the batches of `forecast` that the instance lacks, so that one run can plan them and
    run them (hermes-batch); removing orphans is the dataset sensor's."""
    name = batches_partitions(recipe.run_name).name
    if missing := _unregistered(forecast, instance.get_dynamic_partitions(name)):
        instance.add_dynamic_partitions(name, missing)


def _unregistered(forecast: pipeline.Forecast, registered: list[str]) -> list[str]:
    known = set(registered)
    return [key for key in forecast.partitions if key not in known]


# Dagster's in-progress statuses leave out a queued run (up to the queue's dequeue interval before it
# starts): a tick in that second requested the same phase again, and a refresh ran two finalize runs.
_NOT_FINISHED = [dg.DagsterRunStatus.QUEUED, *IN_PROGRESS_RUN_STATUSES]


def _in_flight(instance: dg.DagsterInstance, run: str) -> list[str]:
    """Ids of runs of this run's jobs (from a sensor, the CLI or the Launchpad) that are queued or going,
    and of the asset job's runs tagged with it (hermes-batch plans and runs batches in one of those)."""
    jobs = (plan_job_name(run), raw_job_name(run), finalize_job_name(run))
    return [r.run_id for r in instance.get_runs(filters=dg.RunsFilter(statuses=_NOT_FINISHED))
            if r.job_name in jobs or (r.job_name == IMPLICIT_ASSET_JOB_NAME and r.tags.get("hermes/run") == run)]


def _unrequested(instance: dg.DagsterInstance, request: dg.RunRequest) -> dg.RunRequest | None:
    """The request, unless a run for the same refresh state exists: the dataset sensor and the refresh
    chain may both see a phase due (a tick between a run's success and the chain's request)."""
    return None if instance.get_runs(filters=dg.RunsFilter(tags={REFRESH_TAG: request.tags[REFRESH_TAG]}),
                                     limit=1) else request


def _state_key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def batches_request(recipe: Recipe, partitions: list[str], recorded: dict[str, int], tags: dict[str, str]
                    ) -> dg.RunRequest:
    """Every pending batch in ONE run over their partition range (what `BackfillPolicy.single_run` makes
    of a contiguous range; done batches inside a gapped range are no-ops that send nothing). The key
    covers the batches' record counts: a failed batch gets a new key (a retry) once its ledger moved."""
    state = _state_key([(key, recorded.get(key, 0)) for key in partitions])
    return dg.RunRequest(
        run_key=f"batches:{state}", job_name=raw_job_name(recipe.run_name),
        tags={**tags, REFRESH_TAG: state, "dagster/asset_partition_range_start": partitions[0],
              "dagster/asset_partition_range_end": partitions[-1]})


def finalize_request(recipe: Recipe, upstream: int, tags: dict[str, str]) -> dg.RunRequest:
    return dg.RunRequest(run_key=f"finalize:{upstream}", job_name=finalize_job_name(recipe.run_name),
                         tags={**tags, REFRESH_TAG: f"finalize:{upstream}"})


def _upstream(instance: dg.DagsterInstance, run: str) -> int:
    """The newest materialization the final assets read."""
    return max(_newest_storage_id(instance, _key(run, "raw_trajectories")),
               _newest_storage_id(instance, _key(run, "toolset_assignments")))


def evaluate(context: dg.SensorEvaluationContext, recipe: Recipe, data_root: Path) -> dg.SensorResult:
    """One tick (see the module doc). Pure function of the files, the instance and the cursor."""
    run, paths = recipe.run_name, RunPaths(run_dir(data_root, recipe.run_name))
    cursor = json.loads(context.cursor) if context.cursor else {}
    dataset_file = Path(recipe.dataset_file)
    if not dataset_file.is_file():
        return dg.SensorResult(skip_reason=f"{dataset_file}: dataset file not found", cursor=context.cursor)
    dataset = dataset_state(dataset_file, cursor.get("dataset"))
    state = json.dumps({"dataset": dataset}, sort_keys=True)
    try:
        forecast = pipeline.forecast(recipe, paths)
    except (DatasetError, RecipeError) as exc:  # the planning run would fail the same way: say why here
        return dg.SensorResult(skip_reason=f"cannot plan {dataset_file}: {exc}", cursor=state)
    changes = partition_changes(recipe, forecast, context.instance)

    def result(request: dg.RunRequest | None, reason: str) -> dg.SensorResult:
        if request is not None and not (request := _unrequested(context.instance, request)):
            reason = "this state's phase was requested already; a failed batch is requested again once its " \
                     "ledger has new records, new rows make a new request"
        return dg.SensorResult(run_requests=[request] if request else [], skip_reason=None if request else reason,
                               dynamic_partitions_requests=changes, cursor=state)

    if going := _in_flight(context.instance, run):
        return result(None, f"run(s) {', '.join(going)} of this refresh are queued or going; the refresh "
                      "chain requests the next phase when they succeed")
    tags = run_tags(recipe, dataset["sha256"])  # the Runs page filters on these
    if planned_sha256(paths) != dataset["sha256"]:
        key = f"plan:{dataset['sha256'][:16]}:{dataset['mtime_ns']}"
        return result(dg.RunRequest(run_key=key, job_name=plan_job_name(run), tags={**tags, REFRESH_TAG: key}), "")
    if forecast.partitions:  # planning is current, so the forecast is the plan: nothing new in it
        return result(batches_request(recipe, forecast.partitions, open_ledger(paths.raw).records_per_partition,
                                      tags), "")
    upstream = _upstream(context.instance, run)
    if upstream > _newest_storage_id(context.instance, _key(run, "statistics")):
        return result(finalize_request(recipe, upstream, tags), "")
    return result(None, "up to date: no dataset change, no pending samples, statistics current")


def follow(context: dg.RunStatusSensorContext, recipe: Recipe, data_root: Path) -> dg.RunRequest | dg.SkipReason:
    """The phase after a refresh run that succeeded: batches after planning, final assets after batches."""
    finished = context.dagster_run
    if REFRESH_TAG not in finished.tags:
        return dg.SkipReason(f"run {finished.run_id} was not started by the dataset sensor")
    paths, run = RunPaths(run_dir(data_root, recipe.run_name)), recipe.run_name
    if going := [i for i in _in_flight(context.instance, run) if i != finished.run_id]:  # e.g. a tick came first
        return dg.SkipReason(f"run(s) {', '.join(going)} of this refresh are queued or going; the next phase is "
                             "requested once they end")
    tags = {k: v for k, v in finished.tags.items() if k.startswith("hermes/")}  # bookkeeping ones are hidden
    if finished.job_name == plan_job_name(run) and (pending := pipeline.plan(recipe, paths).partitions):
        request = batches_request(recipe, pending, open_ledger(paths.raw).records_per_partition, tags)
    else:
        request = finalize_request(recipe, _upstream(context.instance, run), tags)
    request = _unrequested(context.instance, request.with_replaced_attrs(run_key=f"after:{finished.run_id}"))
    return request or dg.SkipReason(f"the phase after run {finished.run_id} was requested already")


def build_dataset_sensor(
    recipe: Recipe,
    data_root: Path,
    minimum_interval_seconds: int | None = None,
    jobs: list[UnresolvedAssetJobDefinition] | None = None,
) -> dg.SensorDefinition:
    """The run's dataset sensor (stopped by default: turn it on in the UI, Automation → Sensors; interval:
    see `_interval`); `build_chain_sensor` follows the refreshes of every run. Pass the `build_run_jobs`
    list you also give to Definitions, so each job is defined once."""
    run = recipe.run_name
    plan_job, batch_job, finalize_job = jobs if jobs is not None else build_run_jobs(recipe)

    @dg.sensor(
        name=f"{run}__dataset_sensor",
        jobs=[plan_job, batch_job, finalize_job],
        minimum_interval_seconds=_interval(minimum_interval_seconds, recipe),
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"Watches {recipe.dataset_file} of run {run!r}: on new or changed rows, pending batches or "
        "stale final assets it starts a refresh (plan, every pending batch in one run, then trajectories, "
        "statistics and the sample table; the refresh chain sensor requests each next phase).",
    )
    def dataset_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        reap_dead_runs(context.instance)  # the daemon frees what runs killed on this host still hold
        return evaluate(context, recipe, data_root)

    return dataset_sensor


def build_chain_sensor(recipes: list[Recipe], data_root: Path,
                       jobs: dict[str, list[UnresolvedAssetJobDefinition]]) -> dg.SensorDefinition:
    """The one refresh chain of every run (`jobs`: each run's `build_run_jobs` list, by run name)."""
    by_job = {job.name: recipe for recipe in recipes for job in jobs[recipe.run_name][:2]}

    @dg.run_status_sensor(
        name=CHAIN_SENSOR,
        run_status=dg.DagsterRunStatus.SUCCESS,
        monitored_jobs=[job for recipe in recipes for job in jobs[recipe.run_name][:2]],  # plan and batches
        request_jobs=[job for recipe in recipes for job in jobs[recipe.run_name][1:]],  # batches and final
        minimum_interval_seconds=CHAIN_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Requests the next phase of a refresh that a run's dataset sensor started, as soon as the "
        "previous one succeeded. Acts only on runs a dataset sensor started.",
    )
    def refresh_chain(context: dg.RunStatusSensorContext) -> dg.RunRequest | dg.SkipReason:
        recipe = by_job.get(context.dagster_run.job_name)
        if recipe is None:
            return dg.SkipReason(f"run {context.dagster_run.run_id} is not a phase of a declared run")
        return follow(context, recipe, data_root)

    return refresh_chain
