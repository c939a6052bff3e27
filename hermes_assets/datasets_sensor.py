"""`hermes__datasets`: one sensor for every run's dataset file (running; never launches a run).

A tick stats each dataset file; only a file whose size or mtime moved since the last tick is read:
- its new version (the sha256 of its bytes) is recorded as an observation of the run's `dataset_file`
  source asset, so `prompts` shows stale in the UI within one tick, with no click and no run; and
  `filtered_trajectories`' check `built_from_current_dataset` is evaluated (a warning while the outputs
  are from an older version), since Dagster marks only the direct dependant of a source stale;
- the batch partitions are made equal to what planning the file as it is now will create
  (`pipeline.forecast`), so the UI lists new rows' batches, and *Materialize all* covers them, before
  they are planned.

One sensor for all, ticking cheaply: the daemon calls the code server for every running sensor at every
interval, whatever it has to do, and one per run cost the instance most of a core with 50 runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg

from hermes_core.batch import pipeline
from hermes_core.batch.dataset import DatasetError
from hermes_core.batch.pipeline import RunPaths
from hermes_core.batch.recipe import Recipe, RecipeError, run_dir
from hermes_assets.checks import CURRENT_CHECK, dataset_currency
from hermes_assets.sensors import partition_changes
from hermes_assets.versions import dataset_asset_key, dataset_observation, dataset_state

DATASETS_SENSOR = "hermes__datasets"
INTERVAL_S = 15  # a stat per run: soon after rows are appended, the UI shows them stale and their batches


def _observation(instance: dg.DagsterInstance, recipe: Recipe, state: dict[str, Any]) -> dg.AssetObservation | None:
    """The dataset's new version as an observation, unless the instance holds it already (`prompts`
    records what it read, and a restarted daemon has no cursor)."""
    key = dataset_asset_key(recipe.run_name)
    return dataset_observation(instance.get_latest_data_version_record(key, is_source=True), key, state["sha256"],
                               path=dg.MetadataValue.path(recipe.dataset_file), bytes=state["size"])


def watch(context: dg.SensorEvaluationContext, recipes: list[Recipe], data_root: Path) -> dg.SensorResult:
    """One tick (see the module doc): a pure function of the files, the instance and the cursor."""
    seen: dict[str, dict[str, Any]] = json.loads(context.cursor) if context.cursor else {}
    now: dict[str, dict[str, Any]] = {}
    events: list[dg.AssetObservation | dg.AssetCheckEvaluation] = []
    changes: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    problems: list[str] = []
    for recipe in recipes:
        run, path = recipe.run_name, Path(recipe.dataset_file)
        try:
            stat = path.stat()
        except OSError:
            problems.append(f"{run}: {path}: dataset file not found")
            continue
        before = seen.get(run)
        if before and (before["size"], before["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns):
            now[run] = before
            if "problem" in before:  # said again at every tick, without reading the file again
                problems.append(before["problem"])
            continue
        try:
            state = dataset_state(path, before)
        except OSError as exc:
            problems.append(f"{run}: cannot read {path}: {exc}")
            continue
        if observation := _observation(context.instance, recipe, state):
            events.append(observation)
        paths = RunPaths(run_dir(data_root, run))
        if paths.dataset.is_file():  # planned once: its outputs say whether they are from this version
            result = dataset_currency(paths, state["sha256"])
            events.append(dg.AssetCheckEvaluation(
                asset_key=dg.AssetKey([run, "filtered_trajectories"]), check_name=CURRENT_CHECK, passed=result.passed,
                severity=result.severity, description=result.description, metadata=result.metadata))
        try:
            forecast = pipeline.forecast(recipe, paths)
        except (OSError, DatasetError, RecipeError) as exc:  # planning would fail the same way: say why
            now[run] = {**state, "problem": f"{run}: cannot plan {path}: {exc}"}
            problems.append(now[run]["problem"])
            continue
        now[run] = state
        changes += partition_changes(recipe, forecast, context.instance)
    reason = None if events or changes else "; ".join(problems) or f"{len(recipes)} dataset(s) unchanged"
    return dg.SensorResult(asset_events=events, dynamic_partitions_requests=changes, skip_reason=reason,
                           cursor=json.dumps(now, sort_keys=True))


def build_datasets_sensor(recipes: list[Recipe], data_root: Path) -> dg.SensorDefinition:
    @dg.sensor(
        name=DATASETS_SENSOR,
        minimum_interval_seconds=INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Watches every run's dataset file: a changed file is observed (its runs' prompts show "
        "stale) and its batch partitions registered before planning, so the UI lists them and Materialize "
        "all covers them. Never launches a run.",
    )
    def datasets_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        return watch(context, recipes, data_root)

    return datasets_sensor
