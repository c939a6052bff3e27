"""The per-sample pandas table of a run (issue 18, part 7): one row per sample, and its sums are
statistics.json — for a mixed run against the simulated endpoint (kept, discarded, failed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from batch_runs import Sent, prompts, run, write_dataset
from hermes_core.batch.sample_table import COLUMNS, sample_table

MIXED = ["", "", "", " [sim:no-reasoning]", " [sim:hallucinate-always]", " [sim:always-fail]", " [sim:tools=2]"]


def mixed_rows(n: int = 14) -> list[dict]:
    return [{"prompt": row["prompt"] + MIXED[i % len(MIXED)]} for i, row in enumerate(prompts(n, "table"))]


def assert_table_matches_statistics(frame: pd.DataFrame, stats: dict) -> None:
    """Every count statistics.json shows, summed from the table."""
    assert len(frame) == stats["total_prompts"]
    dispositions = frame.disposition.value_counts().to_dict()
    for name, count in stats["counts"].items():
        if name not in ("invalid_input_lines", "pending"):
            assert dispositions.get(name, 0) == count, name
    assert stats["counts"]["pending"] == frame.disposition.isna().sum() + dispositions.get("failed_retryable", 0)
    assert frame.api_calls.sum() == stats["api_calls"]
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert frame[name].sum() == stats["usage"][name]
    assert frame.sandbox_created.sum() == stats["sandbox"]["created"]
    for tool, counts in stats["tool_statistics"].items():
        assert frame[f"tool_calls.{tool}"].sum() == counts["count"], tool
        assert frame[f"tool_successes.{tool}"].sum() == counts["success"], tool
        assert frame[f"tool_failures.{tool}"].sum() == counts["failure"], tool
    assert frame.toolsets.explode().value_counts().to_dict() == stats["toolset_statistics"]
    assert frame.assistant_turns.sum() == stats["reasoning_statistics"]["total_assistant_turns"]
    assert frame.turns_with_reasoning.sum() == stats["reasoning_statistics"]["turns_with_reasoning"]


def test_table_of_a_mixed_run_sums_to_its_statistics(isolated_homes, sim_server):
    rows = mixed_rows()
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    sent = Sent(sim_server)
    run(dataset, sim_server.base_url, "--batch_size=5", "--max_attempts=1")  # failed samples: exit code not 0
    run_dir = isolated_homes / "data" / "rs"
    stats = json.loads((run_dir / "statistics.json").read_text())

    frame = sample_table(run_dir)
    assert list(frame.columns[: len(COLUMNS)]) == list(COLUMNS)
    assert frame.sample_key.is_unique and list(frame.prompt_index) == list(range(len(rows)))
    # every kind of outcome is in this run, and the table has each of them
    assert {"kept", "discarded_no_reasoning", "discarded_hallucinated_tool", "failed_terminal"} <= set(frame.disposition)
    assert_table_matches_statistics(frame, stats)
    assert sum(sent.counts().values()) == len(rows)  # every sample was sent once

    # the batch is the partition key; batches hold batch_size samples in prompt order
    plan = json.loads((run_dir / "batches.json").read_text())["batches"]
    assert frame.groupby("batch").size().to_dict() == {b["key"]: len(b["members"]) for b in plan}
    assert frame.batch_num.tolist() == [1 + i // 5 for i in range(len(rows))]
    kept = frame[frame.disposition == "kept"]
    assert (kept.attempts == 1).all() and (kept.api_calls >= 2).all()
    assert all("terminal" in offered for offered in kept.tools_offered)
    assert (kept["tool_calls.terminal"] >= 1).all()
    failed = frame[frame.disposition == "failed_terminal"]
    assert failed.error.str.contains("always-fail").all() and (failed.tools_offered.str.len() == 0).all()
    drawn = [json.loads(line)["toolsets"] for line in (run_dir / "assignments.jsonl").read_text().splitlines()]
    assert frame.toolsets.tolist() == drawn
    assert frame.attrs["spent"]["api_calls"] == stats["api_calls"]


def test_retried_samples_count_their_attempts(isolated_homes, sim_server):
    """With retries, a row's spend is every attempt of its sample, so the rows sum to what
    statistics.json counts (`attrs["spent"]`): every attempt paid for."""
    rows = mixed_rows(7)
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    run_dir = isolated_homes / "data" / "rs"
    for _ in range(2):
        run(dataset, sim_server.base_url, "--max_attempts=2")
    stats = json.loads((run_dir / "statistics.json").read_text())
    frame = sample_table(run_dir)
    failed = frame[frame.disposition == "failed_terminal"]
    assert len(failed) == 1 and failed.attempts.tolist() == [2]
    assert (frame[frame.disposition != "failed_terminal"].attempts == 1).all()
    assert frame.attrs["spent"]["api_calls"] == stats["api_calls"] == frame.api_calls.sum()
    assert failed.api_calls.tolist()[0] >= 2  # both of its attempts called the model
    assert frame.disposition.value_counts().to_dict() == {k: v for k, v in stats["counts"].items()
                                                          if k not in ("invalid_input_lines", "pending") and v}


def test_a_sample_without_a_record_has_an_empty_row(isolated_homes, sim_server):
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(3, "planned"))
    assert run(dataset, sim_server.base_url, "--plan_only") == 0
    frame = sample_table(isolated_homes / "data" / "rs")
    assert len(frame) == 3 and frame.disposition.isna().all()
    assert (frame.attempts == 0).all() and frame.api_calls.sum() == 0
    assert frame.batch.notna().all()


def test_the_cli_does_not_import_pandas():
    """The table is built lazily: starting hermes-batch (and computing statistics) never loads pandas."""
    code = ("import sys, hermes_assets.cli, hermes_core.batch.pipeline, hermes_core.batch.sample_table; "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "False"
