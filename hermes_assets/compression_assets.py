"""The optional `compressed_trajectories` asset of a run (SPEC §10): `filtered_trajectories` fitted
into a token budget by `hermes_core.formats.compression`.

Enabled per run by the recipe's `compression` setting (true = defaults, or a mapping of settings:
the `CompressionConfig` fields plus `model`, `base_url`, `tokenizer`), or for every run by
`HERMES_COMPRESSION=1`. Run config set at launch (UI launchpad) overrides single settings.
"""

# No `from __future__ import annotations`: Dagster reads the asset's parameter types at definition time.
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

import dagster as dg

from hermes_core.formats.compression import CompressionConfig, compress_file, load_counter, report_summary
from hermes_core.config import Endpoint
from hermes_core.batch.pipeline import RunPaths
from hermes_core.batch.recipe import Recipe, run_dir
from hermes_assets.resources import MODEL_POOL, ModelEndpointResource
from hermes_assets.slots import tag_run
from hermes_assets.metadata import bar_chart, catalog
from hermes_assets.versions import CODE_VERSIONS, attribute_run

COMPRESSION_ENV = "HERMES_COMPRESSION"
ENDPOINT_KEYS = ("model", "base_url", "tokenizer")  # where to summarise/count, not how to compress


class CompressionRunConfig(dg.Config):
    """Per-materialization overrides; unset fields keep the recipe's settings (then the defaults)."""

    target_max_tokens: Optional[int] = None
    summary_target_tokens: Optional[int] = None
    protect_last_n_turns: Optional[int] = None
    sample_percent: Optional[float] = None
    seed: Optional[int] = None
    concurrency: Optional[int] = None
    timeout_s: Optional[float] = None
    model: Optional[str] = None
    base_url: Optional[str] = None
    tokenizer: Optional[str] = None
    show_progress: bool = False  # a CLI driving the asset turns this on for a progress line


def validate_compression_settings(raw: Any) -> dict[str, Any]:
    """The recipe's `compression` value as a settings mapping ({} = defaults); ValueError names the
    bad key. Meant for recipe / runs-file validation too, so mistakes surface when the run is declared."""
    if raw is True:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"compression: expected true or a mapping of settings, got {type(raw).__name__}")
    for key in ENDPOINT_KEYS:
        if key in raw and not isinstance(raw[key], (str, type(None))):
            raise ValueError(f"compression setting {key!r}: expected a string")
    CompressionConfig.from_mapping({k: v for k, v in raw.items() if k not in ENDPOINT_KEYS})
    return dict(raw)


def progress_ops(recipe: Recipe) -> dict[str, Any]:
    """Op config that shows the compression's progress line, for the CLI's finalize run ({} when the
    run does not compress: the job then has no such step)."""
    if recipe_compression(recipe) is None:
        return {}
    return {f"{recipe.run_name}__compressed_trajectories": {"config": {"show_progress": True}}}


def compression_summary(recipe: Recipe, paths: RunPaths) -> list[str]:
    """What the CLI adds to its summary for a compressed run: the compress report's lines, indented."""
    if recipe_compression(recipe) is None or not paths.compression_metrics.is_file():
        return []
    return [f"  {line}" for line in report_summary(json.loads(paths.compression_metrics.read_text())).splitlines()]


def recipe_compression(recipe: Recipe) -> dict[str, Any] | None:
    """The run's compression settings, or None when compression is off for it."""
    # getattr: recipes saved before the `compression` field existed simply do not have it.
    raw = getattr(recipe, "compression", None)
    if raw in (None, False):
        enabled = os.environ.get(COMPRESSION_ENV, "").strip().lower() in ("1", "true", "yes", "on")
        return {} if enabled else None
    return validate_compression_settings(raw)


