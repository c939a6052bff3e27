"""Stopping early without losing work (SPEC §5): a signal or a budget stops scheduling, the samples
in flight finish and are recorded, the outputs are written, and the same command resumes without
re-sending or re-counting anything."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest

from hermes_assets.cli import batch_main
from hermes_core.batch import runner
from hermes_core.config import data_root
from hermes_core.batch.ledger import Ledger
from hermes_core.endpoints.simulated import SimulatedModelServer
from procs import wait_until

HERMES_BATCH = str(Path(sys.executable).with_name("hermes-batch"))


def write_prompts(path: Path, count: int, suffix: str = "") -> Path:
    path.write_text("".join(json.dumps({"prompt": f"Run a command that prints {i}{suffix}"}) + "\n" for i in range(count)))
    return path


def argv(dataset: Path, url: str, *extra: str, run_name: str = "s1") -> list[str]:
    return [f"--dataset_file={dataset}", f"--run_name={run_name}", f"--base_url={url}", "--api_key=k",
            "--distribution=terminal_only", "--batch_size=4", "--num_workers=2", *extra]


def ledger(run_name: str = "s1") -> Ledger:
    return Ledger(data_root() / run_name / "raw")


@pytest.mark.parametrize("group", [False, True], ids=["to the command", "to its process group, as Ctrl-C"])
def test_sigint_finishes_in_flight_samples_and_a_resume_sends_nothing_twice(isolated_homes, tmp_path: Path,
                                                                             group: bool) -> None:
    dataset = write_prompts(tmp_path / "d.jsonl", 12)
    with SimulatedModelServer(latency=0.4) as sim:
        process = subprocess.Popen([HERMES_BATCH, *argv(dataset, sim.base_url)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=os.environ.copy(), start_new_session=group)
        assert wait_until(lambda: len(ledger().latest) >= 2, timeout=60)
        # A terminal's Ctrl-C reaches every process of the foreground group, Dagster's log mirroring
        # processes too: they must neither die (the rest of the run's output would be lost) nor print.
        os.killpg(process.pid, signal.SIGINT) if group else process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 130, err
        assert "finishing the samples in flight" in err and "stopped early: interrupted by SIGINT" in err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        # In the UI the run succeeded (what it finished is saved) and says why it stopped early.
        [batch_run] = dg.DagsterInstance.get().get_runs(dg.RunsFilter(job_name="__ASSET_JOB"))  # plan and batches
        assert batch_run.status == dg.DagsterRunStatus.SUCCESS
        assert batch_run.tags["hermes/stopped"] == "interrupted by SIGINT"
        finished = set(ledger().latest)
        assert 2 <= len(finished) < 12
        # Every sample that started was finished and recorded: none was cut off mid-conversation.
        assert set(sim.log.sample_starts) == {r["row"]["conversations"][1]["value"]
                                              for _, r in ledger().records(finished)}
        trajectories = (data_root() / "s1" / "trajectories.jsonl").read_text().splitlines()
        assert len(trajectories) == len(finished)  # the outputs were written for what finished
        assert batch_main(argv(dataset, sim.base_url)) == 0
        assert len(ledger().latest) == 12
        assert set(sim.log.sample_starts.values()) == {1}  # nothing finished was sent again


def test_a_token_budget_stops_the_run_and_a_resume_counts_nothing_twice(isolated_homes, sim_url, tmp_path, capsys) -> None:
    dataset = write_prompts(tmp_path / "d.jsonl", 10)
    assert batch_main(argv(dataset, sim_url, "--max_tokens_total=6000", "--num_workers=1")) == 3
    spent = ledger().spent["total_tokens"]
    done = len(ledger().latest)
    assert 6000 <= spent and 1 <= done < 10
    assert "budget reached" in capsys.readouterr().err
    invocation = json.loads((data_root() / "s1" / "invocations.jsonl").read_text().splitlines()[-1])
    assert invocation["stopped"].startswith("budget reached") and invocation["samples_run"] == done
    # Same budget: already spent, so nothing starts.
    assert batch_main(argv(dataset, sim_url, "--max_tokens_total=6000", "--num_workers=1")) == 3
    assert len(ledger().latest) == done and ledger().spent["total_tokens"] == spent
    # A larger budget continues from there; the spend counts each attempt once.
    assert batch_main(argv(dataset, sim_url, "--max_tokens_total=1000000")) == 0
    assert len(ledger().latest) == 10
    stats = json.loads((data_root() / "s1" / "statistics.json").read_text())
    assert stats["usage"]["total_tokens"] == ledger().spent["total_tokens"]
    assert sum(r["usage"]["total_tokens"] for _, r in ledger().records(ledger().latest)) == ledger().spent["total_tokens"]


def test_cost_budgets_use_the_price_table(isolated_homes, sim_url, tmp_path, capsys) -> None:
    dataset = write_prompts(tmp_path / "d.jsonl", 6)
    prices = tmp_path / "prices.yaml"
    prices.write_text("hermes-*: {prompt_per_mtok: 3.0, completion_per_mtok: 15.0}\n")
    assert batch_main(argv(dataset, sim_url, "--max_cost_usd=0.01", f"--price_table={prices}", "--num_workers=1")) == 3
    records = list(ledger().latest.values())
    assert all(r["cost_usd"] > 0 for r in records) and ledger().spent["cost_usd"] >= 0.01
    assert "max_cost_usd" in capsys.readouterr().err
    # No price for the model: a cost budget is refused before anything is spent.
    code = batch_main(argv(dataset, sim_url, "--max_cost_usd=1", "--model=gpt-unknown", run_name="s2"))
    assert code == 2 and "needs a price for model 'gpt-unknown'" in capsys.readouterr().err


def test_a_sample_budget_ends_that_sample_only(isolated_homes, sim_url, tmp_path) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(json.dumps({"prompt": "Run ls [sim:tools=4]"}) + "\n" + json.dumps({"prompt": "Say hi [sim:no-tools]"}) + "\n")
    assert batch_main(argv(dataset, sim_url, "--max_sample_tokens=2000")) == 0
    stopped = [r for r in ledger().latest.values() if r["stopped"]]
    assert len(stopped) == 1 and len(ledger().latest) == 2  # only the long sample hit its budget
    assert stopped[0]["stopped"].startswith("sample budget reached") and stopped[0]["api_calls"] < 5


def test_a_record_that_cannot_be_written_ends_the_pool_before_its_http_session_closes(monkeypatch):
    """A record that cannot be written (a full disk) ends the pool: the other sessions are cancelled
    while the HTTP session is still open, and none of their samples is handed on as a record. Closed
    under them, their requests in flight failed as "Server disconnected", and those failures, smaller than
    a trajectory, fitted and were recorded as the endpoint's."""
    cancelled_with_http_closed: dict[int, bool] = {}

    async def session(_pool, job, http, _sandboxes) -> dict:
        if job.number == 0:
            await asyncio.sleep(0.2)  # the others are waiting on the model by then
            return {"sample": 0}
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled_with_http_closed[job.number] = http.closed
            raise
        return {"sample": job.number}

    monkeypatch.setattr(runner._Sessions, "session", session)
    pool = object.__new__(runner._Sessions)  # what serve uses of one, without a recipe or a sandbox
    pool.jobs = [SimpleNamespace(number=n, toolsets=[]) for n in range(4)]
    pool.endpoint, pool.backend = SimpleNamespace(request_timeout_s=5.0), SimpleNamespace(close=lambda: None)
    waiting, handed_on = list(range(4)), []

    async def next_index(_position: int) -> int | None:
        return waiting.pop(0) if waiting else None

    def on_done(index: int, record: dict) -> None:
        handed_on.append(index)
        raise OSError(28, "No space left on device", "raw/b00001.jsonl")

    with pytest.raises(OSError, match="No space left"):
        asyncio.run(pool.serve([0, 1, 2, 3], next_index, on_done))
    assert handed_on == [0] and cancelled_with_http_closed == {1: False, 2: False, 3: False}
