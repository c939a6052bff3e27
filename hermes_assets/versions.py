"""Data and code versions of a run's assets, and the partition-true metadata of `raw_trajectories`.

Data versions (Dagster compares them to mark downstream assets stale):
- `dataset_file` (an observable source asset): sha256 of the file's bytes, so any byte change is seen.
- `prompts`: sha256 over the ordered sample keys. A key hashes a row's parsed content and the recipe
  fingerprint, so reformatting a row's whitespace (or rewriting the file with the same rows) keeps the
  version, while adding, removing, editing or *reordering* rows moves it: the order is the
  `prompt_index` that every output row carries.
- a `raw_trajectories` partition: sha256 over the latest ledger record of each member sample
  (key, disposition, attempt, finished_at; "pending" without one): it moves exactly when a record lands.
- `filtered_trajectories`, `statistics`: sha256 of the file they wrote.

Code versions: hermes_core.batch.code_versions (a sha256 over the source files that shape an asset's
rows), the same ones the rows record.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
# The provenance tags Dagster writes on the materializations it builds itself; a partition event
# yielded by hand needs the same ones for the stale status (no public alias for these names).
from dagster._core.definitions.data_version import (
    CODE_VERSION_TAG, DATA_VERSION_IS_USER_PROVIDED_TAG, DATA_VERSION_TAG, DEFAULT_DATA_VERSION,
    NULL_EVENT_POINTER, get_input_data_version_tag, get_input_event_pointer_tag,
)

from hermes_core.batch.code_versions import ROW_SHAPING, code_version
from hermes_core.batch.ledger import Batch, Ledger
from hermes_core.batch.pipeline import BatchOutcome, RunPaths
from hermes_core.batch.recipe import Recipe
from hermes_core.formats.filters import Disposition
from hermes_assets.metadata import source_catalog

CODE_VERSIONS: dict[str, str] = {asset: code_version(asset) for asset in ROW_SHAPING}


def dataset_asset_key(run: str) -> dg.AssetKey:
    return dg.AssetKey([run, "dataset_file"])


def build_dataset_source(recipe: Recipe) -> dg.SourceAsset:
    """The run's dataset file as an observable source asset, versioned by its content sha256."""
    path = Path(recipe.dataset_file)

    @dg.observable_source_asset(
        key=dataset_asset_key(recipe.run_name), group_name=recipe.run_name, **source_catalog("input", "json"),
        # The name only: a folder of this machine would make the definition differ from machine to machine.
        description=f"The dataset file `{path.name}`, versioned by the sha256 of its bytes (its observations' "
                    "`path` metadata is where it is).",
    )
    def dataset_file() -> dg.ObserveResult:
        if not path.is_file():
            raise dg.Failure(description=f"{path}: dataset file not found")
        with open(path, "rb") as handle:
            sha256 = hashlib.file_digest(handle, "sha256").hexdigest()  # as `prompts` records it
        return dg.ObserveResult(data_version=dg.DataVersion(sha256), metadata={
            "path": dg.MetadataValue.path(str(path)), "bytes": path.stat().st_size})

    return dataset_file


