"""The steps of a batch run, as plain functions over a run folder (the Dagster assets call these).

Run folder `data/<run_name>/`: recipe.json, prompts.jsonl (validated, keyed samples),
assignments.jsonl (toolsets per sample), batches.json (plan), raw/<partition>.jsonl (ledger),
invocations.jsonl (wall time of each raw phase), trajectories.jsonl, statistics.json, checkpoint.json.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from hermes_core.config import Endpoint
from hermes_core.batch.dataset import Dataset, Sample
from hermes_core.batch.prompt_table import keying, read_samples, run_dataset, save_table, tables
from hermes_core.batch.run_paths import RunPaths
from hermes_core.tools.distributions import sample_toolsets
from hermes_core.fileio import append_record, atomic_write_json, atomic_write_jsonl, read_jsonl
from hermes_core.formats.filters import Disposition
from hermes_core.batch.ledger import Batch, BatchPlan, Ledger
from hermes_core.batch.ledgers import check_one_ledger, open_ledger
from hermes_core.batch.recipe import Recipe, RecipeError, load_hermes_text
from hermes_core.batch.records import RunContext, SampleJob
from hermes_core.batch.workers import WorkerFailed
from hermes_core.sandbox import SandboxBackend, SandboxSettings, get_backend
from hermes_core.endpoints import SIMULATED_MODEL_ID
from hermes_core.endpoints.errors import is_config_error
from hermes_core.batch.stats import compute_statistics, format_summary
from hermes_core.batch.stopping import StopRequest, interrupt
from hermes_core.batch.writer_lock import holding


class PreflightError(RuntimeError):
    """Images of pending samples that the sandbox backend cannot run; nothing was spent."""


def load_prompts(recipe: Recipe, paths: RunPaths) -> Dataset:
    """Validate and key the dataset; save the sample table for the downstream steps (`prompt_table`:
    a table saved from the same unchanged file and keying is kept as it is)."""
    check_one_ledger(paths.root)
    keyed_with = keying(recipe)
    dataset = run_dataset(recipe, paths, keyed_with)
    save_table(paths, dataset, keyed_with)
    return dataset


def read_assignments(paths: RunPaths) -> list[dict[str, Any]]:
    """Each sample's drawn toolsets: sample_key, prompt_index, toolsets, toolset_seed."""
    return tables.get(paths.assignments, lambda: list(read_jsonl(paths.assignments)))


def assign_toolsets(recipe: Recipe, paths: RunPaths) -> tuple[list[dict[str, Any]], list[Batch]]:
    """Draw each sample's toolsets (seeded by run seed + sample key), then batch the samples that
    are neither done nor already in a batch. Returns the assignments and the new batches."""
    distribution = recipe.load_distribution()
    # A sample key covers the recipe fingerprint (distribution and seed), so an earlier draw of the
    # same key is this draw: reuse it (seeding an RNG per sample is most of this step's cost).
    samples = read_samples(paths)
    table = read_assignments(paths) if paths.assignments.is_file() else []
    if not _same_samples(table, samples):  # else the table on disk is this one: neither rebuilt nor rewritten
        earlier = {a["sample_key"]: a for a in table}
        table = []
        for sample in samples:
            drawn = earlier.get(sample.sample_key)
            toolsets, seed = (drawn["toolsets"], drawn["toolset_seed"]) if drawn else \
                sample_toolsets(distribution, recipe.seed, sample.sample_key)
            table.append({"sample_key": sample.sample_key, "prompt_index": sample.prompt_index,
                          "toolsets": toolsets, "toolset_seed": seed})
        atomic_write_jsonl(paths.assignments, table)
    else:  # its mtime after dataset.json's is what tells a finished planning (sensors.planned_sha256)
        os.utime(paths.assignments)
    tables.put(paths.assignments, table)
    assignments = table
    ledger = open_ledger(paths.raw)
    pending = [a["sample_key"] for a in assignments if not ledger.is_done(a["sample_key"])]
    return assignments, BatchPlan(paths.batches).assign(pending, recipe.batch_size)


def _same_samples(assignments: list[dict[str, Any]], samples: list[Sample]) -> bool:
    """Whether a toolset table lists exactly these samples, in order and at the same indexes."""
    return len(assignments) == len(samples) and all(
        a["sample_key"] == s.sample_key and a["prompt_index"] == s.prompt_index for a, s in zip(assignments, samples))


def backend_default_image(backend: SandboxBackend) -> str | None:
    """The image a row without one runs in on `backend` (SandboxSettings.default_image), if any."""
    settings = getattr(backend, "settings", None)
    return settings.default_image if settings is not None else None


