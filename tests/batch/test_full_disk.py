"""A disk that fills up during a run (a tmpfs of the test's own, needs root): the run stops with one
error that says which file did not fit, no record is left torn, and once there is space the same
command resumes, paying again only for the samples that were in flight."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from batch_runs import Sent, ledger_records, prompts, run, write_dataset
from hermes_core.fileio import atomic_write_text
from mounts import tmpfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs to fill (needs root)")
ROWS = 120
WORKERS = 4  # run()'s --num_workers: at most that many samples are in flight when the disk fills


def grow(point: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=64m", str(point)], check=True)


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_full_data_disk_stops_the_run_and_the_same_command_resumes(isolated_homes, sim_server, monkeypatch,
                                                                       capsys) -> None:
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(ROWS, "full disk"))
    with tmpfs(isolated_homes / "small", 1) as small:  # room for the plan and a few dozen records
        monkeypatch.setenv("HERMES_DATA_DIR", str(small))
        sent = Sent(sim_server)
        assert run(dataset, sim_server.base_url, run_name="full") == 2
        [error] = error_lines(capsys.readouterr().err)
        assert error.startswith(f"error: {small / 'full' / 'raw'}/") and ".jsonl: No space left on device." in error
        assert "run the same command to resume" in error
        raw = sorted((small / "full" / "raw").glob("*.jsonl"))
        assert all(path.read_bytes().endswith(b"\n") for path in raw if path.stat().st_size)  # no torn record
        kept = ledger_records(small / "full")
        recorded, first = len(kept), sum(sent.counts().values())
        assert 0 < recorded < ROWS and recorded <= first <= recorded + WORKERS
        # The samples in flight are not recorded, not even as failures of the endpoint: they were, when the
        # HTTP session closed under them (test_stopping.py, the pool ends before its HTTP session closes).
        assert {r["disposition"] for r in kept} == {"kept"}

        grow(small)
        sent = Sent(sim_server)
        assert run(dataset, sim_server.base_url, run_name="full") == 0
        records = ledger_records(small / "full")
        assert len(records) == len({r["sample_key"] for r in records}) == ROWS  # one record per sample
        assert {r["disposition"] for r in records} == {"kept"}
        assert sum(sent.counts().values()) == ROWS - recorded  # the recorded ones were not paid for again
        assert len((small / "full" / "trajectories.jsonl").read_text().splitlines()) == ROWS


def test_a_plan_that_does_not_fit_is_one_error_and_sends_nothing(isolated_homes, sim_server, monkeypatch,
                                                                    capsys) -> None:
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(400, "no room to plan"))
    with tmpfs(isolated_homes / "small", 1) as small:
        subprocess.run(["mount", "-o", "remount,size=60k", str(small)], check=True)  # less than the prompts' table
        monkeypatch.setenv("HERMES_DATA_DIR", str(small))
        sent = Sent(sim_server)
        assert run(dataset, sim_server.base_url, run_name="plan") == 2
        [error] = error_lines(capsys.readouterr().err)
        assert error.startswith(f"error: {small / 'plan'}/") and error.endswith(": No space left on device")
        assert not sent.counts()


def test_a_full_dagster_home_is_one_error_and_the_same_command_resumes(isolated_homes, sim_server, monkeypatch,
                                                                        capsys) -> None:
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(ROWS, "full home"))
    with tmpfs(isolated_homes / "small", 1) as small:  # Dagster's SQLite files fill it during the run
        monkeypatch.setenv("DAGSTER_HOME", str(small))
        assert run(dataset, sim_server.base_url, run_name="home") == 2
        [error] = error_lines(capsys.readouterr().err)
        assert error.startswith(f"error: Dagster's storage in {small} failed: ")
        assert "MiB free there" in error and "run the same command to resume" in error

        grow(small)
        assert run(dataset, sim_server.base_url, run_name="home") == 0
        records = ledger_records(isolated_homes / "data" / "home")
        assert len({r["sample_key"] for r in records}) == ROWS and {r["disposition"] for r in records} == {"kept"}


def test_a_final_file_that_does_not_fit_is_named_and_nothing_of_it_is_left(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", 1) as small:
        (small / "trajectories.jsonl").write_text("the previous version\n")
        with pytest.raises(OSError) as raised:
            atomic_write_text(small / "trajectories.jsonl", "x" * (2 << 20))
        assert raised.value.filename == str(small / "trajectories.jsonl")
        assert "No space left on device" in str(raised.value)
        assert [path.name for path in small.iterdir()] == ["trajectories.jsonl"]  # no temp file left behind
        assert (small / "trajectories.jsonl").read_text() == "the previous version\n"
