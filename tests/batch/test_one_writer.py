"""One writer per run (issue 17, item 3): a second process on a running run name is refused at once,
naming the holder, and no prompt is paid for twice. Counted at the simulated endpoint, with real
`hermes-batch` processes; the object-storage variant against a real S3 API (moto)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fsspec.core import url_to_fs

from hermes_core.batch import writer_lock
from hermes_core.batch.object_ledger import ObjectLedger
from hermes_core.batch.writer_lock import RunBusy, claim_run, hold_run, holding, release_claims
from batch_runs import Sent, ledger_records, prompts, run, write_dataset
from procs import wait_until
from s3_server import s3_endpoint, s3_ledger  # noqa: F401  (fixtures)

BIN = Path(sys.executable).parent


def batch_command(dataset: Path, url: str, run_name: str = "rs") -> list[str]:
    return [str(BIN / "hermes-batch"), f"--dataset_file={dataset}", f"--run_name={run_name}", f"--base_url={url}",
            "--api_key=sk-do-not-show", "--distribution=terminal_only", "--batch_size=20", "--num_workers=4"]


def start(command: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})


def refused_at_once(command: list[str], holder_pid: int, slack: float = 1.0, **env: str) -> str:
    """Run `command` while another process holds its run: it exits 2 within 2 s, with one `error:` line
    naming the holder and no traceback. Returns that line.

    On a machine whose cores are busy (the suite, other work), starting Python and importing Dagster
    alone can take longer than 2 s; a `hermes-batch` that stops at its first check after those imports
    is started at the same moment, and the refusal may take as long as it, plus `slack` seconds."""
    began = time.monotonic()
    second, baseline = start(command, **env), start([str(BIN / "hermes-batch"), "--run_name=x"])
    ended: dict[subprocess.Popen, float] = {}
    while len(ended) < 2 and time.monotonic() - began < 60:
        ended.update({process: time.monotonic() - began for process in (second, baseline)
                      if process not in ended and process.poll() is not None})
        time.sleep(0.01)
    elapsed, startup = ended[second], ended[baseline]
    err = second.communicate()[1]
    assert second.returncode == 2, err
    assert elapsed < max(2.0, startup + slack), (elapsed, startup)
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and "already running" in line
    assert f"pid {holder_pid} on {socket.gethostname()}" in line and "hermes-batch" in line and " ago)" in line
    assert "sk-do-not-show" not in err and "--api_key=***" in line  # the holder's command, secrets masked
    return line


def test_a_second_process_on_a_running_run_is_refused_at_once_and_nothing_is_paid_twice(isolated_homes, sim_server):
    rows = prompts(40, "twice", latency=0.4)
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    sent = Sent(sim_server)
    first = start(batch_command(dataset, sim_server.base_url))
    run_dir = isolated_homes / "data" / "rs"
    assert wait_until(lambda: (run_dir / "raw").exists() and len(ledger_records(run_dir)) >= 4, timeout=120)
    refused_at_once(batch_command(dataset, sim_server.base_url), first.pid)
    assert first.poll() is None, "the holder must still be running when the second one is refused"
    first.communicate(timeout=180)
    assert first.returncode == 0
    counts = sent.counts()
    assert set(counts) == {r["prompt"] for r in rows} and max(counts.values()) == 1  # none paid twice
    assert run(dataset, sim_server.base_url) == 0 and sent.counts() == counts  # the run was freed: resumes
    assert not list((run_dir / ".writer").glob("*.holder"))  # holders leave no trace


def test_two_processes_started_together_one_runs_and_the_other_is_refused(isolated_homes, sim_server):
    rows = prompts(12, "together", latency=0.4)
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    sent = Sent(sim_server)
    both = [start(batch_command(dataset, sim_server.base_url)) for _ in range(2)]
    results = [(process.pid, *process.communicate(timeout=180), process.returncode) for process in both]
    [winner] = [result for result in results if result[3] == 0]
    [loser] = [result for result in results if result[3] != 0]
    assert loser[3] == 2 and "Traceback" not in loser[2], loser[2]
    [line] = [line for line in loser[2].splitlines() if line.startswith("error:")]
    assert f"pid {winner[0]} on" in line
    counts = sent.counts()
    assert set(counts) == {r["prompt"] for r in rows} and max(counts.values()) == 1


def test_a_killed_holder_frees_the_run_at_once(isolated_homes, sim_server):
    rows = prompts(40, "killed", latency=0.4)
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    sent = Sent(sim_server)
    first = start(batch_command(dataset, sim_server.base_url))
    run_dir = isolated_homes / "data" / "rs"
    assert wait_until(lambda: (run_dir / "raw").exists() and len(ledger_records(run_dir)) >= 4, timeout=120)
    first.kill()  # SIGKILL: no clean-up ran, the kernel dropped its locks
    first.communicate(timeout=30)
    assert run(dataset, sim_server.base_url) == 0
    counts = sent.counts()
    assert set(counts) == {r["prompt"] for r in rows}
    assert len([p for p, c in counts.items() if c > 1]) <= 4  # at most the samples in flight at the kill
    assert not list((run_dir / ".writer").glob("*.holder"))  # the dead holder's file was cleared away


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from hermes_core.batch.writer_lock import hold_run
    batches = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    hold_run(Path(sys.argv[1]), batches)
    print("held", flush=True)
    time.sleep(600)
""")