def sandbox_backend(recipe: Recipe) -> SandboxBackend:
    """The run's backend: the recipe's choice, else $HERMES_TERMINAL_BACKEND, else local (bubblewrap);
    limits from HERMES_SANDBOX_*; sandboxes labelled with the run name."""
    return get_backend(recipe.sandbox_backend, SandboxSettings.from_env(run_name=recipe.run_name))


@dataclass(frozen=True)
class Plan:
    """What a run still has to do: its pending batches and how many samples they hold."""

    samples: int  # in the dataset as loaded now
    pending_samples: int  # of those, without a final record
    partitions: list[str]  # batches holding at least one pending sample
    batches: int  # every batch of the run, past datasets included

    def describe(self) -> str:
        return (f"plan: {self.samples} samples, {self.pending_samples} without a final record, in "
                f"{len(self.partitions)} of {self.batches} batches; nothing was sent")


def plan(recipe: Recipe, paths: RunPaths) -> Plan:
    """Batches that still have samples of the current dataset without a final record."""
    ledger = open_ledger(paths.raw)
    current = {a["sample_key"] for a in read_assignments(paths)}
    pending = {key for key in current if not ledger.is_done(key)}
    batches = BatchPlan(paths.batches).batches
    partitions = [batch.key for batch in batches if not pending.isdisjoint(batch.members)]
    return Plan(len(current), len(pending), partitions, len(batches))


@dataclass(frozen=True)
class Forecast:
    """What planning the dataset as it is now would leave to run; computed without writing anything."""

    partitions: list[str]  # batches with pending samples, planned ones first, then the ones planning would add
    new_partitions: list[str]  # of those, the batches planning would add
    pending_samples: int
    planned: list[str]  # every batch planned so far, pending or not


def forecast(recipe: Recipe, paths: RunPaths, dataset: Dataset | None = None) -> Forecast:
    """`plan` after a planning of the current dataset (`dataset`, when loaded already), without doing
    it: the batch keys are those `assign_toolsets` will create (same samples, same order, same
    numbering), so a scheduler can register the partitions and request them together with the planning."""
    dataset = dataset or run_dataset(recipe, paths)
    ledger = open_ledger(paths.raw)
    pending = [sample.sample_key for sample in dataset.samples if not ledger.is_done(sample.sample_key)]
    batches = BatchPlan(paths.batches)
    new = [batch.key for batch in batches.propose(pending, recipe.batch_size)]
    waiting = set(pending)
    planned = [batch.key for batch in batches.batches if not waiting.isdisjoint(batch.members)]
    return Forecast(planned + new, new, len(pending), [batch.key for batch in batches.batches])


@dataclass
class BatchOutcome:
    partition_key: str
    run: int = 0
    skipped: int = 0
    kept: int = 0
    discarded: int = 0
    failed_retryable: int = 0
    failed_terminal: int = 0
    api_calls: int = 0
    total_tokens: int = 0
    sandboxes_created: int = 0
    sandboxes_failed: int = 0
    wall_seconds: float = 0.0  # from the start of the invocation to this batch's last record


def run_partitions(recipe: Recipe, paths: RunPaths, endpoint: Endpoint, partition_keys: list[str], *args: Any,
                   **kwargs: Any) -> tuple[dict[str, BatchOutcome], str | None]:
    """`_run_partitions` holding the run's writer lock (`writer_lock.py`) throughout: the one batch, or
    the whole run for several. If another process holds any of it, RunBusy names it before anything is
    sent; a second writer would pay for the same samples again. In this process's hold of the whole
    run (the CLI's) it only counts."""
    with holding(paths.root, partition_keys if len(partition_keys) == 1 else None):
        return _run_partitions(recipe, paths, endpoint, partition_keys, *args, **kwargs)


