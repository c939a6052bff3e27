"""`compress_file`: compress every over-budget row of a trajectories file, or of every `*.jsonl`
file of a directory (the original compressor's two input modes and output layout).

Rows are read whole and validated before any model call; summaries run concurrently (one shared
HTTP client, `concurrency` calls at once) across every file; outputs and the aggregate metrics are
written atomically, and each output keeps its input's row order. With `sample_percent` only the
sampled rows are compressed and written, drawn as the original draws them (same seed, same rows).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from hermes_core.config import Endpoint
from hermes_core.fileio import atomic_write_json, atomic_write_text
from hermes_core.formats.compression.compressor import CompressionConfig, Summariser, SummaryCache, compress_row
from hermes_core.formats.compression.metrics import aggregate
from hermes_core.formats.compression.tokens import TokenCounter, load_counter

METRICS_FILE = "compression_metrics.json"  # the original's `metrics.output_file` default
CACHE_FILE = "compression_summaries.jsonl"
OUTPUT_SUFFIX = "_compressed"  # the original's `output.output_suffix` default


class CompressionInputError(ValueError):
    """The input has lines that are not trajectory rows, or no rows to read."""


def default_output(input_path: Path, suffix: str = OUTPUT_SUFFIX) -> Path:
    """The original's naming: `<dir><suffix>/` beside a directory, `<stem><suffix>.jsonl` beside a file."""
    if input_path.is_dir():
        return input_path.with_name(input_path.name + suffix)
    return input_path.with_name(f"{input_path.stem}{suffix}.jsonl")


def default_metrics(output: Path, directory: bool, output_file: str = METRICS_FILE) -> Path:
    """The original's aggregate file: `output_file` inside an output directory, `<stem>_metrics.json`
    beside an output file."""
    return output / output_file if directory else output.with_name(f"{output.stem}_metrics.json")


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


def sample_positions(count: int, percent: float | None, rng: random.Random) -> list[int]:
    """Positions of the rows to compress, in file order: all of them, or the original's draw of
    max(1, int(count * percent / 100)) rows (one generator seeded once serves every file, as there)."""
    if percent is None:
        return list(range(count))
    return sorted(rng.sample(range(count), min(count, max(1, int(count * percent / 100)))))


@dataclass
class Source:
    """One input file, its output and the rows drawn from it."""

    input: Path
    output: Path
    rows: list[tuple[int, str, dict[str, Any]]]
    total: int


def plan_sources(source: Path, output: Path, config: CompressionConfig) -> list[Source]:
    """Read and validate every input file (sorted `*.jsonl` of a directory) before any call."""
    if not source.exists():
        raise CompressionInputError(f"{source}: no such file or directory")
    if output.resolve() == source.resolve():
        raise CompressionInputError(f"{source}: the output would replace the input; pass another --output")
    if source.is_dir():
        files = sorted(p for p in source.glob("*.jsonl") if p.is_file() and p.name != CACHE_FILE)
        if not files:
            raise CompressionInputError(f"{source}: no *.jsonl files in this directory")
        pairs = [(path, output / path.name) for path in files]
    else:
        pairs = [(source, output)]
    rng, sources = random.Random(config.seed), []
    for path, out in pairs:
        rows = read_rows(path)
        sources.append(Source(path, out, [rows[i] for i in sample_positions(len(rows), config.sample_percent, rng)],
                              len(rows)))
    return sources


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


async def acompress_file(input_path: str | Path, output_path: str | Path | None = None, *,
                         config: CompressionConfig = CompressionConfig(), counter: TokenCounter | None = None,
                         endpoint: Endpoint | None = None, metrics_path: str | Path | None = None,
                         use_cache: bool = True, dry_run: bool = False, progress: TextIO | None = None,
                         output_suffix: str = OUTPUT_SUFFIX, metrics_enabled: bool = True,
                         metrics_output_file: str = METRICS_FILE) -> dict[str, Any]:
    """Compress a trajectories file or directory; returns the aggregate metrics (also written to the
    metrics file unless dry_run or not metrics_enabled)."""
    started, started_at = time.monotonic(), datetime.now(timezone.utc)
    source = Path(input_path)
    directory = source.is_dir()
    output = Path(output_path) if output_path else default_output(source, output_suffix)
    metrics_file = Path(metrics_path) if metrics_path else default_metrics(output, directory, metrics_output_file)
    counter = counter or load_counter(None)
    if endpoint is None and not dry_run:
        raise ValueError("an endpoint is needed to summarise (only a dry run works without one)")
    sources = plan_sources(source, output, config)
    work = [(src, line, raw, row) for src in sources for line, raw, row in src.rows]
    bar = RowProgress(len(work), progress) if progress and work else None
    from hermes_core.endpoints.model_client import ModelClient, http_session  # aiohttp: not for the Dagster definitions

    http = None if dry_run else http_session(config.timeout_s, connections=config.concurrency)
    summariser = None
    if http is not None and endpoint is not None:
        cache = SummaryCache((output if directory else output.parent) / CACHE_FILE if use_cache else None)
        summariser = Summariser(ModelClient(endpoint, http=http), config, cache)

    async def one(raw: str, row: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        result = await compress_row(raw, row, config, counter, summariser)
        if bar:
            bar.update(result[1])
        return result

    try:
        results = await asyncio.gather(*(one(raw, row) for _, _, raw, row in work))
    finally:
        if http is not None:
            await http.close()
    # save_over_limit: false leaves out the rows that are still over budget as written
    kept = [config.save_over_limit or not metrics["still_over_budget"] for _, metrics in results]
    # Per file: rows read, rows drawn to compress (sample_percent), rows compressed, rows written
    # (None in a dry run: nothing is).
    files = [{"input": str(src.input.resolve()), "output": None if dry_run else str(src.output.resolve()),
              "rows": src.total, "sampled_rows": len(src.rows),
              "compressed_rows": sum(m["compressed"] for (s, *_), (_, m) in zip(work, results) if s is src),
              "written": None if dry_run else sum(k for (s, *_), k in zip(work, kept) if s is src)} for src in sources]
    report = {
        "input": str(source.resolve()),
        "output": None if dry_run else str(output.resolve()),
        "metrics_file": None if dry_run or not metrics_enabled else str(metrics_file.resolve()),
        "files": files,
        "dry_run": dry_run,  # a dry run costs every planned summary at summary_target_tokens
        "tokenizer": counter.describe(),
        "settings": asdict(config),
        "summariser": {"model": endpoint.model if endpoint else None, "base_url": endpoint.base_url if endpoint else None,
                       "calls": summariser.calls if summariser else 0,
                       "cache_hits": summariser.cache_hits if summariser else 0,
                       "prompt_tokens": summariser.prompt_tokens if summariser else 0,
                       "completion_tokens": summariser.completion_tokens if summariser else 0},
        **aggregate([(src.input.name, line, metrics) for (src, line, _, _), (_, metrics) in zip(work, results)],
                    config.target_max_tokens, dropped=kept.count(False), started_at=started_at, ended_at=datetime.now(timezone.utc),
                    duration_s=time.monotonic() - started),
        "duration_s": round(time.monotonic() - started, 3),
        "completed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if not dry_run:
        for src in sources:
            text = "".join(line + "\n" for (s, *_), (line, _), k in zip(work, results, kept) if s is src and k)
            atomic_write_text(src.output, text)
        if metrics_enabled:
            atomic_write_json(metrics_file, report)
    return report


def compress_file(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Synchronous `acompress_file` (for the Dagster asset and scripts)."""
    return asyncio.run(acompress_file(*args, **kwargs))
