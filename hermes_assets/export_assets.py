"""Training exports of a run as Dagster assets, in the run's group: `hf_dataset` (save_to_disk + Parquet +
card, pushed to $HERMES_HF_REPO when that is set) and `trl_messages` (OpenAI messages for TRL).
Thin: the work is in `hermes_core.exports`."""

import os
from pathlib import Path
from typing import Any, Callable

import dagster as dg

from hermes_core.exports import REPO_ENV
from hermes_core.batch.recipe import Recipe, run_dir
from hermes_assets.versions import CODE_VERSIONS, attribute_run
from hermes_assets.checks import refuse_if_blocked
from hermes_assets.metadata import catalog


def _schema(features: Any) -> dg.TableSchema:
    """Columns of a `datasets.Features` for the asset's column-schema panel."""
    from hermes_core.exports.card import feature_type

    return dg.TableSchema(columns=[dg.TableColumn(name, feature_type(f)) for name, f in features.items()])


EXPORT_NAMES = ["hf_dataset", "trl_messages"]  # the assets below, by name


def build_export_assets(recipe: Recipe, data_root: Path) -> list[dg.AssetsDefinition]:
    """A batch run's exports: after statistics too (the dataset card quotes the run's counts from
    statistics.json). The blocking checks of filtered_trajectories gate both: in the same run Dagster
    skips them, in a later run `refuse_if_blocked` fails them with the names of the failed checks."""
    run = recipe.run_name
    folder = run_dir(data_root, run)

    def prepare(context: dg.AssetExecutionContext) -> None:
        attribute_run(context, recipe, folder)
        refuse_if_blocked(context, run)

    return export_assets(run, folder, [dg.AssetKey([run, "filtered_trajectories"]), dg.AssetKey([run, "statistics"])],
                         prepare)


def export_assets(run: str, folder: Path, deps: list[dg.AssetKey],
                  prepare: Callable[[dg.AssetExecutionContext], None]) -> list[dg.AssetsDefinition]:
    """`hf_dataset` and `trl_messages` of the run in `folder` (a batch run, or an environment run's
    reward-filtered rows), after `deps`; `prepare` runs first in each step."""
    common = {"key_prefix": [run], "group_name": run, "code_version": CODE_VERSIONS["exports"], "deps": deps}

    @dg.asset(**common, **catalog("export", "huggingface", "parquet"),
              description="Kept rows as an HF dataset (save_to_disk) and Parquet, with a "
              f"dataset card, one fixed schema; pushed to the Hub when ${REPO_ENV} is set.")
    def hf_dataset(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        from hermes_core.exports import hf

        prepare(context)
        result = hf.export_hf(folder)
        metadata: dict[str, object] = {
            "dagster/row_count": result.rows,
            "dagster/column_schema": _schema(result.features),
            "content_sha256": result.sha256,
            "dispositions": dg.MetadataValue.json(result.dispositions),
            **{label: dg.MetadataValue.path(str(path)) for label, path in result.paths.items()},
        }
        repo = os.environ.get(REPO_ENV)
        if repo:
            metadata["hub_commit"] = dg.MetadataValue.url(hf.push_to_hub(folder, repo))
        return dg.MaterializeResult(metadata=metadata)

    @dg.asset(**common, **catalog("export", "json", "parquet"),
              description="Kept rows as OpenAI messages (tool_calls, role: tool, "
              "reasoning_content) with a JSON-string tools column, for TRL SFTTrainer: JSONL + Parquet.")
    def trl_messages(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        from hermes_core.exports import trl

        prepare(context)
        result = trl.export_trl(folder)
        return dg.MaterializeResult(metadata={
            "dagster/row_count": result.rows,
            "dagster/column_schema": _schema(trl.TRL_FEATURES),
            **{label: dg.MetadataValue.path(str(path)) for label, path in result.paths.items()},
        })

    return [hf_dataset, trl_messages]
