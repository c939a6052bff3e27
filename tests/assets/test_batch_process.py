"""hermes-batch as a process: what it imports to start, and how it sets Python's garbage collector
for its start-up and its samples."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from hermes_assets.cli import batch_main
from hermes_core.batch import runner
from batch_runs import run, write_dataset


def test_a_run_starts_without_importing_httpx():
    """httpx (~0.1 s to import) is for the web and image tools and the UI reload, imported when they run."""
    code = ("import sys, hermes_assets.cli, hermes_assets.phases, hermes_assets.definitions; "
            "print(sorted(name for name in sys.modules if name.split('.')[0] == 'httpx'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "[]"


def test_the_collector_runs_for_the_samples_and_is_left_as_it_was(isolated_homes, sim_url, monkeypatch):
    """The cyclic garbage collector is off for the start-up only (cli._tuned_gc): the samples run with
    it on (their cycles are freed as they go), and batch_main leaves it as it found it on every exit,
    a plan-only run and a usage error included, since it may run inside another program."""
    during: list[bool] = []
    run_jobs = runner.run_jobs

    def noting_the_collector(*args, **kwargs):
        during.append(gc.isenabled())
        return run_jobs(*args, **kwargs)

    monkeypatch.setattr(runner, "run_jobs", noting_the_collector)
    dataset = write_dataset(isolated_homes / "d.jsonl", [{"prompt": f"Run a command that prints {i}"} for i in range(2)])
    thresholds = gc.get_threshold()
    assert gc.isenabled()
    assert run(dataset, sim_url, "--plan_only") == 0
    assert (gc.isenabled(), gc.get_threshold()) == (True, thresholds)
    assert run(dataset, sim_url) == 0
    assert during == [True] and (gc.isenabled(), gc.get_threshold()) == (True, thresholds)
    assert batch_main([f"--dataset_file={dataset}", "--run_name=rs"]) == 2  # no endpoint: a usage error
    assert (gc.isenabled(), gc.get_threshold()) == (True, thresholds)
