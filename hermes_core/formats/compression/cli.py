"""`hermes-compress` and `compress_file`: compress every over-budget row of a trajectories file.

Rows are read whole and validated before any model call; summaries run concurrently (one shared
HTTP client, `concurrency` calls at once); the output and the aggregate metrics are written
atomically, and the output keeps the input's row order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO


from hermes_core.formats.compression.compressor import CompressionConfig, Summariser, SummaryCache, compress_row
from hermes_core.formats.compression.tokens import APPROXIMATION, TokenCounter, load_counter
from hermes_core.config import Endpoint
from hermes_core.fileio import atomic_write_json, atomic_write_text
from hermes_core.endpoints.model_client import ModelClient, http_session

METRICS_FILE = "compression_metrics.json"
CACHE_FILE = "compression_summaries.jsonl"


class CompressionInputError(ValueError):
    """The input file has lines that are not trajectory rows."""


def default_output(input_path: Path) -> Path:
    stem = input_path.name[: -len(".jsonl")] if input_path.name.endswith(".jsonl") else input_path.name
    return input_path.with_name(f"{stem}.compressed.jsonl")


def read_rows(path: Path) -> list[tuple[int, str, dict[str, Any]]]:
    """(line number, raw line, row) of every non-blank line; any invalid line refuses the file."""
    rows, bad = [], []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                bad.append(f"{number} (not JSON)")
                continue
            turns = row.get("conversations") if isinstance(row, dict) else None
            if not isinstance(turns, list) or not all(isinstance(t, dict) and isinstance(t.get("value"), str)
                                                      for t in turns):
                bad.append(f"{number} (no `conversations` list of {{from, value}} turns)")
                continue
            rows.append((number, line.rstrip("\r\n"), row))
    if bad:
        shown = ", ".join(bad[:20]) + (f" and {len(bad) - 20} more" if len(bad) > 20 else "")
        raise CompressionInputError(f"{path}: {len(bad)} invalid line(s): {shown}")
    return rows


def sampled_rows(count: int, percent: float | None, seed: int) -> set[int] | None:
    """Positions of the seeded random sample (None = all rows); same file + seed = same sample."""
    if percent is None:
        return None
    return set(random.Random(seed).sample(range(count), min(count, math.ceil(count * percent / 100))))


class RowProgress:
    """One status line (redrawn on a terminal, every few seconds in logs)."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.stream, self.done, self.compressed, self.failed = total, stream, 0, 0, 0
        self.started, self._last = time.monotonic(), 0.0
        self._tty = stream.isatty()

    def update(self, metrics: dict[str, Any]) -> None:
        self.done += 1
        self.compressed += metrics["compressed"]
        self.failed += str(metrics["skipped_reason"]).startswith("summary_failed")
        now = time.monotonic()
        if now - self._last >= (0.2 if self._tty else 5.0) or self.done == self.total:
            self._last = now
            line = (f"compress {self.done}/{self.total} rows | compressed {self.compressed} failed {self.failed} "
                    f"| {now - self.started:.0f}s")
            self.stream.write(("\r" + line + ("\n" if self.done == self.total else "")) if self._tty else line + "\n")
            self.stream.flush()


def aggregate(results: list[tuple[int, dict[str, Any]]], config: CompressionConfig) -> dict[str, Any]:
    """Run totals; every count and total is the sum of the per-row `compression_metrics`."""
    metrics = [m for _, m in results]
    original = sum(m["original_tokens"] for m in metrics)
    compressed = sum(m["compressed_tokens"] for m in metrics)
    failures = [{"line": line, "reason": m["skipped_reason"]} for line, m in results
                if str(m["skipped_reason"]).startswith("summary_failed")]
    return {
        "counts": {
            "rows": len(metrics),
            "over_budget": sum(m["original_tokens"] > config.target_max_tokens for m in metrics),
            "compressed": sum(m["compressed"] for m in metrics),
            "still_over_budget": sum(m["still_over_budget"] for m in metrics),
            "failed": len(failures),
            "skipped": dict(Counter(str(m["skipped_reason"]).split(":")[0] for m in metrics
                                    if m["skipped_reason"]).most_common()),
        },
        "tokens": {
            "original": original, "compressed": compressed, "saved": original - compressed,
            "ratio": round(compressed / original, 4) if original else 1.0,
            "summary": sum(m["summary_tokens"] for m in metrics),
        },
        "turns_removed": sum(m["turns_removed"] for m in metrics),
        "failures": failures,
    }


