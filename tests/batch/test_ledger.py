"""The ledger reads each appended byte once, shared within a process, and never counts a record twice."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hermes_core.batch.ledger import Ledger
from hermes_core.batch.ledgers import open_ledger
from batch_runs import record


def test_appends_from_this_and_other_processes_are_each_counted_once(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    ledger = open_ledger(raw)
    ledger.append("b00001-x", record("a"))
    with open(raw / "b00001-x.jsonl", "a") as other:  # another process appends to the same file
        other.write(json.dumps(record("b")) + "\n")
    ledger.append("b00001-x", record("c"))
    assert open_ledger(raw) is ledger
    assert set(ledger.latest) == {"a", "b", "c"} and ledger.spent["api_calls"] == 6
    assert ledger.records_per_partition == {"b00001-x": 3}
    fresh = Ledger(raw)
    assert fresh.latest == ledger.latest and fresh.spent == ledger.spent


def test_records_appended_together_take_one_fsync_per_file_and_keep_their_order(tmp_path: Path, monkeypatch) -> None:
    raw = tmp_path / "raw"
    ledger = open_ledger(raw)
    ledger.append("b00001-x", record("a"))
    with open(raw / "b00001-x.jsonl", "a") as other:  # another process appended in between
        other.write(json.dumps(record("b")) + "\n")
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    ledger.append_many([("b00001-x", record("c")), ("b00002-y", record("d", "b00002-y")),
                        ("b00001-x", record("e", calls=5)), ("b00002-y", record("f", "b00002-y"))])
    assert len(synced) == 2  # one per file
    assert [json.loads(line)["sample_key"] for line in (raw / "b00001-x.jsonl").read_text().splitlines()] == \
        ["a", "b", "c", "e"]
    assert [json.loads(line)["sample_key"] for line in (raw / "b00002-y.jsonl").read_text().splitlines()] == ["d", "f"]
    assert set(ledger.latest) == set("abcdef") and ledger.records_per_partition == {"b00001-x": 4, "b00002-y": 2}
    fresh = Ledger(raw)
    assert fresh.latest == ledger.latest and fresh.spent == ledger.spent
    assert [ledger.record(key)["sample_key"] for key in "abcdef"] == list("abcdef")  # read back from their offsets


def test_a_torn_line_waits_and_a_replaced_file_is_read_again(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    ledger = open_ledger(raw)
    ledger.append("b00002-y", record("a", "b00002-y"))
    path = raw / "b00002-y.jsonl"
    line = json.dumps(record("b", "b00002-y", calls=5))
    with open(path, "a") as writer:
        writer.write(line[:10])  # a crash mid-write
    assert set(open_ledger(raw).latest) == {"a"}
    with open(path, "a") as writer:
        writer.write(line[10:] + "\n")  # the writer finished after all
    assert set(open_ledger(raw).latest) == {"a", "b"} and ledger.spent["api_calls"] == 7
    path.write_text(json.dumps(record("z", "b00002-y", calls=1)) + "\n")  # replaced: a new inode
    assert set(open_ledger(raw).latest) == {"z"} and ledger.spent["api_calls"] == 1
    path.unlink()
    assert open_ledger(raw).latest == {} and ledger.records_per_partition == {}


def test_memory_holds_summaries_and_whole_records_are_read_back_from_disk(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    ledger = open_ledger(raw)
    trajectory = {"conversations": [{"from": "human", "value": "x" * 5000}], "tool_stats": {"terminal": {"count": 1}}}
    ledger.append("b00003-z", {**record("a", "b00003-z"), "row": trajectory, "messages": [{"role": "user"}]})
    ledger.append("b00003-z", record("b", "b00003-z", disposition="failed_retryable"))
    ledger.append("b00003-z", {**record("b", "b00003-z"), "row": trajectory})  # b's retry supersedes it
    summary = ledger.latest["a"]
    assert "row" not in summary and "messages" not in summary
    assert summary["has_row"] and summary["tool_stats"] == {"terminal": {"count": 1}}
    assert [key for key, _ in ledger.records(["b", "missing", "a"])] == ["b", "a"]
    assert ledger.record("a")["row"] == trajectory and ledger.record("b")["disposition"] == "kept"
    assert ledger.record("missing") is None


def test_a_later_attempt_is_the_state_whichever_file_is_read_first(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    ledger = open_ledger(raw)
    ledger.append("b00001-x", {**record("a", disposition="failed_retryable", calls=1), "attempt": 1})
    # The plan was rebuilt: the retry went to a batch whose file sorts before the first one's.
    ledger.append("a00001-rebuilt", {**record("a", "a00001-rebuilt", calls=2), "attempt": 2})
    for reader in (ledger, Ledger(raw)):
        assert reader.latest["a"]["disposition"] == "kept" and reader.is_done("a")
        assert reader.spent["api_calls"] == 3 and reader.attempts("a") == 1
        assert reader.record("a")["partition_key"] == "a00001-rebuilt"
