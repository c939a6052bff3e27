"""The per-sample table of a run as a Dagster asset: `<run>/samples`, a pandas DataFrame.

The DataFrame goes through the IO manager (the default one: a pickle under the instance's storage),
so a notebook gets it with `defs.load_asset_value(dg.AssetKey([run, "samples"]), instance=...)`, the
same rows `hermes_core.batch.sample_table.sample_table(run_dir)` builds and statistics.json sums.
The CLI does not build it: a CLI run stays free of pandas; materialize it from the UI when needed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

from hermes_core.batch.code_versions import source_version
from hermes_core.batch.recipe import Recipe, run_dir
from hermes_core.batch.sample_table import COLUMNS, TOOL_COLUMNS, sample_table
from hermes_assets.metadata import catalog
from hermes_assets.versions import attribute_run

if TYPE_CHECKING:
    import pandas

# The code that shapes the table's rows: the row builder (shared with statistics) and the table.
TABLE_SOURCES = ("batch/stats.py", "batch/sample_table.py", "batch/pipeline.py")


def column_schema(columns: list[str]) -> dg.TableSchema:
    """The schema of the table's columns: the fixed ones described, each per-tool column as an int."""
    described = dict(COLUMNS)
    for prefix, text in TOOL_COLUMNS.values():
        described.update({name: ("int", text.format(tool=name.partition(".")[2]))
                          for name in columns if name.startswith(prefix + ".")})
    return dg.TableSchema(columns=[dg.TableColumn(name, *described[name]) for name in columns])


def table_metadata(frame: "pandas.DataFrame") -> dict[str, object]:
    """The table's shape and the totals a user compares with the statistics asset."""
    tools = {name.partition(".")[2]: int(frame[name].sum()) for name in frame.columns
             if name.startswith(TOOL_COLUMNS["count"][0] + ".")}
    return {
        "dagster/row_count": len(frame),
        "dagster/column_schema": column_schema(list(frame.columns)),
        "dispositions": dg.MetadataValue.json(
            {str(k): int(v) for k, v in frame["disposition"].value_counts(dropna=False).items()}),
        "api_calls": int(frame["api_calls"].sum()),
        "total_tokens": int(frame["total_tokens"].sum()),
        "tool_calls": dg.MetadataValue.json({name: count for name, count in tools.items() if count}),
        "preview": dg.MetadataValue.md(frame.head(10)[["prompt_index", "batch", "disposition", "attempts",
                                                       "api_calls", "total_tokens"]].to_markdown(index=False)),
    }


def build_table_assets(recipe: Recipe, data_root: Path) -> list[dg.AssetsDefinition]:
    run = recipe.run_name
    folder = run_dir(data_root, run)

    @dg.asset(
        key_prefix=[run], group_name=run, **catalog("output", "pandas"),
        deps=[dg.AssetKey([run, "raw_trajectories"])],
        code_version=source_version(TABLE_SOURCES),
        metadata={"dagster/column_schema": column_schema(list(COLUMNS))},
        description="One row per sample of the dataset as loaded now (pandas DataFrame): batch, disposition, "
        "attempts, toolsets, tools offered, API calls, tokens, cost, one `tool_calls.<tool>` column per tool. "
        "statistics.json is summed from the same rows.",
    )
    def samples(context) -> dg.Output:  # no annotation: Dagster refuses the string this module's annotations are
        attribute_run(context, recipe, folder)
        frame = sample_table(folder)
        # Its content is the version: a re-materialization over unchanged records keeps it.
        version = hashlib.sha256(frame.to_json(orient="split", default_handler=str).encode()).hexdigest()[:24]
        return dg.Output(frame, data_version=dg.DataVersion(version), metadata=table_metadata(frame))

    return [samples]
