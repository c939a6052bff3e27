"""Run statistics (SPEC §9) over the whole run — every partition and every past invocation.

Statistics are sums over the per-sample rows (`sample_rows`), the rows of the auditors' pandas table
(`sample_table.py`): a notebook summing that table gets the numbers statistics.json and the UI show.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Iterable

from hermes_core.formats.filters import Disposition
from hermes_core.batch.ledger import Batch, Ledger
from hermes_core.batch.recipe import Recipe

DISPOSITIONS = (Disposition.KEPT, Disposition.DISCARDED_NO_REASONING, Disposition.DISCARDED_HALLUCINATED_TOOL, Disposition.DISCARDED_INCOMPLETE, Disposition.FAILED_RETRYABLE,
                Disposition.FAILED_TERMINAL)
FAILED = (Disposition.FAILED_RETRYABLE, Disposition.FAILED_TERMINAL)
REASONS_KEPT = 5  # the most common failure reasons in statistics.json


def _failure_reason(error: str | None) -> str:
    """A failed sample's error as one countable line."""
    return ((error or "").strip().splitlines() or ["no error recorded"])[0][:300]


def _rate(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def sample_rows(assignments: Iterable[dict[str, Any]], ledger: Ledger,
                batch_of: dict[str, Batch] | None = None) -> list[dict[str, Any]]:
    """One row per sample of the dataset as loaded now, in prompt order, from its latest ledger
    summary (no trajectory is read). `assignments` are the samples' draws (`sample_key`, `toolsets`,
    optionally `prompt_index`); `batch_of` the batch plan's member -> batch.

    A sample without a record has disposition None and zero counts. Spend (api calls, tokens, cost,
    sandboxes) is every attempt's of that sample, what it cost, so the rows sum to statistics.json's
    spend. `tool_stats` is the row's `{tool: {count, success, failure}}` (the table spreads it into one
    column per tool)."""
    rows = []
    batch_of = batch_of or {}
    for draw in assignments:
        key = draw["sample_key"]
        record = ledger.latest.get(key)
        batch = batch_of.get(key)
        spend = ledger.spent_on((key,))
        with_row = bool(record and record["has_row"])
        turns = record["reasoning_turns"] if with_row else (0, 0)
        rows.append({
            "sample_key": key,
            "prompt_index": draw.get("prompt_index", (record or {}).get("prompt_index")),
            "batch": batch.key if batch else (record or {}).get("partition_key"),
            "batch_num": batch.number if batch else None,
            "disposition": record["disposition"] if record else None,
            # ledgers from before attempts were recorded: count the failures, at least one try
            "attempts": (record.get("attempt") or max(ledger.attempts(key), 1)) if record else 0,
            "toolsets": draw["toolsets"],
            "toolsets_lost": (record or {}).get("toolsets_lost") or [],
            "api_calls": spend["api_calls"],
            **{name: spend[name] for name in ("prompt_tokens", "completion_tokens", "total_tokens")},
            "cost_usd": None if (record or {}).get("cost_usd") is None else round(spend["cost_usd"], 6),
            "sandbox_created": spend["sandboxes_created"],
            "sandbox_failed": spend["sandboxes_failed"],
            "assistant_turns": turns[0],
            "turns_with_reasoning": turns[1],
            "error": (record or {}).get("error"),
            "dagster_run_id": (record or {}).get("dagster_run_id"),
            "tool_stats": record["tool_stats"] if with_row else {},
        })
    return rows


def compute_statistics(
    recipe: Recipe,
    sample_toolsets: dict[str, list[str]],
    ledger: Ledger,
    *,
    invalid_input_lines: int,
    total_batches: int,
    duration_seconds: float,
    reaped_leftovers: int = 0,
    sandbox_backend: str = "local",
) -> dict[str, Any]:
    """`sample_toolsets` maps every sample key of the dataset as loaded now to its drawn toolsets.
    Counts and spend (api calls, tokens, sandboxes: every attempt) are sums over `sample_rows`, the
    dataset's samples. Samples of rows since deleted or edited are `orphaned`, with their own spend:
    paid for, but not in this dataset nor in its outputs."""
    rows = sample_rows(({"sample_key": key, "toolsets": toolsets} for key, toolsets in sample_toolsets.items()), ledger)
    recorded = [row for row in rows if row["disposition"] is not None]
    counts = Counter(row["disposition"] for row in recorded)
    tools: dict[str, dict[str, int]] = {}
    for row in recorded:
        for name, stat in row["tool_stats"].items():
            total = tools.setdefault(name, {"count": 0, "success": 0, "failure": 0})
            for key in total:
                total[key] += stat[key]
    turns = sum(row["assistant_turns"] for row in recorded)
    with_reasoning = sum(row["turns_with_reasoning"] for row in recorded)
    finished = sum(counts[d] for d in DISPOSITIONS if d != Disposition.FAILED_RETRYABLE)
    spend = ledger.spent_on(sample_toolsets)  # = the rows' sums
    orphans = [key for key in ledger.latest if key not in sample_toolsets]
    orphaned = ledger.spent_on(orphans)
    return {
        "run_name": recipe.run_name,
        "distribution": recipe.distribution,
        "model": recipe.model,
        "tool_call_mode": recipe.tool_call_mode,
        "total_prompts": len(rows),
        "total_batches": total_batches,
        "batch_size": recipe.batch_size,
        "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_seconds": round(duration_seconds, 3),
        "counts": {
            **{d: counts[d] for d in DISPOSITIONS},
            "invalid_input_lines": invalid_input_lines,
            "pending": len(rows) - len(recorded) + counts[Disposition.FAILED_RETRYABLE],
        },
        "tool_statistics": {
            name: {**s, "success_rate": _rate(s["success"], s["count"]), "failure_rate": _rate(s["failure"], s["count"])}
            for name, s in tools.items()
        },
        "reasoning_statistics": {
            "total_assistant_turns": turns,
            "turns_with_reasoning": with_reasoning,
            "turns_without_reasoning": turns - with_reasoning,
            "coverage_pct": _rate(with_reasoning, turns),
        },
        "toolset_statistics": dict(Counter(t for row in rows for t in row["toolsets"]).most_common()),
        "toolsets_lost_samples": sum(1 for row in recorded if row["toolsets_lost"]),
        "toolsets_lost": dict(Counter(t for row in recorded for t in row["toolsets_lost"]).most_common()),
        # Of the failed samples, most common first: the summary names the first.
        "failure_reasons": dict(Counter(_failure_reason(row["error"]) for row in recorded
                                        if row["disposition"] in FAILED).most_common(REASONS_KEPT)),
        "api_calls": spend["api_calls"],
        "usage": {k: spend[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
        "orphaned": {"samples": len(orphans), "api_calls": orphaned["api_calls"],
                     "total_tokens": orphaned["total_tokens"], "cost_usd": round(orphaned["cost_usd"], 6)},
        "sandbox": {
            "backend": sandbox_backend,
            "created": spend["sandboxes_created"],  # every attempt's sandbox, not only the latest
            "failed": spend["sandboxes_failed"],
            "reaped_leftovers": reaped_leftovers,
        },
        "throughput": {"samples_per_min": round(60.0 * finished / duration_seconds, 2) if duration_seconds else 0.0},
    }


def _count(number: int, one: str, many: str) -> str:
    """"1 batch", "3 batches"."""
    return f"{number} {one if number == 1 else many}"


def _lost_line(lost: dict[str, int], recorded: int) -> str:
    """Toolsets that samples drew but could not be offered: said, as the rows silently lack them."""
    drawn = ", ".join(f"{name} in {count}" for name, count in lost.items())
    return (f"  toolsets drawn but not offered, their backend not configured (docs/reference/tools.md): {drawn} "
            f"of {recorded} samples")


def format_summary(stats: dict[str, Any], outputs: dict[str, str], simulated: bool = False) -> str:
    """The console summary printed at the end of every CLI run."""
    lines = [f"Run {stats['run_name']!r}: model {stats['model']}"
             + ("  [SIMULATED model endpoint — not real model output]" if simulated else ""),
             f"  distribution {stats['distribution']}, {_count(stats['total_prompts'], 'prompt', 'prompts')} in "
             f"{_count(stats['total_batches'], 'batch', 'batches')} of ≤{stats['batch_size']}"
             + ("; tool calls through JSON-schema constrained replies" if stats.get("tool_call_mode") == "constrained"
                else ""), ""]
    table = sorted(stats["tool_statistics"].items(), key=lambda item: (-item[1]["count"], item[0]))
    used = [(name, s) for name, s in table if s["count"]]
    if used:
        lines.append(f"  {'tool':<22}{'count':>7}{'success':>9}{'failure':>9}{'success %':>11}")
        lines += [f"  {n:<22}{s['count']:>7}{s['success']:>9}{s['failure']:>9}{s['success_rate']:>10.1f}%" for n, s in used]
    else:
        lines.append("  no tool calls")
    reasoning = stats["reasoning_statistics"]
    counts = stats["counts"]
    failed = counts["failed_retryable"] + counts["failed_terminal"]
    # statistics.json files written before failure_reasons existed have none
    reason, count = next(iter((stats.get("failure_reasons") or {}).items()), (None, 0))
    lines += [
        "",
        f"  reasoning coverage: {reasoning['coverage_pct']:.1f}% of {reasoning['total_assistant_turns']} assistant turns",
        f"  kept {counts['kept']}; discarded: no reasoning {counts['discarded_no_reasoning']}, "
        f"hallucinated tool {counts['discarded_hallucinated_tool']}, incomplete {counts['discarded_incomplete']}",
        f"  failed: retryable {counts['failed_retryable']} (re-run the command to resume), "
        f"terminal {counts['failed_terminal']}; invalid input lines {counts['invalid_input_lines']}; "
        f"pending {counts['pending']}",
        *([f"  most common failure ({count} of {failed} failed samples): {reason}"] if reason else []),
        *([_lost_line(lost, sum(counts[d] for d in DISPOSITIONS))] if (lost := stats.get("toolsets_lost")) else []),
        f"  api calls {stats['api_calls']}, tokens {stats['usage']['total_tokens']}, "
        f"time {stats['duration_seconds']:.1f}s, {stats['throughput']['samples_per_min']} samples/min",
        "",
    ]
    lines += [f"  {label}: {path}" for label, path in outputs.items()]
    return "\n".join(lines)
