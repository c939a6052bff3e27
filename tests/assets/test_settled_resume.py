"""A resume with nothing to do (issue 20, a fast start): once a command left the run settled, the next
one prints what the full path printed (the summary on stdout, "nothing to run" and any check lines on
stderr) without starting a Dagster run or sending a request; any change since takes the full path.
A `--plan_only` command leaves the plan settled the same way, for the next `--plan_only` only."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pytest

from hermes_assets.cli import batch_main
from hermes_core.batch import prompt_table
from batch_runs import prompts, write_dataset


@pytest.fixture(autouse=True)
def vouch_at_once(monkeypatch):
    """A dataset just written counts as settled (else whether a state is saved depends on how long the
    command took); the racy window has a test of its own."""
    monkeypatch.setattr(prompt_table, "RACY_S", 0.0)


def run(dataset: Path, url: str, *extra: str) -> int:
    return batch_main([f"--dataset_file={dataset}", "--run_name=settled", f"--base_url={url}", "--batch_size=2",
                       "--distribution=terminal_only", *extra])


def run_count() -> int:
    return len(dg.DagsterInstance.get().get_runs(dg.RunsFilter(tags={"hermes/run": "settled"})))


def test_a_settled_resume_prints_the_same_and_starts_no_run(isolated_homes, sim_server, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(3, "settled"))
    assert run(dataset, sim_url) == 0
    assert run_count() == 2  # plan and batches in one, finalize
    capsys.readouterr()
    # What a resume did before: the full path (none saved if the run ended within 2 s of the dataset's write).
    (isolated_homes / "data" / "settled" / "settled.json").unlink(missing_ok=True)
    assert run(dataset, sim_url) == 0
    full = capsys.readouterr()
    assert "nothing to run: every sample already has a final record" in full.err
    runs, requests = run_count(), sim_server.log.requests
    assert runs == 4  # its plan and finalize runs

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
    assert run_count() == runs + 2 and "running 1 sample(s)" in capsys.readouterr().err
    assert run(dataset, sim_url) == 0
    assert run_count() == runs + 2  # settled again

    trajectories = isolated_homes / "data" / "settled" / "trajectories.jsonl"
    trajectories.write_text("")  # an output changed behind the run's back: rebuilt by the finalize run
    assert run(dataset, sim_url) == 0
    assert run_count() == runs + 4 and len(trajectories.read_text().splitlines()) == 3


def test_a_plan_only_again_prints_its_plan_without_a_run_and_a_run_still_runs(
        isolated_homes, sim_server, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(3, "planned"))
    plan = "plan: 3 samples, 3 without a final record, in 2 of 2 batches; nothing was sent\n"
    assert run(dataset, sim_url, "--plan_only") == 0
    assert capsys.readouterr().out == plan and run_count() == 1
    assert run(dataset, sim_url, "--plan_only") == 0
    assert capsys.readouterr().out == plan and run_count() == 1  # told from the saved state

    stat = dataset.stat()  # the same size, the mtime set back: only the change time tells
    dataset.write_text(dataset.read_text().replace("#0", "#9"))
    os.utime(dataset, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert run(dataset, sim_url, "--plan_only") == 0
    assert capsys.readouterr().out == plan.replace("2 of 2", "3 of 3") and run_count() == 2  # a new key, a new batch
    prompts_table = (isolated_homes / "data" / "settled" / "prompts.jsonl").read_text()
    assert "#9" in prompts_table and "#0" not in prompts_table

    assert run(dataset, sim_url) == 0  # a plan's state does not cover a run
    assert run_count() == 4 and sim_server.log.requests and "running 3 sample(s)" in capsys.readouterr().err
    assert run(dataset, sim_url, "--plan_only") == 0  # a settled run covers its plan
    assert capsys.readouterr().out.startswith("plan: 3 samples, 0 without a final record") and run_count() == 4


def test_a_dataset_changed_within_the_racy_window_is_not_vouched_for(isolated_homes, sim_server, sim_url,
                                                                     monkeypatch):
    monkeypatch.setattr(prompt_table, "RACY_S", 3600.0)  # every change now "too recent"
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(2, "racy"))
    for runs in (1, 2):
        assert run(dataset, sim_url, "--plan_only") == 0
        assert run_count() == runs
    assert run(dataset, sim_url) == 0 and run(dataset, sim_url) == 0
    assert run_count() == 2 + 2 + 2  # each full (the second plans and finalizes): a second edit within
    # the tick could hide in a saved state
    assert not (isolated_homes / "data" / "settled" / "settled.json").exists()


def test_an_instance_named_through_the_environment_is_part_of_the_state(isolated_homes, sim_server, sim_url,
                                                                        monkeypatch):
    """One dagster.yaml can name another instance through a variable (a Postgres URL; a storage folder
    here): a command against the other instance takes the full path, so that instance has the runs."""
    (isolated_homes / "dagster_home" / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nstorage:\n  sqlite:\n    base_dir:\n      env: HERMES_TEST_STORAGE\n")
    monkeypatch.setenv("HERMES_TEST_STORAGE", str(isolated_homes / "storage-a"))
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(2, "elsewhere"))
    assert run(dataset, sim_url) == 0 and run(dataset, sim_url) == 0
    assert run_count() == 2  # the second was settled
    monkeypatch.setenv("HERMES_TEST_STORAGE", str(isolated_homes / "storage-b-secret"))
    assert run(dataset, sim_url, "--plan_only") == 0
    assert run_count() == 1  # planned in the new instance (its batches are registered there)
    assert "secret" not in (isolated_homes / "data" / "settled" / "settled.json").read_text()
