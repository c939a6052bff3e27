"""One asset group per run: prompts → toolset_assignments → raw_trajectories (batch partitions)
→ filtered_trajectories → statistics. Assets are thin: they call `hermes_core.batch.pipeline`."""

import queue
import threading
from collections import Counter
from pathlib import Path
from typing import NoReturn

import dagster as dg

from hermes_core.formats import hf_loading
from hermes_core.batch import pipeline
from hermes_core.batch.ledger import BatchPlan
from hermes_core.batch.ledgers import open_ledger
from hermes_core.batch.pipeline import RunPaths
from hermes_core.batch.progress import Progress
from hermes_core.batch.recipe import Recipe, RecipeError, run_dir
from hermes_core.batch.stopping import graceful_signals
from hermes_core.batch.writer_lock import RunBusy
from hermes_core.endpoints.errors import EndpointConfigError, is_config_error
from hermes_assets.metadata import bar_chart, catalog
from hermes_assets.resources import MODEL_POOL, ModelEndpointResource
from hermes_assets.runs_file import adopt_recipe
from hermes_assets.slots import abandon_run, tag_run
from hermes_assets.versions import (CODE_VERSIONS, STOPPED_TAG, attribute_run, build_dataset_source, file_version,
                                    keys_version, lineage_metadata, observe_dataset, partition_materialization,
                                    planned_dataset_sha256, upstream_tags)



class RawTrajectoriesConfig(dg.Config):
    show_progress: bool = False  # the CLI turns this on to draw its progress bar
    verbose: bool = False  # and this with --verbose: a line per finished sample


def batches_partitions(run_name: str) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=f"{run_name}__batches")


