"""Asset checks of `filtered_trajectories`, run on real run folders produced by `hermes-batch`
against the simulated endpoint, in the Dagster instance the CLI used."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from hermes_assets.checks import (
    BLOCKING, CHECKS, blocking_failures, build_run_assets_and_checks, build_run_checks, dataset_currency,
    format_check_results, rate_threshold,
)
from hermes_assets.cli import batch_main
from hermes_assets.export_assets import build_export_assets
from hermes_assets.partition_checks import build_partition_checks
from hermes_assets.resources import ModelEndpointResource
from hermes_core.config import data_root
from hermes_core.batch.pipeline import RunPaths
from hermes_core.batch.recipe import load_recipe, run_dir

PROMPTS = [{"prompt": f"Run a command that prints {i}", "id": f"p{i}"} for i in range(4)]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def cli(dataset: Path, url: str, *extra: str, run_name: str = "t1") -> int:
    return batch_main([f"--dataset_file={dataset}", f"--run_name={run_name}", f"--base_url={url}", "--api_key=k",
                       "--batch_size=2", "--num_workers=3", "--distribution=terminal_only", *extra])


def run_checks(run_name: str = "t1", *, with_asset: bool = False) -> dict[str, dg.AssetCheckEvaluation]:
    """Execute the run's checks in the CLI's instance: alone (the files as they are on disk), or
    together with `filtered_trajectories` (which rewrites trajectories.jsonl first)."""
    root = data_root()
    assets, checks = build_run_assets_and_checks(load_recipe(root, run_name), root)
    target = dg.AssetKey([run_name, "filtered_trajectories"])
    selection = [target] if with_asset else dg.AssetSelection.checks_for_assets(target)
    result = dg.materialize([*assets, *checks], selection=selection, instance=dg.DagsterInstance.get(),
                            resources={"model_endpoint": ModelEndpointResource()}, raise_on_error=False)
    # A failed check is reported; only a blocking one failing with ERROR fails its step (Dagster's gate).
    assert result.success or blocking_failures(result)
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def meta(evaluation: dg.AssetCheckEvaluation) -> dict:
    return {key: value.value for key, value in evaluation.metadata.items()}


def test_checks_pass_on_a_clean_run_and_report_their_numbers(isolated_homes, sim_url):
    import datasets

    hf_cache = Path(datasets.config.HF_DATASETS_CACHE)
    before = set(hf_cache.rglob("*")) if hf_cache.exists() else set()
    assert cli(write_rows(isolated_homes / "d.jsonl", PROMPTS + [{"prompt": "Say hi", "x": 2}]), sim_url) == 0
    results = run_checks(with_asset=True)
    assert set(results) == {"loads_with_hf_datasets", "no_duplicate_sample_keys", "every_sample_accounted_for",
                            "no_reasoning_rate", "hallucination_rate", "built_from_current_dataset"}
    assert all(e.passed for e in results.values()), {n: e.description for n, e in results.items()}
    loaded = meta(results["loads_with_hf_datasets"])
    assert loaded["rows"] == loaded["expected_rows"] == 5 and "conversations" in loaded["columns"]
    assert meta(results["every_sample_accounted_for"])["finished"] == 5
    assert meta(results["no_reasoning_rate"])["judged_samples"] == 5
    assert (set(hf_cache.rglob("*")) if hf_cache.exists() else set()) == before  # the user's HF cache untouched


def test_duplicate_rows_fail_two_checks(isolated_homes, sim_url):
    assert cli(write_rows(isolated_homes / "d.jsonl", PROMPTS), sim_url) == 0
    trajectories = data_root() / "t1" / "trajectories.jsonl"
    first = trajectories.read_text().splitlines()[0]
    trajectories.write_text(trajectories.read_text() + first + "\n")  # a bad merge, by hand
    results = run_checks()
    duplicates = results["no_duplicate_sample_keys"]
    assert not duplicates.passed and duplicates.severity == dg.AssetCheckSeverity.ERROR
    assert meta(duplicates)["duplicated_keys"] == 1 and meta(duplicates)["extra_rows"] == 1
    loaded = results["loads_with_hf_datasets"]
    assert not loaded.passed and (meta(loaded)["rows"], meta(loaded)["expected_rows"]) == (5, 4)


def test_mixed_types_and_broken_lines_fail_the_datasets_check(isolated_homes, sim_url):
    assert cli(write_rows(isolated_homes / "d.jsonl", PROMPTS[:2]), sim_url) == 0
    trajectories = data_root() / "t1" / "trajectories.jsonl"
    rows = [json.loads(line) for line in trajectories.read_text().splitlines()]
    rows[1]["api_calls"] = {"not": "a number"}  # datasets loads it, but as an untyped Json column
    rows[1]["extra"] = {"x": [1]}  # user data may vary: allowed
    rows[0]["extra"] = {"x": "one"}
    trajectories.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = run_checks()["loads_with_hf_datasets"]
    assert not loaded.passed and "api_calls" in loaded.description and "extra" not in loaded.description
    assert meta(loaded)["mixed_type_columns"] == "api_calls, extra"

    trajectories.write_text(trajectories.read_text() + "{torn line\n")
    results = run_checks()
    loaded = results["loads_with_hf_datasets"]
    assert not loaded.passed and meta(loaded)["error"] and meta(loaded)["unreadable_lines"] == 1
    assert meta(results["no_duplicate_sample_keys"])["unreadable_lines"] == 1


def test_rates_count_discarded_over_judged_samples(isolated_homes, sim_url, monkeypatch):
    rows = [{"prompt": f"Explain {topic} [sim:no-reasoning]"} for topic in ("tides", "rain", "wind")]
    rows.append({"prompt": "Run ls [sim:hallucinate]"})
    dataset = write_rows(isolated_homes / "d.jsonl", rows)
    assert cli(dataset, sim_url) == 0
    results = run_checks()
    no_reasoning, hallucination = results["no_reasoning_rate"], results["hallucination_rate"]
    assert not no_reasoning.passed and no_reasoning.severity == dg.AssetCheckSeverity.WARN
    # discarded ÷ judged (kept + discarded): 3 of 4 > 0.5 and 1 of 4 > 0.2, the defaults
    assert (meta(no_reasoning)["discarded"], meta(no_reasoning)["judged_samples"]) == (3, 4)
    assert meta(no_reasoning)["rate"] == 0.75 and meta(no_reasoning)["threshold"] == 0.5
    assert not hallucination.passed and meta(hallucination)["rate"] == 0.25

    monkeypatch.setenv("HERMES_MAX_NO_REASONING_RATE", "0.8")
    monkeypatch.setenv("HERMES_MAX_HALLUCINATION_RATE", "0.3")
    results = run_checks()  # thresholds are read when the check runs
    assert results["no_reasoning_rate"].passed and results["hallucination_rate"].passed
    assert meta(results["no_reasoning_rate"])["threshold"] == 0.8

    # With the filter off, the same prompts are kept: the no-reasoning rate is 0, not a failure.
    monkeypatch.delenv("HERMES_MAX_NO_REASONING_RATE")
    assert cli(dataset, sim_url, "--reasoning_disabled", run_name="t2") == 0
    kept = run_checks("t2")["no_reasoning_rate"]
    assert kept.passed and meta(kept)["discarded"] == 0 and meta(kept)["judged_samples"] == 4
    assert json.loads((data_root() / "t2" / "statistics.json").read_text())["counts"]["kept"] == 3


def test_pending_samples_warn_and_unplanned_samples_fail(isolated_homes, sim_url):
    dataset = write_rows(isolated_homes / "d.jsonl", PROMPTS[:2] + [{"prompt": "Run ls [sim:always-fail]"}])
    assert cli(dataset, sim_url, "--max_attempts=3", "--max_retries=0") == 1
    accounted = run_checks()["every_sample_accounted_for"]
    assert not accounted.passed and accounted.severity == dg.AssetCheckSeverity.WARN
    assert (meta(accounted)["pending"], meta(accounted)["unaccounted"], meta(accounted)["finished"]) == (1, 0, 2)

    # New rows loaded by `prompts` but never planned by `toolset_assignments`: nobody will run them.
    write_rows(dataset, PROMPTS[:2] + [{"prompt": "Run ls [sim:always-fail]"}, {"prompt": "A new row"}])
    root = data_root()
    assets, checks = build_run_assets_and_checks(load_recipe(root, "t1"), root)
    dg.materialize(assets, selection=[dg.AssetKey(["t1", "prompts"])], instance=dg.DagsterInstance.get(),
                   resources={"model_endpoint": ModelEndpointResource()})
    accounted = run_checks()["every_sample_accounted_for"]
    assert not accounted.passed and accounted.severity == dg.AssetCheckSeverity.ERROR
    assert meta(accounted)["unaccounted"] == 1 and meta(accounted)["samples"] == 4


def test_format_check_results_lists_only_failures(isolated_homes, sim_url):
    assert cli(write_rows(isolated_homes / "d.jsonl", [{"prompt": "Explain [sim:no-reasoning]"}]), sim_url) == 0
    root = data_root()
    assets, checks = build_run_assets_and_checks(load_recipe(root, "t1"), root)
    result = dg.materialize([*assets, *checks], selection=[dg.AssetKey(["t1", "filtered_trajectories"])],
                            instance=dg.DagsterInstance.get(), resources={"model_endpoint": ModelEndpointResource()})
    lines = format_check_results(result)
    assert lines == [line for line in lines if line.startswith("check ")]
    assert any("no_reasoning_rate (warning)" in line for line in lines)
    assert not any("no_duplicate_sample_keys" in line for line in lines)
    assert sum(len(list(c.check_keys)) for c in build_run_checks(load_recipe(root, "t1"), root)) == 6


def test_rate_threshold_validation(monkeypatch):
    monkeypatch.setenv("HERMES_MAX_HALLUCINATION_RATE", "lots")
    with pytest.raises(ValueError, match="HERMES_MAX_HALLUCINATION_RATE"):
        rate_threshold("HERMES_MAX_HALLUCINATION_RATE", 0.2)
    monkeypatch.setenv("HERMES_MAX_HALLUCINATION_RATE", "1.5")
    with pytest.raises(ValueError, match="between 0 and 1"):
        rate_threshold("HERMES_MAX_HALLUCINATION_RATE", 0.2)
    monkeypatch.setenv("HERMES_MAX_HALLUCINATION_RATE", "")
    assert rate_threshold("HERMES_MAX_HALLUCINATION_RATE", 0.2) == 0.2


def materialize_with_exports(selection: dg.AssetSelection, run_name: str = "t1") -> dg.ExecuteInProcessResult:
    """One run in the CLI's instance over the run's assets, exports and checks (what the code location holds)."""
    root = data_root()
    recipe = load_recipe(root, run_name)
    assets, checks = build_run_assets_and_checks(recipe, root)
    return dg.materialize([*assets, *build_export_assets(recipe, root), *checks], selection=selection,
                          instance=dg.DagsterInstance.get(), resources={"model_endpoint": ModelEndpointResource()},
                          raise_on_error=False)


def exported(run_name: str = "t1") -> int:
    """How many times hf_dataset was materialized."""
    records = dg.DagsterInstance.get().fetch_materializations(dg.AssetKey([run_name, "hf_dataset"]), limit=100)
    return len(records.records)


def test_a_failed_blocking_check_stops_the_exports_in_the_same_run_and_later(isolated_homes, sim_url):
    dataset = write_rows(isolated_homes / "d.jsonl", PROMPTS)
    assert cli(dataset, sim_url) == 0
    filtered, hf = dg.AssetKey(["t1", "filtered_trajectories"]), dg.AssetKey(["t1", "hf_dataset"])
    trajectories = data_root() / "t1" / "trajectories.jsonl"
    trajectories.write_text(trajectories.read_text() + trajectories.read_text().splitlines()[0] + "\n")

    # The checks and the export in one run: Dagster skips the export after the blocking failure.
    result = materialize_with_exports(dg.AssetSelection.checks_for_assets(filtered) | dg.AssetSelection.assets(hf))
    assert blocking_failures(result) == ["loads_with_hf_datasets", "no_duplicate_sample_keys"]
    assert exported() == 0
    # The export alone in a later run: it reads the latest evaluations and refuses, naming the checks.
    result = materialize_with_exports(dg.AssetSelection.assets(hf))
    assert not result.success and exported() == 0
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error.message
    assert "blocking check(s) loads_with_hf_datasets, no_duplicate_sample_keys" in failure

    # filtered_trajectories rewrites the file; its checks pass and the export builds in the same run.
    result = materialize_with_exports(dg.AssetSelection.assets(filtered, hf))
    assert result.success and not blocking_failures(result) and exported() == 1

    # A sample loaded but never planned persists through filtered_trajectories: an ERROR that gates.
    write_rows(dataset, PROMPTS + [{"prompt": "A new row"}])
    materialize_with_exports(dg.AssetSelection.assets(dg.AssetKey(["t1", "prompts"])))
    result = materialize_with_exports(dg.AssetSelection.assets(filtered, hf))
    assert blocking_failures(result) == ["every_sample_accounted_for"] and exported() == 1
    # Dagster's own gate: the export's step waits on the failed check step and never starts.
    assert "t1__hf_dataset" not in {e.step_key for e in result.all_events if e.event_type_value == "STEP_START"}
    assert dg.AssetKey(["t1", "filtered_trajectories"]) in {e.asset_key for e in result.get_asset_materialization_events()}
    assert not materialize_with_exports(dg.AssetSelection.assets(hf)).success and exported() == 1


def test_discard_rates_warn_without_gating(isolated_homes, sim_url):
    rows = [{"prompt": f"Explain {topic} [sim:no-reasoning]"} for topic in ("tides", "rain")] + PROMPTS[:1]
    assert cli(write_rows(isolated_homes / "d.jsonl", rows), sim_url) == 0  # 2 of 3 judged: over the 0.5 default
    filtered, hf = dg.AssetKey(["t1", "filtered_trajectories"]), dg.AssetKey(["t1", "hf_dataset"])
    result = materialize_with_exports(dg.AssetSelection.assets(filtered, hf))
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert not evaluations["no_reasoning_rate"].passed and evaluations["no_reasoning_rate"].severity.value == "WARN"
    assert {name for name, e in evaluations.items() if e.blocking} == set(BLOCKING)
    assert result.success and exported() == 1


def test_hermes_batch_exits_non_zero_on_a_failed_blocking_check(isolated_homes, sim_url, monkeypatch, capsys):
    description, _ = CHECKS["no_duplicate_sample_keys"]
    monkeypatch.setitem(CHECKS, "no_duplicate_sample_keys",
                        (description, lambda paths: dg.AssetCheckResult(passed=False, description="2 copies of p0")))
    assert cli(write_rows(isolated_homes / "d.jsonl", PROMPTS[:2]), sim_url) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == ["error: blocking check(s) failed: no_duplicate_sample_keys; statistics and the exports were "
                      "not built. Fix trajectories.jsonl or the plan, then run the same command."]


def test_partition_checks_name_the_broken_partitions(isolated_homes, sim_url):
    rows = PROMPTS + [{"prompt": f"Run a command that prints {i}"} for i in range(4, 6)]
    assert cli(write_rows(isolated_homes / "d.jsonl", rows), sim_url) == 0  # 3 batches of 2
    root = data_root()
    recipe = load_recipe(root, "t1")
    raw = root / "t1" / "raw"
    first, second, third = sorted(path.stem for path in raw.glob("*.jsonl"))
    lines = (raw / f"{first}.jsonl").read_text().splitlines(keepends=True)
    (raw / f"{first}.jsonl").write_text(lines[0] + '{"sample_key": "torn\n' + "".join(lines[1:]))  # damaged middle line
    (raw / f"{second}.jsonl").write_text((raw / f"{second}.jsonl").read_text().splitlines(keepends=True)[0])
    target = dg.AssetKey(["t1", "raw_trajectories"])
    result = dg.materialize([*build_run_assets_and_checks(recipe, root)[0], *build_partition_checks(recipe, root)],
                            selection=dg.AssetSelection.checks_for_assets(target), instance=dg.DagsterInstance.get(),
                            resources={"model_endpoint": ModelEndpointResource()})
    results = {e.check_name: e for e in result.get_asset_check_evaluations()}
    parsed, recorded = results["ledger_records_parse"], results["batch_members_recorded"]
    assert not parsed.passed and meta(parsed)["by_partition"] == {
        first: "1 damaged line(s): 2", second: "ok", third: "ok"}
    assert not recorded.passed and meta(recorded)["failed_partition_keys"] == second
    assert meta(recorded)["by_partition"][first] == meta(recorded)["by_partition"][third] == "ok"
    assert "1 of 2 member(s) without a final record" in recorded.description


def test_outputs_of_an_older_dataset_say_so(isolated_homes, sim_url):
    """Dagster marks only `prompts` stale when the dataset changes; the outputs' check says why."""
    dataset = write_rows(isolated_homes / "d.jsonl", PROMPTS)
    assert cli(dataset, sim_url) == 0
    paths = RunPaths(run_dir(data_root(), "t1"))
    assert dataset_currency(paths).passed
    with open(dataset, "a") as handle:
        handle.write(json.dumps({"prompt": "one more"}) + "\n")
    stale = dataset_currency(paths)
    assert not stale.passed and stale.severity == dg.AssetCheckSeverity.WARN
    assert stale.description.startswith("the dataset changed since these outputs were planned")
    dataset.unlink()
    assert "the dataset file cannot be read" in dataset_currency(paths).description