def _run_partitions(
    recipe: Recipe,
    paths: RunPaths,
    endpoint: Endpoint,
    partition_keys: list[str],
    dagster_run_id: str | None,
    on_start: Callable[[int], None] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    on_batch_done: Callable[[BatchOutcome], None] | None = None,
) -> tuple[dict[str, BatchOutcome], str | None]:
    """Run every sample of the given batches that has no final record yet, in one worker pool.
    `on_batch_done` is called as each batch's last sample finishes (at once for batches with
    nothing to run), so its partition can be recorded while the others still run. Returns the
    outcomes and why the run stopped early (a signal or a budget: later samples did not start), if it did."""
    # The model client and the agent (aiohttp: ~0.1 s to import) only where samples run: planning needs neither.
    from hermes_core.batch.runner import run_jobs
    from hermes_core.endpoints.model_client import preflight

    started = time.time()
    check_one_ledger(paths.root)
    plan, ledger = BatchPlan(paths.batches), open_ledger(paths.raw)
    samples = {s.sample_key: s for s in read_samples(paths)}
    drawn = {a["sample_key"]: a for a in read_assignments(paths)}
    unplanned = [key for key in partition_keys if key not in {batch.key for batch in plan.batches}]
    if unplanned:  # registered ahead of planning (the batches sensor): planning has not run since
        raise RecipeError(f"batch(es) {', '.join(unplanned)} are not planned yet: nothing was sent; run the "
                          "planning first (materialize toolset_assignments, or the whole group)")
    outcomes = {key: BatchOutcome(key) for key in partition_keys}
    jobs = []
    for key in partition_keys:
        batch = plan.get(key)
        for member in batch.members:
            if member not in samples:
                continue  # removed from the dataset since it was batched
            if ledger.is_done(member):
                outcomes[key].skipped += 1
                continue
            draw = drawn[member]
            jobs.append(SampleJob(samples[member], draw["toolsets"], draw["toolset_seed"], key, batch.number,
                                  ledger.attempts(member) + 1))
    ctx = RunContext(recipe.run_name, recipe.model, recipe.distribution, dagster_run_id, recipe.filters,
                     recipe.max_attempts, recipe.fingerprint(), json.loads(paths.dataset.read_text())["sha256"],
                     recipe.price(), load_hermes_text(paths.root, recipe))
    remaining = {key: 0 for key in partition_keys}
    for job in jobs:
        remaining[job.partition_key] += 1

    early_stop = StopRequest()  # a budget, or an endpoint that refuses the run's configuration

    def check_budget() -> None:
        if reason := recipe.budget.exceeded(ledger.spent):
            early_stop.request(reason)

    def record(results: list[dict[str, Any]]) -> None:
        """Records that finished together: written durably at once (`Ledger.append_many`), then counted."""
        ledger.append_many([(result["partition_key"], result) for result in results])
        for result in results:
            count(result)

    def count(result: dict[str, Any]) -> None:
        check_budget()  # spent counts every attempt in the ledger: a resume counts nothing twice
        if is_config_error(result.get("error")):
            early_stop.request(result["error"])  # every later sample would fail the same way
        outcome = outcomes[result["partition_key"]]
        outcome.run += 1
        outcome.wall_seconds = time.time() - started
        outcome.api_calls += result["api_calls"]
        outcome.total_tokens += result["usage"]["total_tokens"]
        outcome.sandboxes_created += bool(result["sandbox_created"])
        outcome.sandboxes_failed += bool(result["sandbox_failed"])
        disposition = result["disposition"]
        if disposition in (Disposition.KEPT, Disposition.FAILED_RETRYABLE, Disposition.FAILED_TERMINAL):
            setattr(outcome, disposition, getattr(outcome, disposition) + 1)
        else:
            outcome.discarded += 1
        if on_record:
            on_record(result)
        remaining[result["partition_key"]] -= 1
        if on_batch_done and not remaining[result["partition_key"]]:
            on_batch_done(outcome)

    # Batches with nothing to run are reported first: a pre-flight below that fails (the endpoint is
    # down) must not leave finished batches unreported, which Dagster would paint failed with the run.
    for key in partition_keys:
        if on_batch_done and not remaining[key]:
            on_batch_done(outcomes[key])
    backend = sandbox_backend(recipe)
    reaped = backend.reap() if jobs else 0
    images: dict[str, list[int]] = {}  # image -> the dataset lines naming it, for the refusal message
    for job in jobs:
        if image := job.sample.image or backend_default_image(backend):  # rows without one get the default
            images.setdefault(image, []).append(job.sample.line)
    problems = backend.preflight(images)
    if problems:
        raise PreflightError(
            f"sandbox pre-flight failed on the {backend.name} backend; nothing was run:\n  "
            + "\n  ".join(problems)
        )
    endpoint = recipe.with_timeouts(endpoint)
    if jobs and recipe.endpoint_preflight:
        preflight(endpoint)  # a wrong key, URL or model stops the run here, before anything is spent
    if on_start:
        on_start(len(jobs))
    check_budget()
    failure: WorkerFailed | None = None
    with backend:  # frees the sandbox slots it keeps between samples
        try:
            run_jobs(jobs, recipe, endpoint, ctx, backend, record, stop=lambda: interrupt.reason or early_stop.reason)
        except WorkerFailed as exc:  # the others' samples are recorded: account for the invocation, then raise
            failure = exc
    for key in partition_keys:
        ledger.compact(key)  # on object storage: one object to read per batch instead of one per sample
    samples_run = sum(o.run for o in outcomes.values())
    stopped = (interrupt.reason or early_stop.reason) if samples_run < len(jobs) else None
    append_record(paths.invocations, {"started": started, "finished": time.time(), "samples": len(jobs),
                                       "samples_run": samples_run, "stopped": stopped,
                                       "reaped_leftovers": reaped, "sandbox_backend": backend.name,
                                       "dagster_run_id": dagster_run_id})
    if failure:
        raise failure
    return outcomes, stopped


