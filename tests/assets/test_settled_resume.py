"""A resume with nothing to do (issue 20, a fast start): once a command left the run settled, the next
one prints what the full path printed (the summary on stdout, "nothing to run" and any check lines on
stderr) without starting a Dagster run or sending a request; any change since takes the full path."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from hermes_assets.cli import batch_main
from batch_runs import prompts, write_dataset


def run(dataset: Path, url: str, *extra: str) -> int:
    return batch_main([f"--dataset_file={dataset}", "--run_name=settled", f"--base_url={url}", "--batch_size=2",
                       "--distribution=terminal_only", *extra])


def run_count() -> int:
    return len(dg.DagsterInstance.get().get_runs(dg.RunsFilter(tags={"hermes/run": "settled"})))


def test_a_settled_resume_prints_the_same_and_starts_no_run(isolated_homes, sim_server, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(3, "settled"))
    assert run(dataset, sim_url) == 0
    assert run_count() == 3  # plan, batch, finalize
    capsys.readouterr()
    (isolated_homes / "data" / "settled" / "settled.json").unlink()  # what a resume did before: the full path
    assert run(dataset, sim_url) == 0
    full = capsys.readouterr()
    assert "nothing to run: every sample already has a final record" in full.err
    runs, requests = run_count(), sim_server.log.requests
    assert runs == 5  # its plan and finalize runs

    assert run(dataset, sim_url) == 0
    settled = capsys.readouterr()
    assert (settled.out, settled.err) == (full.out, full.err) and "SIMULATED" in settled.out
    assert (run_count(), sim_server.log.requests) == (runs, requests)

    assert run(dataset, sim_url, "--plan_only") == 0
    assert capsys.readouterr().out.startswith("plan: 3 samples, 0 without a final record, in 0 of 2 batches")
    assert run_count() == runs


def test_any_change_takes_the_full_path(isolated_homes, sim_server, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(2, "changed"))
    assert run(dataset, sim_url) == 0
    runs = run_count()
    with open(dataset, "a") as handle:  # a new row: planned, run and merged as before
        handle.write('{"prompt": "one more"}\n')
    assert run(dataset, sim_url) == 0
    assert run_count() == runs + 3 and "running 1 sample(s)" in capsys.readouterr().err
    assert run(dataset, sim_url) == 0
    assert run_count() == runs + 3  # settled again

    trajectories = isolated_homes / "data" / "settled" / "trajectories.jsonl"
    trajectories.write_text("")  # an output changed behind the run's back: rebuilt by the finalize run
    assert run(dataset, sim_url) == 0
    assert run_count() == runs + 5 and len(trajectories.read_text().splitlines()) == 3