def build_run_assets(recipe: Recipe, data_root: Path) -> list[dg.AssetsDefinition | dg.SourceAsset]:
    run = recipe.run_name
    paths = RunPaths(run_dir(data_root, run))
    partitions = batches_partitions(run)
    common = {"key_prefix": [run], "group_name": run}
    dataset_file = build_dataset_source(recipe)

    @dg.asset(**common, **catalog("input", "json"), deps=[dataset_file], code_version=CODE_VERSIONS["prompts"],
              description="The dataset, validated and keyed by content (SPEC §1–2); its data version "
              "hashes the ordered sample keys.")
    def prompts(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        adopt_recipe(data_root, recipe)  # a run declared in the runs file gets its folder and recipe here
        attribute_run(context, recipe, paths.root)
        dataset = pipeline.load_prompts(recipe, paths)
        preview = "\n".join(
            f"| {s.prompt_index} | `{s.sample_key[:12]}` | {s.prompt[:80].replace('|', '/').replace(chr(10), ' ')} |"
            for s in dataset.samples[:10]
        )
        versions = {"data_version": keys_version(s.sample_key for s in dataset.samples),
                    "tags": observe_dataset(context.instance, run, dataset.sha256)}
        return dg.MaterializeResult(**versions, metadata={
            "rows": len(dataset.samples),
            "invalid_lines": len(dataset.invalid),
            "duplicates": dataset.duplicates,
            **lineage_metadata(recipe, dataset.sha256),
            "dataset_file": dg.MetadataValue.path(str(dataset.path)),
            "preview": dg.MetadataValue.md("| index | key | prompt |\n|---|---|---|\n" + preview),
        })

    @dg.asset(**common, **catalog("generation", "json"), deps=[prompts],
              code_version=CODE_VERSIONS["toolset_assignments"],
              description="Toolsets drawn per sample (seeded); batches planned.")
    def toolset_assignments(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        attribute_run(context, recipe, paths.root)
        assignments, new_batches = pipeline.assign_toolsets(recipe, paths)
        if new_batches:
            context.instance.add_dynamic_partitions(partitions.name, [batch.key for batch in new_batches])
        frequency = Counter(t for a in assignments for t in a["toolsets"])
        sizes = Counter(len(a["toolsets"]) for a in assignments)
        return dg.MaterializeResult(metadata={
            "samples": len(assignments),
            "new_batches": len(new_batches),
            "toolset_frequency": dg.MetadataValue.json(dict(frequency.most_common())),
            "toolset_set_sizes": dg.MetadataValue.json({str(k): v for k, v in sorted(sizes.items())}),
        })

    @dg.asset(
        **common,
        **catalog("generation", "openai"),  # it calls the model endpoint
        deps=[toolset_assignments],
        code_version=CODE_VERSIONS["raw_trajectories"],
        partitions_def=partitions,
        backfill_policy=dg.BackfillPolicy.single_run(),
        pool=MODEL_POOL,
        output_required=False,
        description="Agent trajectories per batch; each finished sample is recorded in the ledger at once.",
    )
    def raw_trajectories(
        context: dg.AssetExecutionContext, config: RawTrajectoriesConfig, model_endpoint: ModelEndpointResource
    ):
        tag_run(context)
        attribute_run(context, recipe, paths.root)
        endpoint = model_endpoint.endpoint(recipe.model, recipe.base_url)
        progress = (Progress(verbose=config.verbose, preview_chars=recipe.log_prefix_chars)
                    if config.show_progress else None)
        finished: queue.Queue[pipeline.BatchOutcome | None] = queue.Queue()
        plan, dataset_sha256 = BatchPlan(paths.batches), planned_dataset_sha256(paths)
        current = {sample.sample_key for sample in pipeline.read_samples(paths)}  # the dataset as loaded now
        lineage = lineage_metadata(recipe, dataset_sha256)
        upstream = upstream_tags(context.instance, toolset_assignments.key)
        # Brought up to date once: it is the ledger the pool below records into (open_ledger shares
        # it within this process), so it holds every record at once; a refresh per batch would list
        # and stat every batch file each time (quadratic in the batches: 2.4 s at 200 of them).
        ledger = open_ledger(paths.raw)
        result: dict[str, object] = {}

        def work() -> None:  # the pool runs in a thread so partitions are recorded as batches finish
            try:
                result["outcomes"], result["stopped"] = pipeline.run_partitions(
                    recipe, paths, endpoint, list(context.partition_keys), context.run.run_id,
                    on_start=progress.start if progress else None,
                    on_record=progress.update if progress else None,
                    on_batch_done=finished.put,
                )
            except BaseException as exc:  # re-raised in the step below, with its own message
                result["error"] = exc
            finally:
                finished.put(None)

        worker = threading.Thread(target=work, name=f"{run}-batches", daemon=True)
        materialized: set[str] = set()
        # Ctrl-C (or the UI's terminate): in-flight samples finish first; a second one frees the slot and exits
        with graceful_signals(on_abort=lambda: abandon_run(context.instance, context.run)):
            worker.start()
            while (outcome := finished.get()) is not None:
                if outcome.failed_retryable:
                    continue  # stays failed/missing in the UI: materializing it again is the resume
                materialized.add(outcome.partition_key)
                yield partition_materialization(context.asset_key, outcome, plan.get(outcome.partition_key),
                                                ledger, lineage, upstream, current)
            worker.join()
        if progress:
            progress.finish()
        unfinished = [key for key in context.partition_keys if key not in materialized]
        if isinstance(result.get("error"), USER_ERRORS):  # nothing of these batches ran: say why on each
            fail_batches(context, unfinished, str(result["error"]))
        if "error" in result:
            raise result["error"]  # type: ignore[misc]
        outcomes: dict[str, pipeline.BatchOutcome] = result["outcomes"]  # type: ignore[assignment]
        stopped = result["stopped"]
        if stopped:  # the unfinished batches stay unmaterialized: materializing them resumes
            context.log.warning(f"stopped early: {stopped}")
            # The run still succeeds (what it finished is saved); the Runs page shows and filters this tag.
            context.instance.add_run_tags(context.run.run_id, {STOPPED_TAG: str(stopped)})
        failed = {k: o.failed_retryable for k, o in outcomes.items() if o.failed_retryable}
        if failed:
            why = f"{stopped}. " if is_config_error(stopped) else ""  # the endpoint's fault first, not a count
            fail_batches(context, unfinished, f"{why}{sum(failed.values())} sample(s) failed with retryable errors in "
                         f"{len(failed)} batch(es); their successes are saved. Materialize the failed partitions "
                         "again to resume.", {"failed_batches": dg.MetadataValue.json(failed)})

    # Both read the dataset's current sample set too (prompt order, pending counts): a dataset change
    # makes them stale at once, not only after the batches ran.
    @dg.asset(**common, **catalog("output", "json"), deps=[raw_trajectories, prompts],
              code_version=CODE_VERSIONS["filtered_trajectories"],
              description="Kept trajectories merged in prompt order.")
    def filtered_trajectories(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        attribute_run(context, recipe, paths.root)
        counts = pipeline.write_trajectories(paths)
        hf_loading.prefetch(paths.trajectories)  # the loads_with_hf_datasets check's load starts now
        return dg.MaterializeResult(data_version=file_version(paths.trajectories), metadata={
            "kept_rows": counts["kept"], "samples_done": counts["done"],
            "path": dg.MetadataValue.path(str(paths.trajectories)),
        })

    @dg.asset(**common, **catalog("output", "json"), deps=[filtered_trajectories, prompts],
              code_version=CODE_VERSIONS["statistics"],
              description="Whole-run statistics (SPEC §9).")
    def statistics(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        attribute_run(context, recipe, paths.root)
        stats = pipeline.write_statistics(recipe, paths)
        tools = sorted(stats["tool_statistics"].items(), key=lambda item: -item[1]["count"])
        table = "\n".join(
            f"| {name} | {s['count']} | {s['success']} | {s['failure']} | {s['success_rate']}% |"
            for name, s in tools if s["count"]
        )
        return dg.MaterializeResult(data_version=file_version(paths.statistics), metadata={
            **{f"count_{k}": v for k, v in stats["counts"].items()},
            "api_calls": stats["api_calls"],
            "total_tokens": stats["usage"]["total_tokens"],
            "reasoning_coverage_pct": stats["reasoning_statistics"]["coverage_pct"],
            "tools": dg.MetadataValue.md("| tool | count | success | failure | success rate |\n|---|---|---|---|---|\n"
                                         + table),
            "tool_usage_plot": dg.MetadataValue.md(bar_chart("tool calls", {n: s["count"] for n, s in tools if s["count"]})),
            "dispositions_plot": dg.MetadataValue.md(bar_chart("samples", stats["counts"])),
            "path": dg.MetadataValue.path(str(paths.statistics)),
        })

    return [dataset_file, prompts, toolset_assignments, raw_trajectories, filtered_trajectories, statistics]


# What stops a batch run before its samples run, through no fault of the code: the message says it all.
USER_ERRORS = (EndpointConfigError, pipeline.PreflightError, RecipeError, RunBusy)


def fail_batches(context: dg.AssetExecutionContext, partition_keys: list[str], reason: str,
                 metadata: dict[str, dg.MetadataValue] | None = None) -> NoReturn:
    """Fail the step with `reason` as its first line (not a nested cause), noted on each partition it
    leaves unfinished (their pages list it); the partitions the run finished are materialized already,
    so Dagster marks only these failed."""
    for key in partition_keys:
        context.log_event(dg.AssetObservation(context.asset_key, partition=key, description=reason,
                                              metadata={"failed_in_run": context.run.run_id, "reason": reason}))
    raise dg.Failure(description=reason, metadata=metadata or {})
