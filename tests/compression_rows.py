"""Trajectory rows and original-style compressor settings for the compression tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hermes_core.formats.sharegpt import to_conversations

TERMINAL = {"name": "terminal", "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def make_row(index: int, rounds: int, output_chars: int = 600, middle_human: str | None = None) -> dict[str, Any]:
    """A Hermes ShareGPT row with `rounds` gpt/tool pairs whose tool outputs are long."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Task {index}: inspect the project files."}]
    for step in range(rounds):
        call_id = f"call_{index}_{step}"
        messages.append({"role": "assistant", "content": f"Step {step}.", "reasoning": f"I will run step {step}.",
                         "tool_calls": [{"id": call_id, "type": "function", "function": {
                             "name": "terminal", "arguments": json.dumps({"command": f"cat part{step}.txt"})}}]})
        output = f"part {step} of row {index}: " + "lorem ipsum dolor sit amet " * (output_chars // 27)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps({"output": output})})
        if middle_human and step == rounds // 2:
            messages.append({"role": "user", "content": middle_human})
    messages.append({"role": "assistant", "content": f"All {rounds} parts are read.", "reasoning": "Done."})
    return {"prompt_index": index, "conversations": to_conversations(messages, [TERMINAL]),
            "metadata": {"model": "hermes-sim", "note": "naïve ✓"}, "completed": True, "id": f"r{index}"}


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def original_style_yaml(path: Path, sections: dict[str, dict[str, Any]]) -> Path:
    """A settings file in the original trajectory_compressor's layout (section -> key -> value)."""
    lines = []
    for section, keys in sections.items():
        lines.append(f"{section}:")
        lines += [f"  {key}: {json.dumps(value)}" for key, value in keys.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def full_original_config(base_url: str, **changes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every key the original reads from its YAML, set for a run against `base_url`; `changes`
    replace keys per section."""
    sections: dict[str, dict[str, Any]] = {
        "tokenizer": {"name": "moonshotai/Kimi-K2-Thinking", "trust_remote_code": True},
        "compression": {"target_max_tokens": 2000, "summary_target_tokens": 200},
        "protected_turns": {"first_system": True, "first_human": True, "first_gpt": True, "first_tool": True,
                            "last_n_turns": 4},
        "summarization": {"model": "hermes-sim", "base_url": base_url, "api_key_env": "HC_SUMMARY_KEY",
                          "temperature": 0.2, "max_retries": 2, "retry_delay": 0},
        "output": {"add_summary_notice": True, "summary_notice_text": "\n\n(Some turns were summarised.)",
                   "output_suffix": "_small"},
        "processing": {"num_workers": 2, "max_concurrent_requests": 3, "skip_under_target": True,
                       "save_over_limit": True},
        "metrics": {"enabled": True, "per_trajectory": True, "output_file": "run_metrics.json"},
    }
    for section, keys in changes.items():
        sections[section] = {**sections[section], **keys}
    return sections
