"""The generated reference pages match the code, and the runs-file JSON Schema accepts what the runs file
accepts and refuses what it refuses, naming the setting (what an editor shows on `runs.yaml`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from hermes_assets.runs_file import read_runs_file

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "schema" / "runs-file.schema.json").read_text(encoding="utf-8"))

VALID = """\
runs:
  - run_name: nightly
    dataset_file: prompts.jsonl
    model: hermes-sim
    base_url: http://127.0.0.1:8000/v1
    distribution: terminal_only
    batch_size: 10
    tool_backends: {HERMES_WEB_SEARCH_URL: "http://127.0.0.1:8888"}
    compression: {target_max_tokens: 4000}
    sample_timeout_s: null
  - env_name: counting
    tasks_file: builtin:terminal
    model: hermes-sim
    group_size: 2
"""


def test_the_generated_pages_and_schema_match_the_code() -> None:
    """Regenerated from the parsers and dataclasses, the committed files are unchanged (a narrow terminal too)."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "reference_docs.py"), "--check"],
                            capture_output=True, text=True, env={"COLUMNS": "40", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_a_valid_runs_file_passes_both_the_schema_and_the_code(tmp_path) -> None:
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    path = tmp_path / "runs.yaml"
    path.write_text(VALID)
    jsonschema.validate(yaml.safe_load(VALID), SCHEMA)
    declared, problems = read_runs_file(path)
    assert problems == [] and [d.recipe.run_name for d in declared] == ["nightly"]


@pytest.mark.parametrize("entry, setting", [
    ({"run_name": "r", "dataset_file": "d.jsonl", "model": "m", "batch_sise": 5}, "batch_sise"),  # a typo
    ({"run_name": "r", "dataset_file": "d.jsonl", "model": "m", "batch_size": "10"}, "batch_size"),  # quoted number
    ({"run_name": "r", "dataset_file": "d.jsonl"}, "model"),  # missing
    ({"run_name": "9lives", "dataset_file": "d.jsonl", "model": "m"}, "run_name"),  # not a name
    ({"run_name": "r", "dataset_file": "d.jsonl", "model": "m", "tool_call_mode": "json"}, "tool_call_mode"),
    ({"env_name": "e", "tasks_file": "t.jsonl", "model": "m", "group_size": "four"}, "group_size"),
])
def test_the_schema_refuses_what_the_runs_file_refuses(tmp_path, entry, setting) -> None:
    errors = list(jsonschema.Draft202012Validator(SCHEMA).iter_errors([entry]))
    assert errors, f"the schema accepted {entry}"
    named = [str(part) for error in errors for part in error.absolute_path] + [error.message for error in errors]
    assert any(setting in text for text in named), named  # where an editor puts its squiggle, or its message
    if "tasks_file" not in entry:  # the code location refuses the same entry, naming the same setting
        path = tmp_path / "runs.yaml"
        path.write_text(yaml.safe_dump([entry]))
        declared, problems = read_runs_file(path)
        assert declared == [] and any(setting in str(problem) for problem in problems), problems
