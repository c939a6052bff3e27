"""Trajectory compression (SPEC §10): fit over-budget rows into a token budget by replacing a middle
span with a `[CONTEXT SUMMARY]:` turn written by a summariser model.

- `compress_file` / `acompress_file`: a whole JSONL file (the `hermes-compress` CLI and the
  Dagster asset use these); `compress_main` is the console script.
- `compress_row`, `plan_span`: one row, for library use and tests.
- `load_counter`: token counting, offline (a local tokenizer.json, or the stated approximation).
"""

from hermes_core.formats.compression.cli import (
    CACHE_FILE,
    METRICS_FILE,
    CompressionInputError,
    acompress_file,
    compress_file,
    compress_main,
    default_output,
)
from hermes_core.formats.compression.compressor import (
    SUMMARY_PREFIX,
    CompressionConfig,
    Plan,
    Summariser,
    SummaryCache,
    compress_row,
    plan_span,
)
from hermes_core.formats.compression.tokens import (
    APPROXIMATION,
    TURN_OVERHEAD,
    ApproximateCounter,
    TokenCounter,
    TokenizerError,
    TokenizerFileCounter,
    load_counter,
    turn_tokens,
)

__all__ = [
    "APPROXIMATION", "CACHE_FILE", "METRICS_FILE", "SUMMARY_PREFIX", "TURN_OVERHEAD", "ApproximateCounter",
    "CompressionConfig", "CompressionInputError", "Plan", "Summariser", "SummaryCache", "TokenCounter",
    "TokenizerError", "TokenizerFileCounter", "acompress_file", "compress_file", "compress_main", "compress_row",
    "default_output", "load_counter", "plan_span", "turn_tokens",
]
