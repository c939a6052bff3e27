"""hermes-batch's Dagster part: plan and run the pending batches, then finalize, each a run of the code
location's own jobs (launch.py). The CLI imports this module only once it knows there is work for
Dagster: importing it (Dagster, ~1 s) and loading the instance are most of a short command's start-up."""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import dagster as dg

from hermes_core.batch import pipeline
from hermes_core.batch.dataset import Dataset
from hermes_core.batch.pipeline import RunPaths
from hermes_core.batch.recipe import Recipe, RecipeError, run_dir
from hermes_core.batch.settled import PLAN, Printed, save_settled
from hermes_core.batch.stopping import interrupt
from hermes_core.config import Endpoint
from hermes_core.endpoints.errors import EndpointConfigError, is_config_error
from hermes_assets.checks import blocking_failures, format_check_results
from hermes_assets.compression_assets import compression_summary, progress_ops
from hermes_assets.export_assets import EXPORT_NAMES
from hermes_assets.definitions import build_definitions
from hermes_assets.instance import get_instance
from hermes_assets.launch import execute_job, first_error, full_disk, run_config, step_ran
from hermes_assets.resources import MODEL_POOL
from hermes_assets.sensors import finalize_job_name, plan_job_name, raw_job_name, register_partitions
from hermes_assets.slots import wait_for_slot
from hermes_assets.versions import run_tags


def run_phases(args: argparse.Namespace, root: Path, recipe: Recipe, endpoint: Endpoint, dataset: Dataset,
               instance_files: list[Path]) -> int:
    """Plan and run the pending batches in one run (the planning alone, in the run's plan job, when no
    batch is pending or with --plan_only), then finalize in the run's finalize job (launch.py). A clean
    end saves the run as settled (settled.py): the next command with nothing to do skips all this."""
    run, paths = recipe.run_name, RunPaths(run_dir(root, recipe.run_name))
    defs = build_definitions(root, recipes=[recipe])  # the run's part of the code location
    config = run_config(args.verbose, endpoint.base_url, args.api_key, args.max_retries, args.max_concurrent_requests)
    instance = get_instance()  # once: each load costs ~0.4 s
    gc.freeze()  # the instance's imports, kept for the command's life like the others (cli._tuned_gc)
    hermes_tags = run_tags(recipe, dataset.sha256)  # the Runs page filters on these

    def assets_of(job_name: str) -> set[dg.AssetKey]:
        return set(defs.resolve_job_def(job_name).asset_layer.selected_asset_keys)

    def phase(job_name: str | None, ops: dict | None = None, tags: dict[str, str] | None = None,
              skip: tuple[str, ...] = (), assets: set[dg.AssetKey] | None = None) -> dg.ExecuteInProcessResult:
        """A run of the job, or (None) of the asset job over `assets`, as "Materialize selected" runs them."""
        job = defs.resolve_job_def(job_name) if job_name else defs.resolve_implicit_global_asset_job_def()
        keys = job.asset_layer.selected_asset_keys
        kept = assets if assets is not None else {key for key in keys if key.path[-1] not in skip}
        return execute_job(instance, job, {**config, **({"ops": ops} if ops else {})}, {**hermes_tags, **(tags or {})},
                           assets=kept if kept != keys else None)

    if args.plan_only:
        planned = phase(plan_job_name(run))
        if not planned.success:
            raise RecipeError(first_error(planned))
        print(pipeline.plan(recipe, paths).describe())
        save_settled(paths, Path(recipe.dataset_file), instance_files, Printed([], []), scope=PLAN)
        return 0
    ahead = pipeline.forecast(recipe, paths, dataset)  # the batches the planning will make, and the pending ones
    gc.enable()  # off for the start-up (cli._tuned_gc): the samples and the outputs make and drop cycles
    pending = ahead.partitions
    if pending and recipe.endpoint_preflight:
        from hermes_core.endpoints.model_client import preflight  # aiohttp: not for a plan or an empty resume

        try:
            preflight(recipe.with_timeouts(endpoint))  # before Dagster: a bad endpoint is one line, not a failed run
        except EndpointConfigError as exc:
            print(f"error: {exc}. No sample was sent; fix it and run the same command.", file=sys.stderr)
            return 2
    raw_ok = True
    if pending:
        register_partitions(instance, recipe, ahead)  # the run's partition range must exist when it is made
        wait_for_slot(instance, MODEL_POOL)  # Ctrl-C while waiting: KeyboardInterrupt, nothing was spent
        # The planning and the samples in one run: a run of its own for the planning cost ~0.3 s of
        # every command's start-up. A planning step that fails still stops the samples (Dagster skips
        # the steps after it), so nothing is sent.
        raw_step = f"{run}__raw_trajectories"
        raw = phase(None, assets=assets_of(plan_job_name(run)) | assets_of(raw_job_name(run)),
                    ops={raw_step: {"config": {"show_progress": True, "verbose": args.verbose}}},
                    tags={"dagster/asset_partition_range_start": pending[0],
                          "dagster/asset_partition_range_end": pending[-1]})
        if not raw.success and not step_ran(raw, raw_step):
            raise RecipeError(first_error(raw))  # the planning failed
        raw_ok = raw.success
        if not raw_ok and full_disk(raw):
            print(f"\nerror: {first_error(raw)}. The run stopped: the samples recorded before it are kept, the "
                  "ones in flight were not recorded and will run again. Free space there, then run the same "
                  "command to resume.", file=sys.stderr)
            return 2  # the outputs would not fit either
        if not raw_ok:
            print(f"\n{first_error(raw)}", file=sys.stderr)
    else:
        planned = phase(plan_job_name(run))
        if not planned.success:
            raise RecipeError(first_error(planned))
        print("nothing to run: every sample already has a final record", file=sys.stderr)
    # The CLI stays free of pandas and datasets (~1 s and more to import): the samples table and the exports
    # are built from the UI or by automation (`hermes-foundry export` for the exports).
    final = phase(finalize_job_name(run), ops=progress_ops(recipe), skip=("samples", *EXPORT_NAMES))
    check_lines = format_check_results(final)
    for line in check_lines:
        print(line, file=sys.stderr)
    if blocked := blocking_failures(final):  # they stopped the steps after filtered_trajectories
        print(f"error: blocking check(s) failed: {', '.join(blocked)}; statistics and the exports were not "
              "built. Fix trajectories.jsonl or the plan, then run the same command.", file=sys.stderr)
        return 1
    if not final.success:
        raise RecipeError(first_error(final))
    print(pipeline.summary(paths))
    after_summary = compression_summary(recipe, paths)
    for line in after_summary:
        print(line)
    stopped = pipeline.last_stop(paths) if pending else None
    if is_config_error(stopped):
        print(f"\nerror: {stopped}. The run stopped, as every later sample would fail the same way; fix it and "
              "run the same command to resume.", file=sys.stderr)
        return 2
    if stopped:
        print(f"\nstopped early: {stopped}. Samples in flight finished and are saved; run the same command to "
              "resume (raise the budget first if it was one).", file=sys.stderr)
        return 130 if interrupt.reason else 3
    if raw_ok:
        save_settled(paths, Path(recipe.dataset_file), instance_files, Printed(check_lines, after_summary))
    return 0 if raw_ok else 1
