"""Trajectory compression (SPEC §10): fit over-budget rows into a token budget by replacing a middle
span with a `[CONTEXT SUMMARY]:` turn written by a summariser model.

- `compress_file` / `acompress_file`: a whole JSONL file or a folder of them (the `hermes-compress`
  CLI and the Dagster asset use these); `compress_main` is the console script, whose `--config`
  reads the original trajectory_compressor's YAML (`load_config_file`).
- `compress_row`, `plan_span`: one row, for library use and tests.
- `load_counter`: token counting, offline (a local tokenizer.json, or the stated approximation).
"""

from hermes_core.formats.compression.cli import compress_main, report_summary
from hermes_core.formats.compression.files import (
    CACHE_FILE,
    METRICS_FILE,
    OUTPUT_SUFFIX,
    CompressionInputError,
    acompress_file,
    compress_file,
    default_metrics,
    default_output,
)
from hermes_core.formats.compression.settings import ConfigFile, ConfigFileError, load_config_file
from hermes_core.formats.compression.compressor import (
    SUMMARY_NOTICE,
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
    counter_for_name,
    load_counter,
    turn_tokens,
)

__all__ = [
    "APPROXIMATION", "CACHE_FILE", "METRICS_FILE", "OUTPUT_SUFFIX", "SUMMARY_NOTICE", "SUMMARY_PREFIX",
    "TURN_OVERHEAD", "ApproximateCounter", "CompressionConfig", "CompressionInputError", "ConfigFile",
    "ConfigFileError", "Plan", "Summariser", "SummaryCache", "TokenCounter", "TokenizerError", "TokenizerFileCounter",
    "acompress_file", "compress_file", "compress_main", "compress_row", "counter_for_name", "default_metrics",
    "default_output", "load_config_file", "load_counter", "plan_span", "report_summary", "turn_tokens",
]
