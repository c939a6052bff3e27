"""Asset checks on a run's `filtered_trajectories` (SPEC §5.4): the final file loads with HF
`datasets`, has no duplicate sample keys, every sample of the dataset is accounted for, it comes from
the dataset file as it is now, and the filters' discard rates stay under configurable thresholds.

The three correctness checks are blocking: an ERROR stops the assets downstream in the same run
(Dagster's gating), and `refuse_if_blocked` makes the exports refuse to build in a later run while
the latest evaluation of one of them failed. The others are warnings and never gate."""


import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import dagster as dg

from hermes_core.batch import pipeline
from hermes_core.fileio import FileTableCache, json_loads
from hermes_core.formats.filters import Disposition
from hermes_core.formats.hf_loading import describe_error, load_with_datasets
from hermes_core.batch.ledger import BatchPlan
from hermes_core.batch.ledgers import open_ledger
from hermes_core.batch.pipeline import RunPaths
from hermes_core.batch.recipe import Recipe, run_dir
from hermes_assets.metadata import check_catalog
from hermes_assets.run_assets import build_run_assets
from hermes_assets.versions import dataset_state

NO_REASONING_ENV = "HERMES_MAX_NO_REASONING_RATE"
HALLUCINATION_ENV = "HERMES_MAX_HALLUCINATION_RATE"
DEFAULT_MAX_NO_REASONING_RATE = 0.5
DEFAULT_MAX_HALLUCINATION_RATE = 0.2
DISCARDED = (Disposition.DISCARDED_NO_REASONING, Disposition.DISCARDED_HALLUCINATED_TOOL,
             Disposition.DISCARDED_INCOMPLETE)
USER_TYPED_COLUMNS = {"id", "extra", "metadata"}  # carry dataset values as given, any JSON type
MAX_LISTED = 10  # sample keys shown in metadata; the counts carry the rest


def rate_threshold(env_name: str, default: float) -> float:
    """A rate threshold in [0, 1] from the environment, read when the check runs (no reload needed)."""
    raw = os.environ.get(env_name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{env_name}={raw!r}: expected a rate between 0 and 1, e.g. 0.25") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{env_name}={raw!r}: expected a rate between 0 and 1, e.g. 0.25")
    return value


CURRENT_CHECK = "built_from_current_dataset"
_parsed = FileTableCache(4)  # three checks read the same trajectories.jsonl