def current_records(paths: RunPaths, ledger: Ledger | None = None) -> Iterator[tuple[Sample, dict[str, Any]]]:
    """(sample, its latest ledger record) for every sample of the dataset as loaded now that has a
    record, in prompt order: what every merged output is built from."""
    ledger = open_ledger(paths.raw) if ledger is None else ledger
    samples = {sample.sample_key: sample for sample in read_samples(paths)}
    for key, record in ledger.records(samples):
        yield samples[key], record


def write_trajectories(paths: RunPaths) -> dict[str, int]:
    """Merge kept rows of the current dataset in prompt order, one per sample key; write the
    final file and the checkpoint atomically."""
    ledger = open_ledger(paths.raw)
    finished = [s for s in read_samples(paths) if ledger.is_done(s.sample_key)]
    done = [s.prompt_index for s in finished]
    kept = {s.sample_key: s for s in finished if ledger.latest[s.sample_key]["disposition"] == Disposition.KEPT}
    rows = ({**record["row"], "prompt_index": kept[key].prompt_index} for key, record in ledger.records(kept))
    written = atomic_write_jsonl(paths.trajectories, rows)
    atomic_write_json(paths.checkpoint, {
        "run_name": paths.root.name,
        "completed_prompts": sorted(done),
        "batch_stats": dict(sorted(ledger.records_per_partition.items())),
        "last_updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    return {"kept": written, "done": len(done)}


def write_statistics(recipe: Recipe, paths: RunPaths) -> dict[str, Any]:
    dataset_info = json.loads(paths.dataset.read_text())
    toolsets = {a["sample_key"]: a["toolsets"] for a in read_assignments(paths)}
    invocations = read_invocations(paths)
    stats = compute_statistics(
        recipe, toolsets, open_ledger(paths.raw),
        invalid_input_lines=len(dataset_info["invalid_lines"]),
        total_batches=len(BatchPlan(paths.batches).batches),
        duration_seconds=sum(i["finished"] - i["started"] for i in invocations),
        reaped_leftovers=sum(i.get("reaped_leftovers", 0) for i in invocations),
        # Invocations recorded before the field existed say nothing: the recipe's choice then.
        sandbox_backend=(invocations[-1] if invocations else {}).get("sandbox_backend") or recipe.sandbox_backend or "local",
    )
    atomic_write_json(paths.statistics, stats)
    return stats


def read_invocations(paths: RunPaths) -> list[dict[str, Any]]:
    """The records of `invocations.jsonl` (a torn or damaged line reported and skipped)."""
    return list(read_jsonl(paths.invocations)) if paths.invocations.is_file() else []


def last_stop(paths: RunPaths) -> str | None:
    """Why the latest invocation stopped early (a signal, a budget), or None if it did not."""
    invocations = read_invocations(paths)
    return invocations[-1].get("stopped") if invocations else None


def read_statistics(paths: RunPaths) -> dict[str, Any]:
    return json.loads(paths.statistics.read_text())


def summary(paths: RunPaths) -> str:
    """What hermes-batch prints at its end: the run's statistics and where its outputs are."""
    outputs = {"trajectories": str(paths.trajectories), "statistics": str(paths.statistics),
               "raw batches": str(paths.raw), "checkpoint": str(paths.checkpoint)}
    return format_summary(read_statistics(paths), outputs, simulated=served_by_simulator(paths))


def served_by_simulator(paths: RunPaths) -> bool:
    """Whether any sample of the run was answered by the simulated endpoint (labelled as such)."""
    return any(SIMULATED_MODEL_ID in (record.get("served_model") or "") for record in open_ledger(paths.raw).latest.values())
