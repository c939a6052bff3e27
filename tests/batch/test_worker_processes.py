"""Sessions spread over worker processes ($HERMES_WORKER_PROCESSES; runner.py, workers.py): what a user
sees is what one process gives: every record once, budgets and signals stop the whole run, and no
worker outlives the command; a worker that dies is reported and its samples run again next time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from batch_runs import ledger_records
from hermes_assets.cli import batch_main
from hermes_core.batch.ledger import Ledger
from hermes_core.batch.workers import run_in_processes
from hermes_core.config import data_root
from hermes_core.endpoints.simulated import SimulatedModelServer
from procs import process_folders, wait_until

HERMES_BATCH = str(Path(sys.executable).with_name("hermes-batch"))


def write_prompts(path: Path, count: int) -> Path:
    """Prompts of this test alone: the session's simulated endpoint counts sample starts by prompt."""
    tag = path.parent.name
    path.write_text("".join(json.dumps({"prompt": f"Run a command that prints {i} ({tag})"}) + "\n"
                            for i in range(count)))
    return path


def argv(dataset: Path, url: str, *extra: str, sessions: int = 4) -> list[str]:
    return [f"--dataset_file={dataset}", "--run_name=w1", f"--base_url={url}", "--api_key=k",
            "--distribution=terminal_only", "--batch_size=5", f"--num_workers={sessions}", *extra]


def ledger() -> Ledger:
    return Ledger(data_root() / "w1" / "raw")


