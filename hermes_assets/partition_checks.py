"""Per-partition checks of a run's `raw_trajectories`: each materialized batch partition's ledger file
parses line by line, and every member sample of the batch plan has a final record.

Why not Dagster's partitioned asset checks (`AssetCheckSpec(partitions_def=...)`, preview in 1.13):
`raw_trajectories` reports partitions as `AssetMaterialization` events without an output, so a check
in the same run is skipped, and a check-only run cannot take the partition key of a check
(`materialize` refuses it). So one unpartitioned check evaluates every materialized partition and
reports each partition's result in its metadata (`by_partition`) and the failed ones in its description."""

from pathlib import Path
from typing import Any, Callable, Iterator

import dagster as dg

from hermes_core.batch.ledger import RECORD_KEYS, BatchPlan
from hermes_core.batch.ledgers import open_ledger
from hermes_core.batch.pipeline import RunPaths
from hermes_core.batch.recipe import Recipe, run_dir
from hermes_core.fileio import json_loads
from hermes_assets.checks import MAX_LISTED
from hermes_assets.metadata import check_catalog

PartitionProblems = Callable[[RunPaths], Callable[[str], str | None]]
"""A run's files -> what is wrong with a partition (by key), or None; what every partition shares is read once."""


def damaged_lines(paths: RunPaths) -> Callable[[str], str | None]:
    """Lines of raw/<partition>.jsonl that are not records (damaged, torn, not JSON objects). A
    ledger on object storage has no per-partition file: nothing to parse line by line."""
    raw = paths.raw
    if not isinstance(raw, Path):
        return lambda _partition: None

    def problem(partition: str) -> str | None:
        path = raw / f"{partition}.jsonl"
        if not path.is_file():
            return "no ledger file"
        bad = []
        for number, line in enumerate(path.read_bytes().split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                record = json_loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict) or any(key not in record for key in RECORD_KEYS):
                bad.append(number)
        if not bad:
            return None
        return f"{len(bad)} damaged line(s): {', '.join(map(str, bad[:MAX_LISTED]))}"

    return problem


def members_without_final_record(paths: RunPaths) -> Callable[[str], str | None]:
    """Members of the batch (per batches.json) whose latest ledger record is missing or not final.
    The plan and the ledger are read once for all partitions: per partition, each read lists every
    batch (quadratic in the batches)."""
    plan, ledger = BatchPlan(paths.batches), open_ledger(paths.raw)

    def problem(partition: str) -> str | None:
        try:
            members = plan.get(partition).members
        except KeyError:
            return "not in the batch plan (batches.json)"
        missing = [key for key in members if not ledger.is_done(key)]
        if not missing:
            return None
        return f"{len(missing)} of {len(members)} member(s) without a final record: {', '.join(missing[:MAX_LISTED])}"

    return problem


PARTITION_CHECKS: dict[str, tuple[str, PartitionProblems]] = {
    "ledger_records_parse": ("Every line of each materialized partition's ledger file (raw/<partition>.jsonl) "
                             "is a record.", damaged_lines),
    "batch_members_recorded": ("Every member sample of each materialized partition (batches.json) has a final "
                               "ledger record.", members_without_final_record),
}


def evaluate_partitions(paths: RunPaths, partitions: list[str], problems: PartitionProblems) -> dg.AssetCheckResult:
    """One result over `partitions`: passed when none has a problem; `by_partition` holds each partition's
    finding ("ok" or the problem), so the UI shows which batch to repair."""
    problem = problems(paths)
    by_partition = {partition: problem(partition) or "ok" for partition in partitions}
    failed = sorted(partition for partition, finding in by_partition.items() if finding != "ok")
    metadata: dict[str, Any] = {
        "partitions_checked": len(partitions), "failed_partitions": len(failed),
        "failed_partition_keys": ", ".join(failed[:MAX_LISTED]) or "none",
        "by_partition": dg.MetadataValue.json(dict(sorted(by_partition.items()))),
    }
    description = "; ".join(f"{partition}: {by_partition[partition]}" for partition in failed[:MAX_LISTED])
    return dg.AssetCheckResult(passed=not failed, metadata=metadata, description=description[:1000] or None)


def build_partition_checks(recipe: Recipe, data_root: Path) -> list[dg.AssetChecksDefinition]:
    """The per-partition checks of one run's `raw_trajectories` (one step; either can run alone). Not
    blocking: a damaged ledger line costs that record, and the checks of filtered_trajectories gate the exports."""
    paths = RunPaths(run_dir(data_root, recipe.run_name))
    target = dg.AssetKey([recipe.run_name, "raw_trajectories"])

    @dg.multi_asset_check(
        specs=[dg.AssetCheckSpec(name, asset=target, description=description, metadata=check_catalog("generation"))
               for name, (description, _) in PARTITION_CHECKS.items()],
        name=f"{recipe.run_name}__raw_trajectories_checks", can_subset=True,
    )
    def raw_trajectories_checks(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        partitions = sorted(context.instance.get_materialized_partitions(target))
        for key in context.selected_asset_check_keys:
            result = evaluate_partitions(paths, partitions, PARTITION_CHECKS[key.name][1])
            yield result._replace(asset_key=target, check_name=key.name)

    return [raw_trajectories_checks]
