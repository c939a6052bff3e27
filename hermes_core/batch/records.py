"""From an agent result to a ledger record and, when kept, a Hermes ShareGPT row (SPEC §8.1)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from hermes_core.batch.stopping import Price
from hermes_core.batch.code_versions import code_version
from hermes_core.batch.dataset import Sample
from hermes_core.formats.filters import Disposition, FilterSettings, classify
from hermes_core.formats.hermes_text import OWN_TEXT, HermesText
from hermes_core.formats.sharegpt import reasoning_coverage, to_conversations, tool_stats
from hermes_core.tools import registry


@dataclass(frozen=True)
class SampleJob:
    """One sample scheduled in one partition, with the toolsets it drew."""

    sample: Sample
    toolsets: list[str]
    toolset_seed: int
    partition_key: str
    batch_num: int
    attempt: int  # 1 for the first try


@dataclass(frozen=True)
class RunContext:
    run_name: str
    model: str
    distribution: str
    dagster_run_id: str | None
    filters: FilterSettings
    max_attempts: int
    recipe_fingerprint: str
    dataset_sha256: str
    price: Price | None = None  # the model's, to record each attempt's cost (budgets sum them)
    hermes_text: HermesText = OWN_TEXT  # the rows' prose: the original's with --hermes_agent_python


def build_record(job: SampleJob, result: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
    sample = job.sample
    base = {
        "sample_key": sample.sample_key,
        "prompt_index": sample.prompt_index,
        "partition_key": job.partition_key,
        "attempt": job.attempt,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dagster_run_id": ctx.dagster_run_id,
        "api_calls": result["api_calls"],
        "usage": result["usage"],
        "duration_s": result["duration_s"],
        "toolsets_sampled": job.toolsets,
        "toolsets_lost": [t for t in job.toolsets if t not in result["toolsets"]],
        "sandbox_created": result["sandbox_created"],
        "sandbox_failed": result["sandbox_failed"],
        "served_model": result["served_model"],
        "cost_usd": round(ctx.price.cost(result["usage"]), 8) if ctx.price else None,
        "stopped": result["stopped"],  # e.g. a sample budget ended it
    }
    if result["failed"]:
        terminal = job.attempt >= ctx.max_attempts
        return {**base, "disposition": Disposition.FAILED_TERMINAL if terminal else Disposition.FAILED_RETRYABLE, "error": result["error"],
                "row": None}
    messages = result["messages"]
    universe = registry.universe
    offered = result["tools_offered"]
    stats, errors = tool_stats(messages, universe)
    assistant_turns, with_reasoning = reasoning_coverage(messages)
    row = {
        "prompt_index": sample.prompt_index,
        "conversations": to_conversations(
            messages, ctx.hermes_text.definitions([registry.get(name).definition() for name in offered]), ctx.hermes_text),
        "metadata": {
            "batch_num": job.batch_num,
            "timestamp": base["finished_at"],
            "model": ctx.model,
            "served_model": result["served_model"],
            "tool_call_mode": result["tool_call_mode"],  # constrained: calls made through a JSON schema
            "run_name": ctx.run_name,
            "partition_key": job.partition_key,
            "dagster_run_id": ctx.dagster_run_id,
            "distribution": ctx.distribution,
            "code_version": code_version("raw_trajectories"),  # as its materialization says
            "recipe_fingerprint": ctx.recipe_fingerprint,
            "dataset_sha256": ctx.dataset_sha256,
            "input_metadata": sample.metadata,  # the dataset row's own `metadata`, untouched
        },
        "completed": result["completed"],
        "partial": result["partial"],
        "api_calls": result["api_calls"],
        "toolsets_used": job.toolsets,
        "tool_stats": stats,
        "tool_error_counts": errors,
        "sample_key": sample.sample_key,
        "tools_offered": offered,
        "toolset_seed": job.toolset_seed,
        "usage": result["usage"],
        "id": sample.id,
        "extra": sample.extra,
    }
    disposition = classify(
        messages, completed=result["completed"], universe=universe, offered=offered, settings=ctx.filters
    )
    # `messages`: the agent's OpenAI-format messages as exchanged (raw tool-call arguments and ids,
    # reasoning as its own field), so the OpenAI/TRL export is exact rather than re-parsed from `row`.
    return {**base, "disposition": disposition, "error": None, "reasoning_turns": [assistant_turns, with_reasoning],
            "row": row, "messages": messages}
