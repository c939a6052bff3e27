"""Per-row `compression_metrics` and the run's aggregate metrics.

Both carry the original trajectory_compressor's keys (hermes-agent: `tokens_saved`,
`compression_region`, `was_compressed`, ... per row; `summary`, `turns`, `averages`,
`summarization`, `processing` in the aggregate file) next to this project's own (`compressed`,
`skipped_reason`, `span`, ...; `counts`, `failures`, ...), so tools written for either read it.
Token counts are this project's counter's (see tokens.py), not the original's tokenizer's.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime
from typing import Any


def row_metrics(original: int, original_turns: int, target: int, started: float, *,
                compressed_tokens: int | None = None, compressed_turns: int | None = None,
                span: tuple[int, int] | None = None, summary_tokens: int = 0, reason: str | None = None,
                calls: int = 0, errors: int = 0) -> dict[str, Any]:
    """One row's `compression_metrics`; the row was compressed iff `compressed_tokens` is given.
    `still_over_limit`/`still_over_budget` are about the row as written."""
    done = compressed_tokens is not None
    final = compressed_tokens if done else original
    turns_after = compressed_turns if done and compressed_turns is not None else original_turns
    region = span if done else None
    return {
        # the original's keys, with its meanings
        "original_tokens": original,
        "compressed_tokens": final,
        "tokens_saved": original - final,
        "compression_ratio": round(final / max(original, 1), 4),
        "original_turns": original_turns,
        "compressed_turns": turns_after,
        "turns_removed": original_turns - turns_after,
        "compression_region": {"start_idx": region[0] if region else -1, "end_idx": region[1] if region else -1,
                               "turns_count": region[1] - region[0] if region else 0},
        "was_compressed": done,
        "still_over_limit": final > target,
        "skipped_under_target": reason == "under_budget",
        "summarization_api_calls": calls,
        "summarization_errors": errors,
        # this project's keys
        "compressed": done,
        "still_over_budget": final > target,
        "skipped_reason": reason,
        "summary_tokens": summary_tokens,
        "duration_s": round(time.monotonic() - started, 3),
        "span": list(region) if region else None,
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def aggregate(results: list[tuple[str, int, dict[str, Any]]], target: int, *, dropped: int,
              started_at: datetime, ended_at: datetime, duration_s: float) -> dict[str, Any]:
    """Run totals from (file name, line, row metrics); every count and total is a sum of row metrics."""
    metrics = [m for _, _, m in results]
    done = [m for m in metrics if m["compressed"]]
    before, after = sum(m["original_tokens"] for m in metrics), sum(m["compressed_tokens"] for m in metrics)
    failures = [{"file": name, "line": line, "reason": m["skipped_reason"]} for name, line, m in results
                if str(m["skipped_reason"]).startswith("summary_failed")]
    calls, errors = sum(m["summarization_api_calls"] for m in metrics), sum(m["summarization_errors"] for m in metrics)
    turns_before, turns_after = sum(m["original_turns"] for m in metrics), sum(m["compressed_turns"] for m in metrics)
    return {
        "counts": {
            "rows": len(metrics),
            "over_budget": sum(m["original_tokens"] > target for m in metrics),
            "compressed": len(done),
            "still_over_budget": sum(m["still_over_budget"] for m in metrics),
            "failed": len(failures),
            "skipped": dict(Counter(str(m["skipped_reason"]).split(":")[0] for m in metrics
                                    if m["skipped_reason"]).most_common()),
            "dropped_over_limit": dropped,  # save_over_limit: false
        },
        "tokens": {
            "original": before, "compressed": after, "saved": before - after,
            "ratio": round(after / before, 4) if before else 1.0,
            "summary": sum(m["summary_tokens"] for m in metrics),
            # the original's names for the same totals
            "total_before": before, "total_after": after, "total_saved": before - after,
            "overall_compression_ratio": round(after / max(before, 1), 4),
        },
        "turns_removed": sum(m["turns_removed"] for m in metrics),
        "failures": failures,
        # the original's aggregate sections
        "summary": {
            "total_trajectories": len(metrics),
            "trajectories_compressed": len(done),
            "trajectories_skipped_under_target": sum(m["skipped_under_target"] for m in metrics),
            "trajectories_still_over_limit": sum(m["still_over_limit"] for m in metrics),
            "trajectories_failed": len(failures),
            "compression_rate": round(len(done) / max(len(metrics), 1), 4),
        },
        "turns": {"total_before": turns_before, "total_after": turns_after, "total_removed": turns_before - turns_after},
        "averages": {
            "avg_compression_ratio": round(_mean([m["compression_ratio"] for m in done]) if done else 1.0, 4),
            "avg_tokens_saved_per_compressed": round(_mean([m["tokens_saved"] for m in done]), 1),
            "avg_turns_removed_per_compressed": round(_mean([m["turns_removed"] for m in done]), 2),
        },
        "summarization": {"total_api_calls": calls, "total_errors": errors,
                          "success_rate": round(1 - errors / max(calls, 1), 4)},
        "processing": {"start_time": started_at.isoformat(), "end_time": ended_at.isoformat(),
                       "duration_seconds": round(duration_s, 2)},
    }
