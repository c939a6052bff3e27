"""`hermes-compress`: flags, the original compressor's `--config` file, and the run's summary line.

Precedence, for every setting: a command-line flag, else the `--config` file's key, else (only
with `--config`) the original's default, else this project's default. The summariser endpoint
also reads HERMES_BASE_URL / HERMES_API_KEY / HERMES_MODEL before the original's defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from hermes_core.config import Endpoint
from hermes_core.formats.compression.compressor import CompressionConfig
from hermes_core.formats.compression.files import CACHE_FILE, METRICS_FILE, OUTPUT_SUFFIX, compress_file
from hermes_core.formats.compression.settings import ConfigFile, ConfigFileError, load_config_file
from hermes_core.formats.compression.tokens import APPROXIMATION, TokenCounter, counter_for_name, load_counter

DEFAULTS = CompressionConfig()
# hermes-compress flag -> (CompressionConfig field, the original's `section.key` the flag overrides)
FLAG_KEYS = {
    "target_max_tokens": ("target_max_tokens", "compression.target_max_tokens"),
    "summary_target_tokens": ("summary_target_tokens", "compression.summary_target_tokens"),
    "protect_last_n_turns": ("protect_last_n_turns", "protected_turns.last_n_turns"),
    "concurrency": ("concurrency", "processing.max_concurrent_requests"),
    "timeout": ("timeout_s", "processing.per_trajectory_timeout"),
}
# CompressionConfig field -> the original's `section.key` (set only from the file)
FILE_ONLY = {
    "protect_first_system": "protected_turns.first_system", "protect_first_human": "protected_turns.first_human",
    "protect_first_gpt": "protected_turns.first_gpt", "protect_first_tool": "protected_turns.first_tool",
    "temperature": "summarization.temperature", "add_summary_notice": "output.add_summary_notice",
    "summary_notice_text": "output.summary_notice_text", "save_over_limit": "processing.save_over_limit",
    "per_trajectory_metrics": "metrics.per_trajectory",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hermes-compress",
        description=(
            "Fit trajectories into a token budget. For each row over --target_max_tokens, keep the first\n"
            "system/human/gpt/tool turns and the last N turns, and replace the smallest middle span that fits\n"
            "the budget (never splitting a tool call from its response) with ONE human turn\n"
            "'[CONTEXT SUMMARY]: ...' written by the summariser model; the system turn gets a short notice.\n"
            "Rows under budget are copied unchanged. Every row gets `compression_metrics`; run totals go to\n"
            "the metrics file (<output stem>_metrics.json, or compression_metrics.json in an output folder)."
        ),
        epilog=(
            "--config FILE takes the original trajectory_compressor's YAML (sections tokenizer, compression,\n"
            "protected_turns, summarization, output, processing, metrics); flags win over it.\n"
            "environment (flags and the file win):\n  HERMES_BASE_URL, HERMES_API_KEY, HERMES_MODEL   the summariser "
            "endpoint (fallbacks OPENAI_BASE_URL, OPENAI_API_KEY)\n"
            f"token counts without a tokenizer are an estimate: {APPROXIMATION}\n"
            "exit status: 0 done, 1 some rows could not be summarised (kept unchanged), 2 bad input or settings"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--input", required=True, help="trajectories JSONL, or a folder: each *.jsonl in it is compressed")
    p.add_argument("--output", help=f"output JSONL, or output folder for a folder input (default <input>{OUTPUT_SUFFIX}"
                   "[.jsonl], the suffix from output.output_suffix)")
    p.add_argument("--config", help="the original compressor's YAML settings file")
    p.add_argument("--target_max_tokens", type=int, help=f"token budget per row (default {DEFAULTS.target_max_tokens})")
    p.add_argument("--tokenizer", help="local tokenizer.json (or a folder holding one) for exact counts; needs "
                   "the `tokenizers` package; never downloaded. Default: tokenizer.name, else the approximate counter")
    p.add_argument("--summary_target_tokens", type=int,
                   help=f"length asked of each summary (default {DEFAULTS.summary_target_tokens})")
    p.add_argument("--protect_last_n_turns", type=int,
                   help=f"last turns always kept verbatim (default {DEFAULTS.protect_last_n_turns})")
    p.add_argument("--sample_percent", type=float, help="compress and write only a seeded random sample of this "
                   "%% of rows (per file of a folder)")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed, help=f"seed of --sample_percent (default {DEFAULTS.seed})")
    p.add_argument("--dry_run", action="store_true", help="print what would be compressed; no model call, no file")
    p.add_argument("--base_url", help="summariser endpoint (OpenAI-compatible), default summarization.base_url, "
                   "then $HERMES_BASE_URL")
    p.add_argument("--api_key", help="API key (default $<summarization.api_key_env>, then $HERMES_API_KEY)")
    p.add_argument("--model", help="summariser model (default summarization.model, then $HERMES_MODEL or hermes-sim)")
    p.add_argument("--concurrency", type=int, help=f"summaries requested at once (default {DEFAULTS.concurrency}; "
                   "50 with --config, as the original)")
    p.add_argument("--timeout", type=float, help=f"seconds per trajectory, retries included (default {DEFAULTS.timeout_s:g})")
    p.add_argument("--max_retries", type=int, help="retries per summary on 429/5xx/timeouts (default 3; with --config "
                   "summarization.max_retries counts attempts, so 3 there = 2 retries)")
    p.add_argument("--metrics_file", help="aggregate metrics file (default as described above)")
    p.add_argument("--no_cache", action="store_true",
                   help=f"do not read or write {CACHE_FILE} (next to the output: summaries already paid for, "
                   "reused when the same span is summarised again)")
    return p


def _config(args: argparse.Namespace, file: ConfigFile | None) -> CompressionConfig:
    """The compression settings: flags, else the file, else defaults."""
    values: dict[str, Any] = {"sample_percent": args.sample_percent, "seed": args.seed}
    for flag, (field, key) in FLAG_KEYS.items():
        chosen = getattr(args, flag)
        if chosen is None and file is not None:
            chosen = file.get(key)
        if chosen is not None:
            values[field] = chosen
    for field, key in FILE_ONLY.items():
        if file is not None and file.get(key) is not None:
            values[field] = file.get(key)
    return CompressionConfig(**values)


def _counter(args: argparse.Namespace, file: ConfigFile | None) -> TokenCounter:
    if args.tokenizer or file is None:
        return load_counter(args.tokenizer)
    try:
        return counter_for_name(file.get("tokenizer.name"))
    except ValueError as exc:
        raise file.error("tokenizer.name", str(exc)) from None


def _endpoint(args: argparse.Namespace, file: ConfigFile | None, timeout: float) -> Endpoint:
    """The summariser: flags, else the file's summarization keys, else HERMES_*, else the original's defaults."""
    env = os.environ
    if file is None:
        return Endpoint.resolve(args.base_url, args.api_key, args.model, request_timeout_s=timeout,
                                max_retries=3 if args.max_retries is None else args.max_retries)
    api_key = args.api_key
    key_env = file.get("summarization.api_key_env")
    if api_key is None:
        api_key = env.get(key_env)
        if api_key is None and "summarization.api_key_env" in file.values:
            raise file.error("summarization.api_key_env", f"the environment variable {key_env} is not set "
                             "(or pass --api_key)")
    base_url = args.base_url or file.values.get("summarization.base_url") or env.get("HERMES_BASE_URL") \
        or env.get("OPENAI_BASE_URL") or file.get("summarization.base_url")
    model = args.model or file.values.get("summarization.model") or env.get("HERMES_MODEL") \
        or file.get("summarization.model")
    retries = args.max_retries if args.max_retries is not None else file.get("summarization.max_retries") - 1
    return Endpoint.resolve(base_url, api_key, model, request_timeout_s=timeout, max_retries=retries,
                            backoff_base_s=float(file.get("summarization.retry_delay")))


def report_summary(report: dict[str, Any]) -> str:
    """The report in a few lines: rows compressed, tokens before and after, the tokenizer (and, unless
    a dry run, where the output and metrics went)."""
    counts, tokens = report["counts"], report["tokens"]
    lines = [
        f"{'DRY RUN: would compress' if report['dry_run'] else 'compressed'} {counts['compressed']} of "
        f"{counts['rows']} row(s): {counts['over_budget']} over budget, {counts['still_over_budget']} still over "
        f"budget, {counts['failed']} failed" + (f", {counts['dropped_over_limit']} left out (save_over_limit: false)"
                                                if counts["dropped_over_limit"] else ""),
        f"tokens {tokens['original']} -> {tokens['compressed']} (ratio {tokens['ratio']}, saved {tokens['saved']})",
        f"tokenizer: {report['tokenizer']['description']}",
    ]
    if not report["dry_run"]:
        lines += [f"output: {report['output']}", f"metrics: {report['metrics_file'] or 'off (metrics.enabled: false)'}"]
    return "\n".join(lines)


def compress_main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        file = load_config_file(args.config) if args.config else None
        config = _config(args, file)
        endpoint = None if args.dry_run else _endpoint(args, file, config.timeout_s)
        options: dict[str, Any] = {} if file is None else {
            "output_suffix": file.get("output.output_suffix"), "metrics_enabled": file.get("metrics.enabled"),
            "metrics_output_file": file.get("metrics.output_file", METRICS_FILE)}
        report = compress_file(args.input, args.output, config=config, counter=_counter(args, file),
                               endpoint=endpoint, metrics_path=args.metrics_file, use_cache=not args.no_cache,
                               dry_run=args.dry_run, progress=sys.stderr, **options)
    except (OSError, ValueError) as exc:  # incl. ConfigFileError, CompressionInputError, TokenizerError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: no output written; summaries already made are cached for the next run", file=sys.stderr)
        return 130
    if args.dry_run:
        print(json.dumps(report, indent=2))
    print(report_summary(report), file=sys.stderr if args.dry_run else sys.stdout)
    if report["counts"]["failed"]:
        print(f"{report['counts']['failed']} row(s) kept uncompressed after summariser failures; run the same "
              "command again to retry them (summaries already made are reused)", file=sys.stderr)
        return 1
    return 0


__all__ = ["ConfigFileError", "compress_main"]