def hold_elsewhere(run_root: Path, *batches: str) -> subprocess.Popen:
    """Another process holding the run (or some of its batches, as a Dagster step over one batch does)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_root), *([",".join(batches)] if batches else [])],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_steps_over_one_batch_run_side_by_side_and_block_the_whole_run(tmp_path: Path):
    run_root = tmp_path / "r1"
    step = hold_elsewhere(run_root, "b00001-a")  # e.g. a sensor-launched batch run
    try:
        with holding(run_root, ["b00002-b"]):  # another batch of the run: side by side
            pass
        with pytest.raises(RunBusy, match=rf"pid {step.pid} on .* has held batch b00001-a since"):
            hold_run(run_root, ["b00001-a"])
        with pytest.raises(RunBusy, match=rf"pid {step.pid} on .* has held batch b00001-a"):
            hold_run(run_root)  # hermes-batch on the whole run
    finally:
        step.kill()
        step.wait()
    with holding(run_root):  # its process is gone: so are its locks
        refused = subprocess.run([sys.executable, "-c", HOLDER, str(run_root), "b00003-c"], capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode != 0 and f"pid {os.getpid()} on" in refused.stderr
    whole = hold_elsewhere(run_root)
    try:
        with pytest.raises(RunBusy, match=rf"pid {whole.pid} on .* has held the whole run"):
            hold_run(run_root, ["b00009-z"])
    finally:
        whole.kill()
        whole.wait()


def test_holds_are_counted_within_a_process_and_released_with_the_last(tmp_path: Path):
    run_root = tmp_path / "r1"
    claim_run(run_root)  # the CLI, for its whole life ...
    with holding(run_root, ["b00001-a"]), holding(run_root):  # ... and the Dagster steps it runs in-process
        pass
    refused = subprocess.run([sys.executable, "-c", HOLDER, str(run_root)], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "RunBusy" in refused.stderr  # still held by the claim
    release_claims()
    again = hold_elsewhere(run_root)  # free again
    again.kill()
    again.wait()


def test_the_holders_command_line_hides_secrets(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/hermes-batch", "--api_key=sk-1", "--api_key", "sk-2", "--max_tokens=5",
                                      "--tool_backend", "HERMES_VISION_API_KEY=sk-3", "--base_url=http://u:pw@h/v1",
                                      "--run_name=r"])
    assert writer_lock._command() == ("hermes-batch --api_key=*** --api_key *** --max_tokens=5 --tool_backend "
                                      "HERMES_VISION_API_KEY=*** --base_url=http://***@h/v1 --run_name=r")
    monkeypatch.setattr(sys, "argv", ["/venv/bin/dagster", "api", "execute_run", '{"instance_ref": {"pw": "x"}}'])
    assert writer_lock._command() == "dagster api execute_run {…"


# The ledger on object storage: another machine shares no flock, so the holder keeps a lease there.


def lease(url: str, host: str, expires_in: float, batches: list[str] | None = None) -> str:
    """A lease object of a holder on another machine; returns its path."""
    fs, root = url_to_fs(url)
    path = f"{root}/{writer_lock.FOLDER}/other-{host}.lease"
    fs.pipe_file(path, json.dumps({"run": "rs", "token": f"other-{host}", "pid": 7, "host": host,
                                   "since": time.time() - 60, "command": "hermes-batch --run_name=rs",
                                   "batches": batches, "expires": time.time() + expires_in}).encode())
    return path


def test_on_object_storage_a_process_on_another_machine_is_refused_by_the_lease(s3_ledger, sim_server, isolated_homes):
    rows = prompts(40, "s3twice", latency=0.4)
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    sent = Sent(sim_server)
    first = start(batch_command(dataset, sim_server.base_url))
    assert wait_until(lambda: len(ObjectLedger(f"{s3_ledger}/rs").latest) >= 4, timeout=120)
    # Another machine: its own run folder (no flock in common), the same bucket.
    line = refused_at_once(batch_command(dataset, sim_server.base_url), first.pid, slack=2.0,  # + an S3 client
                           HERMES_DATA_DIR=str(isolated_homes / "machine2"))
    assert "its lease in" in line
    first.communicate(timeout=180)
    assert first.returncode == 0
    counts = sent.counts()
    assert set(counts) == {r["prompt"] for r in rows} and max(counts.values()) == 1
    fs, root = url_to_fs(f"{s3_ledger}/rs")
    assert not [name for name in fs.find(root) if name.endswith(".lease")]  # released at the end


def test_a_live_lease_refuses_the_run_and_an_expired_one_is_taken_over(s3_ledger, sim_server, isolated_homes, capsys):
    rows = prompts(3, "lease", latency=0.4)
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    sent = Sent(sim_server)
    live = lease(f"{s3_ledger}/rs", "machine2", expires_in=30)
    assert run(dataset, sim_server.base_url) == 2
    err = capsys.readouterr().err
    assert "error: run 'rs' is already running: pid 7 on machine2 has held the whole run since" in err
    assert "Traceback" not in err and not sent.counts()

    fs, _ = url_to_fs(s3_ledger)
    fs.rm(live)
    stale = lease(f"{s3_ledger}/rs", "machine3", expires_in=-1)  # its holder died a while ago
    assert run(dataset, sim_server.base_url) == 0
    assert sent.counts() == {r["prompt"]: 1 for r in rows}
    assert not fs.exists(stale)  # taken over
