"""`make demo`'s script, as a newcomer runs it: console scripts, a separate simulated endpoint
process, the example dataset through the asset graph, the summary and the output paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_script_produces_trajectories(isolated_homes):
    env = {**os.environ, "VENV": str(Path(sys.executable).parents[1]),
           "DAGSTER_HOME": str(isolated_homes / "dagster_home"), "HERMES_DATA_DIR": str(isolated_homes / "data"),
           "SIM_LATENCY": "0"}
    result = subprocess.run(["scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    trajectories = isolated_homes / "data" / "demo" / "trajectories.jsonl"
    assert f"trajectories: {trajectories}" in result.stdout
    assert "SIMULATED" in result.stdout
    rows = [json.loads(line) for line in trajectories.read_text().splitlines()]
    examples = (REPO / "examples" / "prompts.jsonl").read_text().splitlines()
    assert len(rows) == len(examples)
    assert all(row["conversations"][0]["from"] == "system" for row in rows)
