"""The Dagster code location: one asset group per run (saved under the data root by the CLI, or
declared in the runs file), with its asset checks, its jobs and its dataset sensor."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from hermes_core.config import data_root
from hermes_core.batch.recipe import Recipe
from hermes_assets.checks import build_run_checks
from hermes_assets.compression_assets import build_compression_assets
from hermes_assets.export_assets import build_export_assets
from hermes_assets.partition_checks import build_partition_checks
from hermes_assets.resources import ModelEndpointResource
from hermes_assets.run_assets import build_run_assets
from hermes_assets.runs_file import resolve_recipes
from hermes_assets.sensors import build_run_jobs, build_run_sensor
from hermes_assets.table_assets import build_table_assets


def build_definitions(
    root: Path | None = None,
    recipes: list[Recipe] | None = None,
    model_endpoint: ModelEndpointResource | None = None,
    sensor_interval_seconds: int | None = None,
) -> dg.Definitions:
    """`recipes` defaults to the saved runs under `root` merged with the runs file (runs_file.py)."""
    root = data_root(root)
    recipes = resolve_recipes(root) if recipes is None else recipes
    assets, checks, jobs, sensors = [], [], [], []
    for recipe in recipes:
        assets += build_run_assets(recipe, root) + build_compression_assets(recipe, root)
        assets += build_export_assets(recipe, root) + build_table_assets(recipe, root)
        checks += build_run_checks(recipe, root) + build_partition_checks(recipe, root)
        run_jobs = build_run_jobs(recipe)
        jobs += run_jobs
        sensors.append(build_run_sensor(recipe, root, sensor_interval_seconds, jobs=run_jobs))
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        sensors=sensors,
        resources={"model_endpoint": model_endpoint or ModelEndpointResource()},
        executor=dg.in_process_executor,  # a run is one process driving many async sessions
    )


defs = build_definitions()
