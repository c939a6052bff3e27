"""The per-sample table of a run, as a pandas DataFrame: what auditors analyse in a notebook.

One row per sample of the dataset as loaded now (prompts.jsonl), in prompt order, built by
`stats.sample_rows` — the rows statistics.json is summed from, so the table's counts are the
statistics' counts:

    from hermes_core.batch.sample_table import sample_table
    df = sample_table("data/my_run")
    df.disposition.value_counts(); df["tool_calls.terminal"].sum(); df.groupby("batch").total_tokens.sum()

pandas is imported only when a table is built, so the CLI does not pay for it at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes_core.batch.ledger import BatchPlan
from hermes_core.batch.ledgers import open_ledger
from hermes_core.batch.pipeline import RunPaths, read_assignments
from hermes_core.batch.stats import sample_rows

if TYPE_CHECKING:
    import pandas

# Column -> (type, description): the table's schema, shown by the Dagster asset. The per-tool columns
# (`TOOL_COLUMNS`) follow, one of each per tool that any recorded row names.
COLUMNS: dict[str, tuple[str, str]] = {
    "sample_key": ("string", "Content key of the sample (stable across runs of the same recipe)."),
    "prompt_index": ("int", "Position of the sample in the dataset as loaded now."),
    "batch": ("string", "Batch (partition key of raw_trajectories) the sample belongs to."),
    "batch_num": ("int", "Number of that batch in the run's batch plan."),
    "disposition": ("string", "Disposition of the latest record (kept, discarded_*, failed_*); empty without a record."),
    "attempts": ("int", "Attempts made so far (0 without a record)."),
    "toolsets": ("list[string]", "Toolsets drawn for the sample."),
    "toolsets_lost": ("list[string]", "Drawn toolsets the agent could not offer."),
    "tools_offered": ("list[string]", "Tools offered to the model (recorded with a trajectory)."),
    "api_calls": ("int", "Model API calls of every attempt of the sample."),
    "prompt_tokens": ("int", "Prompt tokens of every attempt of the sample."),
    "completion_tokens": ("int", "Completion tokens of every attempt of the sample."),
    "total_tokens": ("int", "Total tokens of every attempt of the sample."),
    "cost_usd": ("float", "Cost of every attempt of the sample at the recipe's price (empty without a price)."),
    "sandbox_created": ("int", "Sandboxes created over every attempt of the sample."),
    "sandbox_failed": ("int", "Sandboxes that failed over every attempt of the sample."),
    "assistant_turns": ("int", "Assistant turns of the kept or discarded trajectory."),
    "turns_with_reasoning": ("int", "Of those, turns carrying reasoning."),
    "error": ("string", "Error of a failed latest attempt."),
    "dagster_run_id": ("string", "Dagster run that recorded the latest attempt."),
}
TOOL_COLUMNS: dict[str, tuple[str, str]] = {
    "count": ("tool_calls", "Calls of {tool} in the trajectory."),
    "success": ("tool_successes", "Successful calls of {tool}."),
    "failure": ("tool_failures", "Failed calls of {tool}."),
}


def tool_column(stat: str, tool: str) -> str:
    """The column of one tool's `count`, `success` or `failure`, e.g. `tool_calls.terminal`."""
    return f"{TOOL_COLUMNS[stat][0]}.{tool}"


def table_records(run_dir: Path | str) -> list[dict[str, Any]]:
    """The table's rows as plain dicts (`stats.sample_rows`, with each tool's counts spread into
    columns and the tools offered read from the recorded trajectories)."""
    paths = RunPaths(Path(run_dir))
    ledger = open_ledger(paths.raw)
    rows = sample_rows(read_assignments(paths), ledger, BatchPlan(paths.batches).batch_of())
    # Only the trajectory holds the tools offered: one whole record read per sample with a row.
    with_row = [row["sample_key"] for row in rows if row["tool_stats"]]
    offered = {key: record["row"].get("tools_offered") or [] for key, record in ledger.records(with_row)
               if record.get("row")}
    tools = list(dict.fromkeys(name for row in rows for name in row["tool_stats"]))
    records = []
    for row in rows:
        stats = row.pop("tool_stats")
        # own lists: the rows share them with the cached assignments and the ledger's summaries
        record = {**row, "toolsets": list(row["toolsets"]), "toolsets_lost": list(row["toolsets_lost"]),
                  "tools_offered": offered.get(row["sample_key"], [])}
        for stat in TOOL_COLUMNS:
            record.update({tool_column(stat, tool): (stats.get(tool) or {}).get(stat, 0) for tool in tools})
        records.append(record)
    return records


def to_frame(records: list[dict[str, Any]]) -> "pandas.DataFrame":
    """The rows as a DataFrame with the columns of `COLUMNS` in that order, then the tool columns."""
    import pandas  # lazily: a CLI run never builds the table

    tools = [name for name in (records[0] if records else {}) if name not in COLUMNS]
    frame = pandas.DataFrame.from_records(records, columns=[*COLUMNS, *tools])
    # Integer columns that may be empty (no batch yet) stay integers, with missing values.
    for name in ("prompt_index", "batch_num"):
        frame[name] = frame[name].astype("Int64")
    frame["cost_usd"] = frame["cost_usd"].astype("float64")
    return frame


def sample_table(run_dir: Path | str) -> "pandas.DataFrame":
    """The per-sample table of the run folder `run_dir` (e.g. `data/<run_name>`) as loaded now.

    `df.attrs["spent"]` is what the whole run paid for (every attempt ever, superseded ones and
    samples since removed from the dataset included), i.e. statistics.json's `api_calls`, `usage`
    and `sandbox` counts; each row's spend is every attempt of its sample, so the rows of the samples
    in the dataset now sum to it less what removed samples spent."""
    paths = RunPaths(Path(run_dir))
    frame = to_frame(table_records(paths.root))
    frame.attrs["run_name"] = paths.root.name
    frame.attrs["spent"] = dict(open_ledger(paths.raw).spent)
    return frame
