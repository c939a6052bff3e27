"""A CLI command runs its Dagster phases in process (launch.execute_job). Dagster sets SIGTERM to
SIGINT's handler when a run ends; started as a script's background job (SIGINT ignored), the command
would then ignore SIGTERM, and `kill PID` would no longer stop it. The disposition is put back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from procs import ignoring

SCRIPT = """
import signal, sys
import dagster as dg
from hermes_assets.launch import execute_job

@dg.op
def noop() -> None:
    pass

@dg.job(executor_def=dg.in_process_executor)
def phase() -> None:
    noop()

with dg.instance_for_test() as instance:
    before = signal.getsignal(signal.SIGTERM)
    result = execute_job(instance, phase, {}, {})
    print(result.success, signal.getsignal(signal.SIGINT) == signal.SIG_IGN, signal.getsignal(signal.SIGTERM) == before)
"""


def test_a_run_in_a_background_job_leaves_sigterm_as_it_found_it(tmp_path: Path) -> None:
    script = tmp_path / "phase.py"
    script.write_text(SCRIPT)
    done = subprocess.run(ignoring("INT", [sys.executable, str(script)]), capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.stdout.split() == ["True", "True", "True"], done.stderr[-3000:]