def _endpoint(settings: Mapping[str, Any], recipe: Recipe, resource: ModelEndpointResource,
              timeout_s: float) -> Endpoint:
    """The summariser endpoint: the compression settings' own URL/model, else the run's (SPEC §13)."""
    model = settings.get("model") or recipe.model
    if settings.get("base_url"):
        endpoint = Endpoint.resolve(settings["base_url"], resource.api_key(), model, max_retries=resource.max_retries,
                                    backoff_base_s=resource.backoff_base_s)
    else:
        endpoint = resource.endpoint(model, recipe.base_url)
    return dataclasses.replace(endpoint, request_timeout_s=timeout_s)


def compression_metadata(report: dict[str, Any], recipe: Recipe) -> dict[str, Any]:
    counts, tokens = report["counts"], report["tokens"]
    return {
        "rows": counts["rows"], "over_budget": counts["over_budget"], "compressed": counts["compressed"],
        "still_over_budget": counts["still_over_budget"], "failed": counts["failed"],
        "original_tokens": tokens["original"], "compressed_tokens": tokens["compressed"],
        "token_ratio": float(tokens["ratio"]), "turns_removed": report["turns_removed"],
        "summariser_calls": report["summariser"]["calls"], "summary_cache_hits": report["summariser"]["cache_hits"],
        "summariser_model": report["summariser"]["model"] or "",
        "tokenizer": report["tokenizer"]["description"],
        "target_max_tokens": report["settings"]["target_max_tokens"],
        "skipped": dg.MetadataValue.md(bar_chart("rows", counts["skipped"] or {"none": 0})),
        "recipe_fingerprint": recipe.fingerprint(), "code_version": CODE_VERSIONS["compressed_trajectories"],
        "path": dg.MetadataValue.path(report["output"]),
        "metrics_file": dg.MetadataValue.path(report["metrics_file"]),
    }


def build_compression_assets(recipe: Recipe, data_root: Path) -> list[dg.AssetsDefinition]:
    """[compressed_trajectories] when compression is enabled for the run, else []."""
    base_settings = recipe_compression(recipe)
    if base_settings is None:
        return []
    run = recipe.run_name
    paths = RunPaths(run_dir(data_root, run))

    @dg.asset(
        key_prefix=[run], group_name=run, code_version=CODE_VERSIONS["compressed_trajectories"],
        **catalog("output", "openai", "json"),  # it calls a model endpoint to summarise
        deps=[dg.AssetKey([run, "filtered_trajectories"])],
        pool=MODEL_POOL,  # it drives a model endpoint like raw_trajectories, so it shares the cap
        description=f"Trajectories fitted into a token budget (middle spans summarised): {paths.compressed.name} "
        f"and {paths.compression_metrics.name} (SPEC §10).",
    )
    def compressed_trajectories(context: dg.AssetExecutionContext, config: CompressionRunConfig,
                                model_endpoint: ModelEndpointResource) -> dg.MaterializeResult:
        tag_run(context)
        attribute_run(context, recipe, paths.root)
        overrides = {k: v for k, v in config.model_dump().items() if v is not None and k != "show_progress"}
        settings = validate_compression_settings({**base_settings, **overrides})
        compression = CompressionConfig.from_mapping({k: v for k, v in settings.items() if k not in ENDPOINT_KEYS})
        if not paths.trajectories.is_file():
            raise dg.Failure(f"{paths.trajectories} does not exist: materialize filtered_trajectories first")
        report = compress_file(
            paths.trajectories, paths.compressed, config=compression,
            counter=load_counter(settings.get("tokenizer")),
            endpoint=_endpoint(settings, recipe, model_endpoint, compression.timeout_s),
            metrics_path=paths.compression_metrics, progress=sys.stderr if config.show_progress else None,
        )
        metadata = compression_metadata(report, recipe)
        if report["counts"]["failed"]:
            # The file is written (failed rows copied unchanged); failing the step keeps the UI honest,
            # and materializing again only pays for the failed spans (finished summaries are cached).
            raise dg.Failure(
                description=f"{report['counts']['failed']} row(s) could not be summarised and were kept "
                f"uncompressed; first error: {report['failures'][0]['reason']}",
                metadata=metadata,
            )
        return dg.MaterializeResult(metadata=metadata)

    return [compressed_trajectories]