def _rows(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Parsed rows and the count of lines that are not JSON objects. Not `read_jsonl`: a damaged final
    file is exactly what these checks must report, not crash on."""
    return _parsed.get(path, lambda: _parse_rows(path)) if path.is_file() else ([], 0)


def _parse_rows(path: Path) -> tuple[list[dict[str, Any]], int]:
    rows, unreadable = [], 0
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            row = json_loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            unreadable += 1
    return rows, unreadable


def _finished_counts(paths: RunPaths) -> tuple[Counter[str], int]:
    """Final dispositions of the current dataset's samples, and how many the filters judged
    (kept + discarded: failed samples produced no trajectory, so they say nothing about quality)."""
    ledger = open_ledger(paths.raw)
    counts: Counter[str] = Counter()
    for sample in pipeline.read_samples(paths):
        if ledger.is_done(sample.sample_key):
            counts[ledger.latest[sample.sample_key]["disposition"]] += 1
    judged = counts[Disposition.KEPT] + sum(counts[d] for d in DISCARDED)
    return counts, judged


def _rate_result(name: str, discarded: int, judged: int, threshold: float, env_name: str) -> dg.AssetCheckResult:
    rate = discarded / judged if judged else 0.0
    return dg.AssetCheckResult(
        passed=rate <= threshold,
        severity=dg.AssetCheckSeverity.WARN,  # a quality signal about the model, not broken data
        description=f"{name} rate {rate:.1%} of {judged} judged sample(s); threshold {threshold:.1%} (${env_name})",
        metadata={"rate": round(rate, 4), "discarded": discarded, "judged_samples": judged,
                  "threshold": threshold, "threshold_env": env_name},
    )


def _loads_with_hf_datasets(paths: RunPaths) -> dg.AssetCheckResult:
    rows, unreadable = _rows(paths.trajectories)
    expected = _finished_counts(paths)[0][Disposition.KEPT]
    if not rows and not unreadable:  # `datasets` refuses an empty file; zero kept rows is a valid state
        return dg.AssetCheckResult(passed=expected == 0, metadata={"rows": 0, "expected_rows": expected})
    try:
        loaded, columns = load_with_datasets(paths.trajectories)
    except Exception as exc:  # any loader error is the finding: report it rather than crash the step
        error = describe_error(exc)
        return dg.AssetCheckResult(passed=False, description=f"HF datasets cannot load the file: {error}"[:500],
                                   metadata={"file_rows": len(rows), "unreadable_lines": unreadable,
                                             "expected_rows": expected, "error": error[:2000]})
    # datasets types a column whose values differ in type across rows as Json; fine for user fields
    # (id, extra, metadata), a schema break for the fields this product writes.
    mixed = sorted(name for name, feature in columns.items() if "Json(" in feature)
    broken = [name for name in mixed if name not in USER_TYPED_COLUMNS]
    passed = loaded == len(rows) == expected and not broken
    problems = ([f"datasets loaded {loaded} row(s), the file has {len(rows)}, the ledger has {expected} kept "
                 "sample(s)"] if not loaded == len(rows) == expected else []) + (
        [f"column(s) with a different type on some rows: {', '.join(broken)}"] if broken else [])
    return dg.AssetCheckResult(
        passed=passed, description="; ".join(problems) or None,
        metadata={"rows": loaded, "file_rows": len(rows), "expected_rows": expected,
                  "columns": ", ".join(columns), "mixed_type_columns": ", ".join(mixed) or "none"},
    )


def _no_duplicate_sample_keys(paths: RunPaths) -> dg.AssetCheckResult:
    rows, unreadable = _rows(paths.trajectories)
    keys = Counter(row.get("sample_key") for row in rows)
    duplicated = {key: n for key, n in keys.items() if n > 1}
    return dg.AssetCheckResult(
        passed=not duplicated,
        metadata={"rows": sum(keys.values()), "unreadable_lines": unreadable, "distinct_sample_keys": len(keys),
                  "duplicated_keys": len(duplicated), "extra_rows": sum(n - 1 for n in duplicated.values()),
                  "examples": dg.MetadataValue.json({str(k): n for k, n in list(duplicated.items())[:MAX_LISTED]})},
    )


def _rate_check(label: str, disposition: str, env_name: str, default: float) -> Callable[[RunPaths], dg.AssetCheckResult]:
    def check(paths: RunPaths) -> dg.AssetCheckResult:
        counts, judged = _finished_counts(paths)
        return _rate_result(label, counts[disposition], judged, rate_threshold(env_name, default), env_name)

    return check


def _accounting(paths: RunPaths) -> dg.AssetCheckResult:
    """Pending work (no final record yet, but in a batch) is a WARN; a sample in no batch and without
    a final record, a kept sample missing from the file, or a row of no current sample is an ERROR."""
    ledger, batched = open_ledger(paths.raw), BatchPlan(paths.batches).batch_of()
    samples = [s.sample_key for s in pipeline.read_samples(paths)]
    written = {row.get("sample_key") for row in _rows(paths.trajectories)[0]}
    states: Counter[str] = Counter()
    unplanned, missing_rows = [], []
    for key in samples:
        record = ledger.latest.get(key)
        if ledger.is_done(key):
            states[record["disposition"]] += 1
            if record["disposition"] == Disposition.KEPT and key not in written:
                missing_rows.append(key)
        elif key in batched:
            states["pending_failed_retryable" if record else "pending_not_run"] += 1
        else:
            unplanned.append(key)
    strays = sorted(written - set(samples), key=str)
    pending = states["pending_failed_retryable"] + states["pending_not_run"]
    problems = len(unplanned) + len(missing_rows) + len(strays)
    metadata: dict[str, Any] = {
        "samples": len(samples), "finished": len(samples) - pending - len(unplanned), "pending": pending,
        "unaccounted": len(unplanned), "kept_missing_from_file": len(missing_rows), "rows_of_unknown_samples": len(strays),
        "by_state": dg.MetadataValue.json(dict(sorted(states.items()))),
        "examples": dg.MetadataValue.json({"unaccounted": unplanned[:MAX_LISTED], "kept_missing_from_file":
                                           missing_rows[:MAX_LISTED], "rows_of_unknown_samples": strays[:MAX_LISTED]}),
    }
    if problems:
        description = (f"{len(unplanned)} sample(s) in no batch without a final record (materialize "
                       f"toolset_assignments), {len(missing_rows)} kept sample(s) missing from trajectories.jsonl, "
                       f"{len(strays)} row(s) of samples not in the dataset")
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR, description=description,
                                   metadata=metadata)
    if pending:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
                                   description=f"{pending} of {len(samples)} sample(s) still pending "
                                   "(materialize the missing and failed raw_trajectories partitions)")
    return dg.AssetCheckResult(passed=True, metadata=metadata)


def dataset_currency(paths: RunPaths, current_sha256: str | None = None) -> dg.AssetCheckResult:
    """Whether the outputs come from the dataset file as it is now: the sha256 the last planning read
    (dataset.json) against the file's (`current_sha256`, else hashed here). Dagster marks only `prompts`
    stale when the file changes; this says so on the outputs too (hermes__datasets reports it at once)."""
    planned = json_loads(paths.dataset.read_bytes())
    path = Path(planned["path"])
    try:
        current = current_sha256 or dataset_state(path, None)["sha256"]
    except OSError as exc:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN,
                                   description=f"the dataset file cannot be read: {exc}")
    metadata = {"planned_sha256": planned["sha256"], "dataset_sha256": current, "path": str(path)}
    if current == planned["sha256"]:
        return dg.AssetCheckResult(passed=True, metadata=metadata)
    return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=metadata, description=(
        f"the dataset changed since these outputs were planned ({planned['sha256'][:12]} → {current[:12]}): its new "
        "or edited rows are not in them yet; the run's dataset sensor, or Materialize all, brings them up to date"))


# name -> (description, check): one Dagster step runs them all (a step per check cost 3 more event
# writes each, ~0.3 s per run in all).
CHECKS: dict[str, tuple[str, Callable[[RunPaths], dg.AssetCheckResult]]] = {
    "loads_with_hf_datasets": ("trajectories.jsonl loads with HF datasets, one row per kept sample, and the "
                               "columns our format fixes have one type on every row.", _loads_with_hf_datasets),
    "no_duplicate_sample_keys": ("Each sample_key appears at most once in trajectories.jsonl.",
                                 _no_duplicate_sample_keys),
    "every_sample_accounted_for": ("Each sample of prompts.jsonl has a final ledger record or is pending in a "
                                   "batch; each kept sample is in trajectories.jsonl and nothing else is.",
                                   _accounting),
    CURRENT_CHECK: ("The outputs come from the dataset file as it is now (its sha256 is the one planned).",
                    dataset_currency),
    "no_reasoning_rate": (f"{Disposition.DISCARDED_NO_REASONING} ÷ judged samples ≤ ${NO_REASONING_ENV} "
                          f"(default {DEFAULT_MAX_NO_REASONING_RATE}).",
                          _rate_check("no-reasoning", Disposition.DISCARDED_NO_REASONING, NO_REASONING_ENV,
                                      DEFAULT_MAX_NO_REASONING_RATE)),
    "hallucination_rate": (f"{Disposition.DISCARDED_HALLUCINATED_TOOL} ÷ judged samples ≤ ${HALLUCINATION_ENV} "
                           f"(default {DEFAULT_MAX_HALLUCINATION_RATE}).",
                           _rate_check("hallucinated-tool", Disposition.DISCARDED_HALLUCINATED_TOOL,
                                       HALLUCINATION_ENV, DEFAULT_MAX_HALLUCINATION_RATE)),
}


# Broken data (not a pending or low-quality run): an ERROR result of these keeps the exports from building.
BLOCKING = frozenset({"loads_with_hf_datasets", "no_duplicate_sample_keys", "every_sample_accounted_for"})


def failed_blocking_checks(instance: dg.DagsterInstance, run_name: str) -> list[str]:
    """Blocking checks of the run whose latest evaluation (in any Dagster run) failed with ERROR severity."""
    target = dg.AssetKey([run_name, "filtered_trajectories"])
    failed = []
    for name in sorted(BLOCKING):
        record = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(target, name))
        evaluation = record.evaluation if record else None  # None: planned but never evaluated
        if evaluation is not None and not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR:
            failed.append(name)
    return failed


def refuse_if_blocked(context: dg.AssetExecutionContext, run_name: str) -> None:
    """Dagster gates blocking checks within one run only; an export launched in a later run asks the
    instance, so a failed check keeps the exports from building until the checks pass again."""
    failed = failed_blocking_checks(context.instance, run_name)
    if failed:
        raise dg.Failure(
            description=f"not exported: blocking check(s) {', '.join(failed)} of {run_name}/filtered_trajectories "
            "failed on their latest evaluation; fix the data and materialize filtered_trajectories (which runs "
            "its checks) until they pass",
            metadata={"failed_checks": ", ".join(failed)},
        )


def build_run_checks(recipe: Recipe, data_root: Path) -> list[dg.AssetChecksDefinition]:
    """The checks of one run's `filtered_trajectories` (in one step; any subset can run); they read
    the run folder's files."""
    paths = RunPaths(run_dir(data_root, recipe.run_name))
    target = dg.AssetKey([recipe.run_name, "filtered_trajectories"])

    @dg.multi_asset_check(
        specs=[dg.AssetCheckSpec(name, asset=target, description=description, blocking=name in BLOCKING,
                                 metadata=check_catalog("output"))
               for name, (description, _) in CHECKS.items()],
        name=f"{recipe.run_name}__filtered_trajectories_checks", can_subset=True,
    )
    def filtered_trajectories_checks(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        for key in context.selected_asset_check_keys:
            result = CHECKS[key.name][1](paths)
            yield result._replace(asset_key=target, check_name=key.name)

    return [filtered_trajectories_checks]


def build_run_assets_and_checks(
    recipe: Recipe, data_root: Path
) -> tuple[list[dg.AssetsDefinition], list[dg.AssetChecksDefinition]]:
    """What the CLI materializes: `dg.materialize([*assets, *checks], selection=[asset keys])` runs the
    checks of every selected asset in the same run."""
    return build_run_assets(recipe, data_root), build_run_checks(recipe, data_root)


def format_check_results(result: dg.ExecuteInProcessResult) -> list[str]:
    """One console line per check that did not pass (for the CLI summary)."""
    lines = []
    for evaluation in result.get_asset_check_evaluations():
        if not evaluation.passed:
            level = "warning" if evaluation.severity == dg.AssetCheckSeverity.WARN else "error"
            lines.append(f"check {evaluation.check_name} ({level}): {evaluation.description or 'did not pass'}")
    return lines


def blocking_failures(result: dg.ExecuteInProcessResult) -> list[str]:
    """Names of the blocking checks that failed with ERROR severity in this run (they stopped its downstream steps)."""
    return sorted(e.check_name for e in result.get_asset_check_evaluations()
                  if e.blocking and not e.passed and e.severity == dg.AssetCheckSeverity.ERROR)
