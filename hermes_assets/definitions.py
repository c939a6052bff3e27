"""The Dagster code location: one asset group per run found under the data root."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from hermes_core.config import data_root
from hermes_core.recipe import Recipe, list_recipes
from hermes_assets.resources import ModelEndpointResource
from hermes_assets.run_assets import build_run_assets


def build_definitions(
    root: Path | None = None, recipes: list[Recipe] | None = None, model_endpoint: ModelEndpointResource | None = None
) -> dg.Definitions:
    root = data_root(root)
    recipes = list_recipes(root) if recipes is None else recipes
    return dg.Definitions(
        assets=[asset for recipe in recipes for asset in build_run_assets(recipe, root)],
        resources={"model_endpoint": model_endpoint or ModelEndpointResource()},
        executor=dg.in_process_executor,  # a run is one process driving many async sessions
    )


defs = build_definitions()