async def acompress_file(input_path: str | Path, output_path: str | Path | None = None, *,
                         config: CompressionConfig = CompressionConfig(), counter: TokenCounter | None = None,
                         endpoint: Endpoint | None = None, metrics_path: str | Path | None = None,
                         use_cache: bool = True, dry_run: bool = False,
                         progress: TextIO | None = None) -> dict[str, Any]:
    """Compress a trajectories file; returns the aggregate metrics (also written unless dry_run)."""
    started = time.monotonic()
    source = Path(input_path)
    output = Path(output_path) if output_path else default_output(source)
    metrics_file = Path(metrics_path) if metrics_path else output.parent / METRICS_FILE
    counter = counter or load_counter(None)
    if endpoint is None and not dry_run:
        raise ValueError("an endpoint is needed to summarise (only a dry run works without one)")
    rows = read_rows(source)
    sample = sampled_rows(len(rows), config.sample_percent, config.seed)
    bar = RowProgress(len(rows), progress) if progress and rows else None
    http = None if dry_run else http_session(config.timeout_s, connections=config.concurrency)
    summariser = None
    if http is not None and endpoint is not None:
        cache = SummaryCache(output.parent / CACHE_FILE if use_cache else None)
        summariser = Summariser(ModelClient(endpoint, http=http), config, cache)

    async def one(position: int, raw: str, row: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        result = await compress_row(raw, row, config, counter, summariser, sample is None or position in sample)
        if bar:
            bar.update(result[1])
        return result

    try:
        results = await asyncio.gather(*(one(i, raw, row) for i, (_, raw, row) in enumerate(rows)))
    finally:
        if http is not None:
            await http.close()
    report = {
        "input": str(source.resolve()),
        "output": None if dry_run else str(output.resolve()),
        "metrics_file": None if dry_run else str(metrics_file.resolve()),
        "dry_run": dry_run,  # a dry run costs every planned summary at summary_target_tokens
        "tokenizer": counter.describe(),
        "settings": asdict(config),
        "summariser": {"model": endpoint.model if endpoint else None, "base_url": endpoint.base_url if endpoint else None,
                       "calls": summariser.calls if summariser else 0,
                       "cache_hits": summariser.cache_hits if summariser else 0,
                       "prompt_tokens": summariser.prompt_tokens if summariser else 0,
                       "completion_tokens": summariser.completion_tokens if summariser else 0},
        **aggregate([(line, metrics) for (line, _, _), (_, metrics) in zip(rows, results)], config),
        "duration_s": round(time.monotonic() - started, 3),
        "completed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if not dry_run:
        atomic_write_text(output, "".join(line + "\n" for line, _ in results))
        atomic_write_json(metrics_file, report)
    return report


def compress_file(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Synchronous `acompress_file` (for the Dagster asset and scripts)."""
    return asyncio.run(acompress_file(*args, **kwargs))


def _parser() -> argparse.ArgumentParser:
    defaults = CompressionConfig()
    p = argparse.ArgumentParser(
        prog="hermes-compress",
        description=(
            "Fit trajectories into a token budget. For each row over --target_max_tokens, keep the first\n"
            "system/human/gpt/tool turns and the last N turns, and replace the smallest middle span that fits\n"
            "the budget (never splitting a tool call from its response) with ONE human turn\n"
            "'[CONTEXT SUMMARY]: ...' written by the summariser model. Rows under budget are copied unchanged.\n"
            "Every row gets `compression_metrics`; run totals go to compression_metrics.json next to the output."
        ),
        epilog=(
            "environment (flags win):\n  HERMES_BASE_URL, HERMES_API_KEY, HERMES_MODEL   the summariser endpoint "
            "(fallbacks OPENAI_BASE_URL, OPENAI_API_KEY)\n"
            f"token counts without --tokenizer are an estimate: {APPROXIMATION}\n"
            "exit status: 0 done, 1 some rows could not be summarised (kept unchanged), 2 bad input or settings"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--input", required=True, help="trajectories JSONL (e.g. data/<run>/trajectories.jsonl)")
    p.add_argument("--output", help="output JSONL (default <input>.compressed.jsonl)")
    p.add_argument("--target_max_tokens", type=int, default=defaults.target_max_tokens,
                   help=f"token budget per row (default {defaults.target_max_tokens})")
    p.add_argument("--tokenizer", help="local tokenizer.json (or a folder holding one) for exact counts; needs "
                   "the `tokenizers` package; never downloaded. Default: the approximate counter")
    p.add_argument("--summary_target_tokens", type=int, default=defaults.summary_target_tokens,
                   help=f"length asked of each summary (default {defaults.summary_target_tokens})")
    p.add_argument("--protect_last_n_turns", type=int, default=defaults.protect_last_n_turns,
                   help=f"last turns always kept verbatim (default {defaults.protect_last_n_turns})")
    p.add_argument("--sample_percent", type=float, help="compress only a seeded random sample of this %% of rows")
    p.add_argument("--seed", type=int, default=defaults.seed, help=f"seed of --sample_percent (default {defaults.seed})")
    p.add_argument("--dry_run", action="store_true", help="print what would be compressed; no model call, no file")
    p.add_argument("--base_url", help="summariser endpoint (OpenAI-compatible), default $HERMES_BASE_URL")
    p.add_argument("--api_key", help="API key (default $HERMES_API_KEY)")
    p.add_argument("--model", help="summariser model (default $HERMES_MODEL or hermes-sim)")
    p.add_argument("--concurrency", type=int, default=defaults.concurrency,
                   help=f"summaries requested at once (default {defaults.concurrency})")
    p.add_argument("--timeout", type=float, default=defaults.timeout_s,
                   help=f"seconds per trajectory, retries included (default {defaults.timeout_s:g})")
    p.add_argument("--max_retries", type=int, default=3, help="retries per summary on 429/5xx/timeouts (default 3)")
    p.add_argument("--metrics_file", help=f"aggregate metrics (default {METRICS_FILE} next to the output)")
    p.add_argument("--no_cache", action="store_true",
                   help=f"do not read or write {CACHE_FILE} (next to the output: summaries already paid for, "
                   "reused when the same span is summarised again)")
    return p


def _summary(report: dict[str, Any]) -> str:
    counts, tokens = report["counts"], report["tokens"]
    lines = [
        f"{'DRY RUN: would compress' if report['dry_run'] else 'compressed'} {counts['compressed']} of "
        f"{counts['rows']} row(s): {counts['over_budget']} over budget, {counts['still_over_budget']} still over "
        f"budget, {counts['failed']} failed",
        f"tokens {tokens['original']} -> {tokens['compressed']} (ratio {tokens['ratio']}, saved {tokens['saved']})",
        f"tokenizer: {report['tokenizer']['description']}",
    ]
    if not report["dry_run"]:
        lines += [f"output: {report['output']}", f"metrics: {report['metrics_file']}"]
    return "\n".join(lines)


def compress_main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = CompressionConfig(
            target_max_tokens=args.target_max_tokens, summary_target_tokens=args.summary_target_tokens,
            protect_last_n_turns=args.protect_last_n_turns, sample_percent=args.sample_percent, seed=args.seed,
            concurrency=args.concurrency, timeout_s=args.timeout)
        endpoint = None if args.dry_run else Endpoint.resolve(
            args.base_url, args.api_key, args.model, max_retries=args.max_retries, request_timeout_s=args.timeout)
        report = compress_file(args.input, args.output, config=config, counter=load_counter(args.tokenizer),
                               endpoint=endpoint, metrics_path=args.metrics_file, use_cache=not args.no_cache,
                               dry_run=args.dry_run, progress=sys.stderr)
    except (OSError, ValueError) as exc:  # incl. CompressionInputError, TokenizerError, a missing endpoint
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: no output written; summaries already made are cached for the next run", file=sys.stderr)
        return 130
    if args.dry_run:
        print(json.dumps(report, indent=2))
    print(_summary(report), file=sys.stderr if args.dry_run else sys.stdout)
    if report["counts"]["failed"]:
        print(f"{report['counts']['failed']} row(s) kept uncompressed after summariser failures; run the same "
              "command again to retry them (summaries already made are reused)", file=sys.stderr)
        return 1
    return 0