def start(dataset: Path, url: str, processes: int = 2) -> subprocess.Popen:
    env = {**os.environ, "HERMES_WORKER_PROCESSES": str(processes)}
    return subprocess.Popen([HERMES_BATCH, *argv(dataset, url)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def workers_of(pid: int) -> list[int]:
    """The command's worker processes: its forked children (same command line), not zombies."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    found = []
    for entry in process_folders():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] not in ("Z", "X") and (entry / "cmdline").read_bytes() == command:
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_every_sample_is_recorded_once_across_worker_processes(isolated_homes, sim_server, tmp_path, monkeypatch,
                                                                capsys) -> None:
    monkeypatch.setenv("HERMES_WORKER_PROCESSES", "2")
    dataset = write_prompts(tmp_path / "d.jsonl", 24)
    assert batch_main(argv(dataset, sim_server.base_url, sessions=6)) == 0
    assert "6 sessions over 2 worker processes" in capsys.readouterr().err
    records = ledger_records(data_root() / "w1")
    assert len(records) == 24 and set(Counter(r["sample_key"] for r in records).values()) == {1}
    assert all(r["disposition"] == "kept" for r in records)
    assert len((data_root() / "w1" / "trajectories.jsonl").read_text().splitlines()) == 24
    mine = {prompt: n for prompt, n in sim_server.log.sample_starts.items() if f"({tmp_path.name})" in prompt}
    assert len(mine) == 24 and set(mine.values()) == {1}  # nothing was sent twice


def test_records_that_arrive_together_share_their_fsyncs_on_a_slow_disk(isolated_homes, sim_server, tmp_path,
                                                                        monkeypatch) -> None:
    """On a disk whose fsync takes 20 ms (a network file system, say), one fsync per record would make
    every session wait for the others' in turn; records that reached the parent together are made
    durable together. Every record is still there once, and no job went to a session before the
    records that arrived with its request were durable (each is in the ledger, whole)."""
    monkeypatch.setenv("HERMES_WORKER_PROCESSES", "2")
    synced: list[str] = []
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.02)
        real_fsync(fd)
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(os, "fsync", slow_fsync)
    dataset = write_prompts(tmp_path / "d.jsonl", 96)
    assert batch_main(argv(dataset, sim_server.base_url, sessions=32)) == 0
    records = ledger_records(data_root() / "w1")
    assert len(records) == 96 and set(Counter(r["sample_key"] for r in records).values()) == {1}
    raw_syncs = [path for path in synced if "/w1/raw/" in path]
    assert len(raw_syncs) < 96, f"{len(raw_syncs)} fsyncs for 96 records"
    mine = {prompt: n for prompt, n in sim_server.log.sample_starts.items() if f"({tmp_path.name})" in prompt}
    assert len(mine) == 96 and set(mine.values()) == {1}  # nothing was sent twice


def test_a_token_budget_stops_every_worker(isolated_homes, sim_url, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HERMES_WORKER_PROCESSES", "2")
    dataset = write_prompts(tmp_path / "d.jsonl", 30)
    assert batch_main(argv(dataset, sim_url, "--max_tokens_total=8000", sessions=2)) == 3
    assert "budget reached" in capsys.readouterr().err
    spent, done = ledger().spent["total_tokens"], len(ledger().latest)
    assert 8000 <= spent and 2 <= done < 30  # at most the samples in flight when it was reached finished
    assert batch_main(argv(dataset, sim_url, "--max_tokens_total=8000", sessions=2)) == 3
    assert len(ledger().latest) == done  # already spent: nothing started
    assert batch_main(argv(dataset, sim_url, "--max_tokens_total=10000000")) == 0
    assert len(ledger().latest) == 30 and len(ledger_records(data_root() / "w1")) == 30


def test_sigterm_finishes_the_workers_samples_in_flight(isolated_homes, tmp_path) -> None:
    dataset = write_prompts(tmp_path / "d.jsonl", 16)
    with SimulatedModelServer(latency=0.4) as sim:
        process = start(dataset, sim.base_url)
        assert wait_until(lambda: len(ledger().latest) >= 2, timeout=60)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 130, err
        assert "stopped early: interrupted by SIGTERM" in err
        finished = set(ledger().latest)
        assert 2 <= len(finished) < 16
        # Every sample that started, in either worker, finished and was recorded.
        assert set(sim.log.sample_starts) == {r["row"]["conversations"][1]["value"]
                                              for _, r in ledger().records(finished)}
        assert batch_main(argv(dataset, sim.base_url)) == 0
        assert len(ledger().latest) == 16 and set(sim.log.sample_starts.values()) == {1}


def test_kill_9_of_the_command_leaves_no_worker(isolated_homes, tmp_path) -> None:
    dataset = write_prompts(tmp_path / "d.jsonl", 16)
    with SimulatedModelServer(latency=3.0) as sim:
        process = start(dataset, sim.base_url)
        try:
            assert wait_until(lambda: len(workers_of(process.pid)) == 2 and sim.log.sample_starts, timeout=60)
            workers = workers_of(process.pid)
            process.kill()
            process.wait(timeout=10)
            assert wait_until(lambda: not any(alive(pid) for pid in workers), timeout=10)
        finally:
            process.kill()
            process.communicate()


def test_a_dead_worker_is_reported_and_its_samples_run_next_time(isolated_homes, tmp_path) -> None:
    dataset = write_prompts(tmp_path / "d.jsonl", 16)
    with SimulatedModelServer(latency=1.0) as sim:
        process = start(dataset, sim.base_url)
        assert wait_until(lambda: len(workers_of(process.pid)) == 2 and len(ledger().latest) >= 2, timeout=60)
        os.kill(workers_of(process.pid)[0], signal.SIGKILL)  # a crash: OOM killer, segfault
        out, err = process.communicate(timeout=120)
        assert process.returncode == 1, err
        assert "was killed by SIGKILL" in err and "not recorded" in err and "run the same command" in err
        recorded = len(ledger().latest)
        assert 2 <= recorded < 16  # the other worker carried on; the dead one's samples in flight are missing
        assert batch_main(argv(dataset, sim.base_url)) == 0
        records = ledger_records(data_root() / "w1")
        assert len(ledger().latest) == 16 and len(records) == 16  # each sample recorded once: nothing lost


@pytest.mark.timeout(120)
def test_many_sessions_and_large_records_never_block_both_ends_of_a_workers_pipe() -> None:
    """A worker's loop never blocks sending: with 512 sessions per worker, its pipe to the parent
    full of records while the parent blocked sending it jobs, both waited for ever (a 1,024-session
    run hung after 711 of 3,000 samples)."""

    async def serve(positions, next_index, on_done) -> None:
        async def session(position: int) -> None:
            while (index := await next_index(position)) is not None:
                on_done(index, {"index": index, "text": "x" * 40_000})

        await asyncio.gather(*(session(position) for position in positions))

    recorded: list[int] = []
    run_in_processes(4000, 1024, 2, serve, contextlib.nullcontext(),
                     lambda records: recorded.extend(r["index"] for r in records), lambda: None)
    assert sorted(recorded) == list(range(4000))
