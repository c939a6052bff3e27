"""The oracle fixture: the JSON scripts/hermes_oracle.sh dumps from the real Hermes Agent.

It is (re)built when missing or older than the script, the dumper or the message fixtures; when it
cannot be built here (no PyPI, no Python 3.11-3.13, no network namespaces) every test using it
skips with the script's one-line reason.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "hermes_oracle.sh"
ORACLE_JSON = ROOT / ".oracle-venv" / "oracle.json"
FIXTURES = Path(__file__).parent / "fixtures" / "messages.json"
INPUTS = (SCRIPT, ROOT / "scripts" / "hermes_oracle_dump.py", ROOT / "hermes_core" / "formats" / "hermes_agent_dump.py",
          FIXTURES)


def _stale() -> bool:
    return not ORACLE_JSON.exists() or any(p.stat().st_mtime > ORACLE_JSON.stat().st_mtime for p in INPUTS)


@pytest.fixture(scope="session")
def oracle() -> dict[str, Any]:
    """The original's tool definitions, toolsets, distributions and ShareGPT conversions."""
    if _stale():
        # A cold build installs hermes-agent from PyPI (about 20 s here); the dump itself ~15 s.
        done = subprocess.run([str(SCRIPT), str(ORACLE_JSON)], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            pytest.skip(f"no Hermes Agent oracle: {reason}")
    return json.loads(ORACLE_JSON.read_text(encoding="utf-8"))
