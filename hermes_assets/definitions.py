"""The Dagster code location: one asset group per run (saved under the data root by the CLI, or
declared in the runs file), with its asset checks, its jobs and its dataset sensor; two sensors for all
runs (the refresh chain, the dataset watch); one asset group per environment run of the runs file
(environment_assets.py); each problem of the runs file is a failing `<run>/declaration` asset
(declarations.py) instead of a load error."""

from __future__ import annotations

import warnings
from pathlib import Path

import dagster as dg

from hermes_core.config import data_root
from hermes_core.batch.recipe import Recipe
from hermes_assets.checks import build_run_checks
from hermes_assets.compression_assets import build_compression_assets
from hermes_assets.declarations import build_declaration_assets, log_problems
from hermes_assets.export_assets import build_export_assets
from hermes_assets.partition_checks import build_partition_checks
from hermes_assets.resources import ModelEndpointResource
from hermes_assets.run_assets import build_run_assets
from hermes_assets.runs_file import environment_runs, resolve_runs
from hermes_assets.environment_assets import build_environment_assets, build_environment_checks
from hermes_assets.datasets_sensor import build_datasets_sensor
from hermes_assets.sensors import build_chain_sensor, build_dataset_sensor, build_run_jobs
from hermes_assets.table_assets import build_table_assets


# Observable sources and backfill policies are beta on purpose here; Dagster warned of them for every
# run's group at every load, in the code server and in each run's process: hundreds of lines a day.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)


def build_definitions(
    root: Path | None = None,
    recipes: list[Recipe] | None = None,
    model_endpoint: ModelEndpointResource | None = None,
    sensor_interval_seconds: int | None = None,
) -> dg.Definitions:
    """`recipes` defaults to the saved runs under `root` merged with the runs file (runs_file.py)."""
    root = data_root(root)
    declared = recipes is None
    recipes, problems = resolve_runs(root) if declared else (recipes, [])
    environments, env_problems = environment_runs(root, {recipe.run_name for recipe in recipes}) if declared else ([], [])
    problems += env_problems
    log_problems(problems)
    assets, checks, jobs, sensors, jobs_of = build_declaration_assets(problems), [], [], [], {}
    for environment in environments:
        assets += build_environment_assets(environment, root)
        checks += build_environment_checks(environment, root)
    for recipe in recipes:
        assets += build_run_assets(recipe, root) + build_compression_assets(recipe, root)
        assets += build_export_assets(recipe, root) + build_table_assets(recipe, root)
        checks += build_run_checks(recipe, root) + build_partition_checks(recipe, root)
        jobs_of[recipe.run_name] = run_jobs = build_run_jobs(recipe)
        jobs += run_jobs
        sensors.append(build_dataset_sensor(recipe, root, sensor_interval_seconds, jobs=run_jobs))
    if recipes:
        sensors += [build_chain_sensor(recipes, root, jobs_of), build_datasets_sensor(recipes, root)]
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        sensors=sensors,
        resources={"model_endpoint": model_endpoint or ModelEndpointResource()},
        executor=dg.in_process_executor,  # a run is one process driving many async sessions
    )



@dg.definitions
def defs() -> dg.Definitions:
    """What the code location loads (workspace.yaml); built when it loads or reloads, not on import, so
    the CLI importing this module pays nothing for the other runs."""
    return build_definitions()
