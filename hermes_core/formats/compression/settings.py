"""`hermes-compress --config FILE`: the settings file of the original trajectory compressor
(hermes-agent 0.19.0's `trajectory_compressor.py`), read with its sections, keys and defaults.

The file is checked whole before anything runs: an unknown section or key, a value of the wrong
type or out of range is one error naming the file, the line and `section.key`. Command-line flags
win over the file; keys the file leaves out take the original's defaults (except the prose of the
summary notice, whose default wording is ours). How each key is honoured is in the
conformance table (docs/explanation/conformance.md); the few that change nothing here are accepted and say so in their comment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

NUMBER = (int, float)
# section -> key -> accepted types (a bool is never taken for a number)
SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "tokenizer": {"name": (str,),
                  "trust_remote_code": (bool,)},  # no effect: only tokenizer.json files are read, no model code runs
    "compression": {"target_max_tokens": (int,), "summary_target_tokens": (int,)},
    "protected_turns": {"first_system": (bool,), "first_human": (bool,), "first_gpt": (bool,),
                        "first_tool": (bool,), "last_n_turns": (int,)},
    "summarization": {"model": (str,), "base_url": (str, type(None)), "api_key_env": (str,),
                      "temperature": NUMBER, "max_retries": (int,), "retry_delay": NUMBER},
    "output": {"add_summary_notice": (bool,), "summary_notice_text": (str,), "output_suffix": (str,)},
    "processing": {"num_workers": (int,),  # no effect, as in the original: concurrency is max_concurrent_requests
                   "max_concurrent_requests": (int,),
                   "skip_under_target": (bool,),  # rows under target are always left as they are, as in the original
                   "save_over_limit": (bool,),
                   "per_trajectory_timeout": NUMBER},  # a field of the original that its YAML loader skips
    "metrics": {"enabled": (bool,), "per_trajectory": (bool,), "output_file": (str,)},
}

# The original's defaults for what a file leaves out (its CompressionConfig dataclass).
ORIGINAL_DEFAULTS: dict[str, Any] = {
    "tokenizer.name": "moonshotai/Kimi-K2-Thinking",
    "summarization.model": "google/gemini-3-flash-preview",
    "summarization.base_url": "https://openrouter.ai/api/v1",
    "summarization.api_key_env": "OPENROUTER_API_KEY",
    "summarization.temperature": 0.3,
    "summarization.max_retries": 3,  # attempts in all, not retries after the first
    "summarization.retry_delay": 2,
    "processing.max_concurrent_requests": 50,
    "output.output_suffix": "_compressed",
    "metrics.enabled": True,
    "metrics.per_trajectory": True,
}


def _at_least(low: float) -> Callable[[Any], str | None]:
    return lambda value: None if value >= low else f"must be at least {low:g} (got {value!r})"


def _positive(value: Any) -> str | None:
    return None if value > 0 and math.isfinite(value) else f"must be a positive number (got {value!r})"


def _file_name(value: Any) -> str | None:
    return None if value and Path(value).name == value else f"must be a plain file name (got {value!r})"


CHECKS: dict[str, Callable[[Any], str | None]] = {
    "compression.target_max_tokens": _at_least(1), "compression.summary_target_tokens": _at_least(1),
    "protected_turns.last_n_turns": _at_least(0), "summarization.temperature": _at_least(0),
    "summarization.max_retries": _at_least(1), "summarization.retry_delay": _at_least(0),
    "processing.num_workers": _at_least(1), "processing.max_concurrent_requests": _at_least(1),
    "processing.per_trajectory_timeout": _positive, "metrics.output_file": _file_name,
    # an empty suffix would name the input itself as the output
    "output.output_suffix": lambda v: None if v else "must not be empty (the output would replace the input)",
    "tokenizer.name": lambda v: None if v.strip() else "must not be empty",
    "summarization.model": lambda v: None if v.strip() else "must not be empty",
    "summarization.api_key_env": lambda v: None if v.strip() else "must not be empty",
}


class ConfigFileError(ValueError):
    """The settings file cannot be used; the message names the file, line and key."""


@dataclass(frozen=True)
class ConfigFile:
    """The keys a settings file sets, as `section.key` -> value, with the line of each."""

    path: Path
    values: dict[str, Any]
    lines: dict[str, int]

    def get(self, key: str, default: Any = None) -> Any:
        """The file's value, else (also for null, as the original reads `base_url: null`) the
        original's default, else `default`."""
        value = self.values.get(key)
        return value if value is not None else ORIGINAL_DEFAULTS.get(key, default)

    def where(self, key: str) -> str:
        """`file:line: section.key` of a key the file sets (`file: section.key` of a default)."""
        line = self.lines.get(key)
        return f"{self.path}:{line}: {key}" if line else f"{self.path}: {key} (default)"

    def error(self, key: str, problem: str) -> ConfigFileError:
        return ConfigFileError(f"{self.where(key)}: {problem}")


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {bool: "true/false", int: "a whole number", float: "a number", str: "a string", type(None): "null"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds if not (k is int and float in kinds)))


def load_config_file(path: str | Path) -> ConfigFile:
    """Read and check an original-style settings file; ConfigFileError says what is wrong and where."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{source}: cannot read the settings file ({exc})") from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else str(source)
        raise ConfigFileError(f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if data is None:
        return ConfigFile(source, {}, {})
    if not isinstance(data, dict) or not isinstance(root, yaml.MappingNode):
        raise ConfigFileError(f"{source}: expected a mapping of sections ({', '.join(SCHEMA)})")
    values: dict[str, Any] = {}
    lines: dict[str, int] = {}
    for section_key, section_node in root.value:
        section, line = section_key.value, section_key.start_mark.line + 1
        if not isinstance(section_key, yaml.ScalarNode) or section not in SCHEMA:
            raise ConfigFileError(f"{source}:{line}: unknown section {section!r}; known: {', '.join(SCHEMA)}")
        body = data[section]
        if body is None:  # an empty section: every key keeps its default
            continue
        if not isinstance(body, dict) or not isinstance(section_node, yaml.MappingNode):
            raise ConfigFileError(f"{source}:{line}: {section}: expected a mapping of keys "
                                  f"({', '.join(SCHEMA[section])})")
        for key_node, _ in section_node.value:
            key, line = key_node.value, key_node.start_mark.line + 1
            name = f"{section}.{key}"
            if not isinstance(key_node, yaml.ScalarNode) or key not in SCHEMA[section]:
                raise ConfigFileError(f"{source}:{line}: unknown key {name!r}; known in {section}: "
                                      f"{', '.join(SCHEMA[section])}")
            value, kinds = body[key], SCHEMA[section][key]
            if isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds):
                raise ConfigFileError(f"{source}:{line}: {name}: expected {_kind_names(kinds)}, "
                                      f"got {value!r}")
            problem = CHECKS[name](value) if name in CHECKS and value is not None else None
            if problem:
                raise ConfigFileError(f"{source}:{line}: {name}: {problem}")
            values[name], lines[name] = value, line
    return ConfigFile(source, values, lines)
