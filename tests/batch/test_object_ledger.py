"""The ledger on object storage: unit behaviour on fsspec's memory store, then whole runs against a
real S3 API (moto's server on 127.0.0.1, reached through s3fs like any S3-compatible store)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from fsspec.core import url_to_fs

from hermes_assets.foundry_cli import foundry_main
from hermes_core.config import ledger_location
from hermes_core.batch.ledger import Ledger
from hermes_core.batch.ledgers import has_records, open_ledger
from hermes_core.batch.object_ledger import ObjectLedger, upload_folder_ledger
from s3_server import s3_endpoint, s3_ledger  # noqa: F401  (fixtures)
from batch_runs import Sent, prompts, read_jsonl, record, run, write_dataset
from test_one_writer import hold_elsewhere

BIN = Path(sys.executable).parent


def memory_url() -> str:
    return f"memory://ledgers-{uuid.uuid4().hex[:8]}/run"


def test_each_record_is_one_object_seen_once_by_every_reader() -> None:
    url = memory_url()
    writer, other = ObjectLedger(url), ObjectLedger(url)  # two processes on two machines
    assert not has_records(url)
    writer.append("b00001-x", record("a"))
    other.append("b00002-y", record("b", "b00002-y"))
    writer.append("b00001-x", {**record("a", disposition="failed_retryable"), "row": {"tool_stats": {}}})
    for ledger in (writer.refresh(), other.refresh(), ObjectLedger(url)):
        assert set(ledger.latest) == {"a", "b"} and ledger.spent["api_calls"] == 6
        assert ledger.records_per_partition == {"b00001-x": 2, "b00002-y": 1}
        assert ledger.latest["a"]["disposition"] == "failed_retryable" and ledger.attempts("a") == 1
    assert has_records(url)
    fs, root = url_to_fs(url)
    assert len(fs.find(root)) == 3 and all(name.endswith(".json") for name in fs.find(root))
    assert [key for key, _ in writer.records(["b", "missing", "a"])] == ["b", "a"]
    assert writer.record("a")["row"] == {"tool_stats": {}}


def test_an_older_attempt_seen_late_is_counted_but_is_not_the_state() -> None:
    url = memory_url()
    ledger = ObjectLedger(url)
    ledger.append("b00001-x", record("a", calls=3))
    fs, root = url_to_fs(url)
    late = f"{root}/b00001-x/{0:020d}-slowwriter00-000000.json"  # written before, listed only now
    fs.pipe_file(late, json.dumps(record("a", disposition="failed_retryable")).encode())
    ledger.refresh()
    assert ledger.latest["a"]["disposition"] == "kept" and ledger.spent["api_calls"] == 5
    assert ObjectLedger(url).latest["a"]["disposition"] == "kept"
    # A retry recorded under a partition that sorts first (its plan was rebuilt) is still the latest.
    ledger.append("a00001-rebuilt", {**record("a", "a00001-rebuilt", calls=1), "attempt": 2})
    for reader in (ledger, ObjectLedger(url)):
        assert reader.latest["a"]["partition_key"] == "a00001-rebuilt" and reader.spent["api_calls"] == 6


class LostRace(ObjectLedger):
    """A reader whose next listing was taken before a fold, and whose fetches come after it."""

    stale_listing: list[str] | None = None

    def _list(self, prefix: str) -> list[str]:
        listing, self.stale_listing = self.stale_listing, None
        return listing if listing is not None else super()._list(prefix)


def test_compaction_folds_a_batch_into_one_segment_and_no_reader_counts_twice() -> None:
    url = memory_url()
    writer, early, late = ObjectLedger(url), ObjectLedger(url), LostRace(url)
    for key, calls in (("a", 1), ("b", 2), ("c", 3)):
        writer.append("b00001-x", record(key, calls=calls))
    writer.append("b00001-x", {**record("a", calls=10), "row": {"tool_stats": {"t": 1}}})  # a's retry
    early.refresh()  # counted the loose objects before they were folded
    unaware = ObjectLedger(url)  # will read a record whose object was deleted since it looked
    fs, root = url_to_fs(url)
    late.stale_listing = fs.find(root)
    assert writer.compact("b00001-x") == 4 and writer.compact("b00001-x") == 0
    [segment] = fs.find(root)
    assert segment.rsplit("/", 1)[-1].startswith("segment-")
    for reader in (writer, early.refresh(), late.refresh(), ObjectLedger(url)):
        assert set(reader.latest) == {"a", "b", "c"} and reader.spent["api_calls"] == 16
        assert reader.records_per_partition == {"b00001-x": 4}
        assert reader.record("a")["row"] == {"tool_stats": {"t": 1}}  # read from the segment
    assert unaware.record("b")["api_calls"] == 2 and unaware.spent["api_calls"] == 16
    writer.append("b00001-x", record("d"))
    assert set(ObjectLedger(url).latest) == {"a", "b", "c", "d"}  # a segment and a loose object


def test_an_uploaded_folder_ledger_keeps_every_samples_state_and_spend(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    local = Ledger(raw)
    local.append("b00001-x", {**record("a", disposition="failed_retryable"), "attempt": 1})
    local.append("b00001-x", {**record("b"), "attempt": 1})
    local.append("a00001-rebuilt", {**record("a", "a00001-rebuilt", calls=5), "attempt": 2})  # sorts first
    local.append("b00002-y", record("c", "b00002-y", disposition="discarded"))  # from before attempts
    expected = {key: summary["disposition"] for key, summary in local.latest.items()}
    url = memory_url()
    assert upload_folder_ledger(raw, url) == 4 and not raw.exists()
    reader = ObjectLedger(url)
    assert {key: summary["disposition"] for key, summary in reader.latest.items()} == expected
    assert reader.spent == local.spent and reader.attempts("a") == 1
    assert reader.record("a")["partition_key"] == "a00001-rebuilt"
    ObjectLedger(url).append("b00001-x", {**record("b", disposition="failed_terminal"), "attempt": 2})
    assert ObjectLedger(url).latest["b"]["disposition"] == "failed_terminal"  # new records rank after


def test_ledger_location_follows_hermes_ledger_url(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HERMES_LEDGER_URL", raising=False)
    assert ledger_location(tmp_path / "r1") == tmp_path / "r1" / "raw"
    monkeypatch.setenv("HERMES_LEDGER_URL", "s3://bucket/ledgers/")
    assert ledger_location(tmp_path / "r1") == "s3://bucket/ledgers/r1"
    monkeypatch.setenv("HERMES_LEDGER_URL", f"file://{tmp_path}/shared")
    assert ledger_location(tmp_path / "r1") == tmp_path / "shared" / "r1"
    monkeypatch.setenv("HERMES_LEDGER_URL", "bucket/ledgers")
    with pytest.raises(ValueError, match="HERMES_LEDGER_URL='bucket/ledgers': expected a URL"):
        ledger_location(tmp_path / "r1")
    assert isinstance(open_ledger(memory_url()), ObjectLedger)


def test_a_run_killed_mid_way_resumes_from_s3_after_its_run_folder_is_lost(s3_ledger, sim_server, isolated_homes):
    rows = [{"prompt": r["prompt"] + " [sim:latency=0.05]"} for r in prompts(80, "s3")]
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    sent = Sent(sim_server)
    batch = subprocess.Popen(
        [str(BIN / "hermes-batch"), f"--dataset_file={dataset}", "--run_name=rs", f"--base_url={sim_server.base_url}",
         "--distribution=terminal_only", "--batch_size=20", "--num_workers=4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and batch.poll() is None and len(ObjectLedger(f"{s3_ledger}/rs").latest) < 20:
        time.sleep(0.2)
    batch.send_signal(signal.SIGKILL)
    batch.wait(timeout=10)
    recorded_at_kill = len(ObjectLedger(f"{s3_ledger}/rs").latest)
    assert 20 <= recorded_at_kill < 80, "the kill must land mid-run"

    run_dir = isolated_homes / "data" / "rs"
    assert not (run_dir / "raw").exists()  # the ledger went to the bucket only
    shutil.rmtree(run_dir)  # the pod (or the volume) is gone; the bucket is not
    assert run(dataset, sim_server.base_url) == 0
    output = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(output) == 80 and [r["prompt_index"] for r in output] == list(range(80))
    counts = sent.counts()
    assert set(counts) == {r["prompt"] for r in rows}
    assert len([p for p, c in counts.items() if c > 1]) <= 4  # at most the samples in flight at the kill
    ledger = ObjectLedger(f"{s3_ledger}/rs")
    assert len(ledger.latest) == 80 and sum(ledger.records_per_partition.values()) == 80  # one record each
    fs, root = url_to_fs(f"{s3_ledger}/rs")
    planned = {b["key"] for b in json.loads((run_dir / "batches.json").read_text())["batches"]}
    folded = [name for name in fs.find(root) if name.split("/")[-2] in planned]
    assert folded and all(name.rsplit("/", 1)[-1].startswith("segment-") for name in folded)  # one object per batch
    assert run(dataset, sim_server.base_url) == 0  # and once more: nothing is sent
    assert sum(sent.counts().values()) == sum(counts.values())


def test_a_run_begun_in_its_folder_moves_to_the_bucket_without_paying_twice(s3_ledger, sim_server, isolated_homes,
                                                                            monkeypatch, capsys):
    rows = prompts(6, "moved")
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    monkeypatch.delenv("HERMES_LEDGER_URL")
    assert run(dataset, sim_server.base_url) == 0  # the ledger in the run folder
    monkeypatch.setenv("HERMES_LEDGER_URL", s3_ledger)
    sent = Sent(sim_server)
    assert run(dataset, sim_server.base_url) == 2
    assert "hermes-foundry ledger-upload --run_name rs" in capsys.readouterr().err and not sent.counts()

    run_dir = isolated_homes / "data" / "rs"
    holder = hold_elsewhere(run_dir)  # a run still writing the folder's ledger: copying now would lose records
    try:
        assert foundry_main(["ledger-upload", "--run_name=rs"]) == 2
        assert f"is already running: pid {holder.pid} on" in capsys.readouterr().err
        assert (run_dir / "raw").is_dir() and not list(run_dir.glob("raw.uploaded-*"))
    finally:
        holder.kill()
        holder.wait()
    assert foundry_main(["ledger-upload", "--run_name=rs"]) == 0
    assert "copied 6 record(s)" in capsys.readouterr().out
    assert not (run_dir / "raw").exists() and len(list(run_dir.glob("raw.uploaded-*"))) == 1
    assert run(dataset, sim_server.base_url) == 0 and not sent.counts()  # every sample was already done
    assert len(read_jsonl(run_dir / "trajectories.jsonl")) == 6
    assert len(ObjectLedger(f"{s3_ledger}/rs").latest) == 6
