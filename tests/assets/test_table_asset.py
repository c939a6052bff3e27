"""The per-sample table as the Dagster asset `<run>/samples` (issue 18, part 7): a DataFrame loaded
through the IO manager, with its table schema, whose counts are what the statistics asset shows."""

from __future__ import annotations

import json

import dagster as dg
import pandas as pd

from batch_runs import prompts, run, write_dataset
from hermes_assets.definitions import build_definitions
from hermes_core.batch.sample_table import sample_table
from hermes_core.config import data_root

MIXED = ["", "", " [sim:no-reasoning]", " [sim:hallucinate-always]", " [sim:always-fail]"]
KEY = dg.AssetKey(["rs", "samples"])


def test_samples_asset_loads_the_table_whose_counts_are_the_statistics(isolated_homes, sim_server):
    rows = [{"prompt": row["prompt"] + MIXED[i % len(MIXED)]} for i, row in enumerate(prompts(10, "asset"))]
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    run(dataset, sim_server.base_url, "--batch_size=4", "--max_attempts=1")  # kept, discarded, failed samples
    root = data_root()
    defs = build_definitions(root)
    instance = dg.DagsterInstance.get()

    # What "Materialize" on the two assets does in the UI: statistics (what the UI shows) and the table.
    result = dg.materialize(list(defs.assets), instance=instance, resources=defs.resources,
                            selection=["rs/statistics", "rs/samples"])
    assert result.success
    frame = defs.load_asset_value(KEY, instance=instance)
    assert isinstance(frame, pd.DataFrame)
    pd.testing.assert_frame_equal(frame, result.output_for_node("rs__samples"))
    pd.testing.assert_frame_equal(frame, sample_table(root / "rs"))  # the notebook's table is the same

    stats = json.loads((root / "rs" / "statistics.json").read_text())
    shown = instance.get_latest_materialization_event(dg.AssetKey(["rs", "statistics"])).asset_materialization.metadata
    dispositions = frame.disposition.value_counts().to_dict()
    assert {"kept", "discarded_no_reasoning", "discarded_hallucinated_tool", "failed_terminal"} <= set(dispositions)
    for name, count in stats["counts"].items():
        if name not in ("invalid_input_lines", "pending"):
            assert dispositions.get(name, 0) == count == shown[f"count_{name}"].value, name
    assert frame.api_calls.sum() == stats["api_calls"] == shown["api_calls"].value
    assert frame.total_tokens.sum() == stats["usage"]["total_tokens"] == shown["total_tokens"].value
    for tool, counts in stats["tool_statistics"].items():
        assert frame[f"tool_calls.{tool}"].sum() == counts["count"], tool

    # The table's metadata: its schema (fixed and per-tool columns) and row count, on the event and the definition.
    table_event = instance.get_latest_materialization_event(KEY).asset_materialization.metadata
    schema = table_event["dagster/column_schema"].value
    assert [column.name for column in schema.columns] == list(frame.columns)
    assert {"sample_key", "batch", "disposition", "tool_calls.terminal"} <= {c.name for c in schema.columns}
    assert table_event["dagster/row_count"].value == len(rows)
    assert table_event["api_calls"].value == stats["api_calls"]
    spec = defs.resolve_asset_graph().get(KEY)
    assert "dagster/column_schema" in spec.metadata
    assert spec.group_name == "rs" and dg.AssetKey(["rs", "raw_trajectories"]) in spec.parent_keys

    # Nothing changed: a second materialization keeps the table's data version.
    version = instance.get_latest_materialization_event(KEY).asset_materialization.tags["dagster/data_version"]
    assert dg.materialize(list(defs.assets), instance=instance, resources=defs.resources, selection=["rs/samples"]).success
    assert instance.get_latest_materialization_event(KEY).asset_materialization.tags["dagster/data_version"] == version
