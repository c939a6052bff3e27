"""Where a tool's error ends and a broken sandbox begins (SPEC §6, issue 28). A command that fails, a
missing file, a program that raises: answers the model reads, kept as data. A sandbox that cannot
start (or whose exec server died): SandboxFailed out of registry.call, whichever tool met it, so the
agent fails the sample instead of keeping "could not start the sandbox" as training data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import contract_backends.local as local_contract
from hermes_core.sandbox.base import SandboxFailed
from hermes_core.sandbox.bubblewrap import BubblewrapBackend
from hermes_core.tools import ToolContext, registry

SANDBOX_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("terminal", {"command": "pwd"}),
    ("read_file", {"path": "notes.txt"}),
    ("write_file", {"path": "notes.txt", "content": "x"}),
    ("search_files", {"pattern": "x"}),
    ("patch", {"mode": "replace", "path": "notes.txt", "old_string": "x", "new_string": "y"}),
    ("execute_code", {"code": "print(1)"}),
    ("execute_code", {"code": "from hermes_tools import terminal\nprint(terminal('pwd'))"}),
]


@pytest.fixture
def backend(tmp_path: Path):
    backend = local_contract.make_backend(tmp_path)
    yield backend
    backend.close()


def test_every_sandbox_tool_fails_the_sample_when_its_sandbox_cannot_start(backend: BubblewrapBackend) -> None:
    # bubblewrap cannot make the working directory (/etc/hostname is a file in the image)
    with backend.open("broken", local_contract.IMAGE, "/etc/hostname/app") as box:
        ctx = ToolContext(sandbox=box, task_id="broken")
        for name, arguments in SANDBOX_CALLS:
            with pytest.raises(SandboxFailed, match="^could not start the sandbox: bwrap: Can't mkdir"):
                registry.call(name, arguments, ctx)


def test_ordinary_tool_errors_stay_answers_for_the_model(backend: BubblewrapBackend) -> None:
    with backend.open("fine", None, "/app") as box:
        ctx = ToolContext(sandbox=box, task_id="fine")
        typo = json.loads(registry.call("terminal", {"command": "no-such-command-here"}, ctx))
        assert typo["exit_code"] == 127 and "not found" in typo["output"]
        assert "not found" in json.loads(registry.call("read_file", {"path": "missing.txt"}, ctx))["error"].lower()
        program = json.loads(registry.call("execute_code", {"code": "raise SystemExit('nope')"}, ctx))
        assert program["status"] == "error" and "nope" in program["error"]