def dataset_observation(latest: Any, key: dg.AssetKey, sha256: str, **metadata: Any) -> dg.AssetObservation | None:
    """An observation of the dataset at version `sha256`, unless `latest` (the source's latest data
    version record, or None) is of that version already."""
    observed = latest.asset_observation if latest else None
    if observed is not None and (observed.tags or {}).get(DATA_VERSION_TAG) == sha256:
        return None
    return dg.AssetObservation(asset_key=key, metadata=metadata,
                               tags={DATA_VERSION_TAG: sha256, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"})


def observe_dataset(instance: dg.DagsterInstance, run: str, sha256: str) -> dict[str, str]:
    """`prompts` reads the file itself, so the version it read is what it was built from: recorded as an
    observation of the source when the last one differs (nobody observed the change yet), and named as
    its input version in the tags it returns. Observing is then optional, never a step to forget."""
    key = dataset_asset_key(run)
    latest = instance.get_latest_data_version_record(key, is_source=True)
    if observation := dataset_observation(latest, key, sha256):
        instance.report_runless_asset_event(observation)
        latest = instance.get_latest_data_version_record(key, is_source=True)
    return {get_input_data_version_tag(key): sha256,
            get_input_event_pointer_tag(key): str(latest.storage_id) if latest else NULL_EVENT_POINTER}


def _digest(parts: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\n")
    return digest.hexdigest()[:24]


def keys_version(sample_keys: Iterable[str]) -> dg.DataVersion:
    """Version of the keyed sample set, in prompt order."""
    return dg.DataVersion(_digest(sample_keys))


def file_version(path: Path) -> dg.DataVersion:
    with open(path, "rb") as handle:  # in blocks: trajectories.jsonl can be gigabytes
        return dg.DataVersion(hashlib.file_digest(handle, "sha256").hexdigest()[:24])


def _member_state(key: str, record: Mapping[str, Any] | None) -> str:
    if record is None:
        return f"{key} pending"
    return f"{key} {record['disposition']} {record.get('attempt')} {record.get('finished_at')}"


def partition_version(ledger: Ledger, batch: Batch) -> dg.DataVersion:
    return dg.DataVersion(_digest(_member_state(k, ledger.latest.get(k)) for k in batch.members))


def partition_state(ledger: Ledger, batch: Batch, current: Collection[str]) -> dict[str, Any]:
    """The partition as the ledger holds it, for its members still in the dataset (`current`, the
    sample keys as loaded now): their latest records counted by disposition, and what every attempt
    of them cost, as statistics.json and the per-sample table count them. Members whose rows were
    since deleted or edited are `orphaned`, counted apart."""
    members = [key for key in batch.members if key in current]
    dispositions = [ledger.latest[key]["disposition"] for key in members if key in ledger.latest]
    spend = ledger.spent_on(members)
    return {
        "members": len(members),
        "kept": dispositions.count(Disposition.KEPT),
        "discarded": sum(d.startswith("discarded") for d in dispositions),
        "failed_terminal": dispositions.count(Disposition.FAILED_TERMINAL),
        "failed_retryable": dispositions.count(Disposition.FAILED_RETRYABLE),
        "pending": len(members) - sum(d in Disposition.FINAL for d in dispositions),
        "orphaned": len(batch.members) - len(members),
        "api_calls": spend["api_calls"],
        "total_tokens": spend["total_tokens"],
        "cost_usd": round(spend["cost_usd"], 6),
    }


def upstream_tags(instance: dg.DagsterInstance, upstream: dg.AssetKey) -> dict[str, str]:
    """The input tags of a hand-built materialization: the version of its one upstream asset as of
    now, and a pointer to that materialization (what Dagster compares to call it stale). A step asks
    once, at its start: its samples were planned from that version, whatever runs meanwhile."""
    records = instance.fetch_materializations(upstream, limit=1).records
    event = records[0].asset_materialization if records else None
    upstream_version = event.tags.get(DATA_VERSION_TAG) if event and event.tags else None
    return {
        get_input_data_version_tag(upstream): upstream_version or DEFAULT_DATA_VERSION.value,
        get_input_event_pointer_tag(upstream): str(records[0].storage_id) if records else NULL_EVENT_POINTER,
    }


def provenance_tags(code_version: str, data_version: dg.DataVersion, upstream: Mapping[str, str]) -> dict[str, str]:
    """The data-version tags of a hand-built materialization: its version, its code version and its
    upstream's (`upstream_tags`)."""
    return {CODE_VERSION_TAG: code_version, DATA_VERSION_TAG: data_version.value,
            DATA_VERSION_IS_USER_PROVIDED_TAG: "true", **upstream}


def lineage_metadata(recipe: Recipe, dataset_sha256: str) -> dict[str, Any]:
    """What takes an auditor from an event to the recipe and dataset behind it."""
    return {
        "dataset_sha256": dataset_sha256,
        "recipe_fingerprint": recipe.fingerprint(),
        "recipe": dg.MetadataValue.json(json.loads(json.dumps(recipe.to_json(), default=str))),
    }


def dataset_state(path: Path, cached: dict[str, Any] | None) -> dict[str, Any]:
    """size, mtime_ns and sha256 of the dataset; the hash is reused while size and mtime are unchanged."""
    stat = path.stat()
    if cached and cached.get("size") == stat.st_size and cached.get("mtime_ns") == stat.st_mtime_ns:
        return cached
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest.hexdigest()}


def planned_dataset_sha256(paths: RunPaths) -> str:
    """The sha256 of the dataset as `prompts` last loaded it (what the batches were planned from)."""
    return json.loads(paths.dataset.read_text())["sha256"]


STOPPED_TAG = "hermes/stopped"  # on a batch run that stopped early: why (a signal, a budget, a config error)


def run_tags(recipe: Recipe, dataset_sha256: str | None) -> dict[str, str]:
    """Tags naming what a run works on, so the Runs page can be filtered by them."""
    tags = {"hermes/run": recipe.run_name, "hermes/model": recipe.model, "hermes/distribution": recipe.distribution}
    if dataset_sha256:
        tags["hermes/dataset_sha256"] = dataset_sha256
    return tags


def attribute_run(context: dg.AssetExecutionContext, recipe: Recipe, folder: Path) -> None:
    """Give the run executing a step of `recipe`'s assets the run's tags, whatever launched it: runs from
    an asset page, "Materialize all" or a backfill run Dagster's hidden asset job with no tags of ours,
    and the Runs page's `hermes/run` filter missed them."""
    try:
        sha256: str | None = planned_dataset_sha256(RunPaths(folder))
    except (OSError, ValueError, KeyError):
        sha256 = None  # before prompts first ran
    wanted = run_tags(recipe, sha256)
    if any(context.run.tags.get(key) != value for key, value in wanted.items()):
        context.instance.add_run_tags(context.run.run_id, wanted)


def partition_materialization(
    asset_key: dg.AssetKey, outcome: BatchOutcome, batch: Batch, ledger: Ledger, lineage: Mapping[str, Any],
    upstream: Mapping[str, str], current: Collection[str],
) -> dg.AssetMaterialization:
    """A finished `raw_trajectories` partition: its state from the ledger (so a no-op re-run still shows
    what it holds), what this invocation did, its lineage (`lineage_metadata`), and its data version
    from its records (with `upstream_tags` of its toolset assignments)."""
    code_version = CODE_VERSIONS["raw_trajectories"]
    metadata = {
        **partition_state(ledger, batch, current),
        "samples_run": outcome.run, "samples_skipped": outcome.skipped,
        "api_calls_this_run": outcome.api_calls, "tokens_this_run": outcome.total_tokens,
        "sandboxes_created": outcome.sandboxes_created, "sandboxes_failed": outcome.sandboxes_failed,
        "wall_seconds": round(outcome.wall_seconds, 3),
        "batch_num": batch.number, **lineage, "code_version": code_version,
    }
    return dg.AssetMaterialization(
        asset_key=asset_key, partition=outcome.partition_key, metadata=metadata,
        tags=provenance_tags(code_version, partition_version(ledger, batch), upstream),
    )
