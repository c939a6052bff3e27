"""A torn ledger line (issue 17, item 4): a crash mid-write leaves the last line of a `raw/*.jsonl`
without its end. Every reader skips and reports it (file and byte offset), the next append cuts it
off, a damaged line in the middle is reported with its file and line, and no run ever stops on one."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from fsspec.core import url_to_fs

from hermes_assets.checks import _parse_rows
from hermes_core.batch.ledger import Ledger
from hermes_core.batch.object_ledger import ObjectLedger, upload_folder_ledger
from hermes_core.batch.pipeline import RunPaths, last_stop, read_invocations
from hermes_core.fileio import read_jsonl
from batch_runs import Sent, prompts, record, run, write_dataset

BIN = Path(sys.executable).parent


@pytest.fixture()
def said(caplog) -> pytest.LogCaptureFixture:
    """What readers and writers reported (`said.messages`)."""
    caplog.set_level(logging.WARNING, logger="hermes_core.fileio")
    return caplog


def tear(path: Path) -> tuple[int, bytes]:
    """Cut the file's last line in half, as a crash mid-write would; returns where it starts and the line."""
    data = path.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(data[: start + (len(data) - start) // 2])
    return start, data[start:]


def whole_lines(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def batch(dataset: Path, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "hermes-batch"), f"--dataset_file={dataset}", "--run_name=rs", f"--base_url={url}",
                           "--distribution=terminal_only", "--batch_size=20", "--num_workers=4"],
                          capture_output=True, text=True, timeout=300)


def test_a_torn_last_line_costs_its_sample_once_and_the_next_two_runs_exit_0(isolated_homes, sim_server):
    rows = prompts(8, "torn")
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    assert run(dataset, sim_server.base_url) == 0
    [raw] = (isolated_homes / "data" / "rs" / "raw").glob("*.jsonl")
    offset, torn = tear(raw)
    sent = Sent(sim_server)

    first = batch(dataset, sim_server.base_url)
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    assert f"warning: {raw}: torn last line at byte {offset} (" in first.stderr
    assert f"warning: {raw}: cut off a torn last line (" in first.stderr
    assert sent.counts() == Counter({rows[json.loads(torn)["prompt_index"]]["prompt"]: 1})  # the torn sample only
    assert len(whole_lines(raw)) == 8  # repaired: every line whole, one record per sample

    second = batch(dataset, sim_server.base_url)
    assert second.returncode == 0 and "warning" not in second.stderr, second.stderr
    assert sum(sent.counts().values()) == 1  # nothing more was sent
    assert len((isolated_homes / "data" / "rs" / "trajectories.jsonl").read_text().splitlines()) == 8


def test_a_record_glued_onto_a_torn_line_is_reported_and_skipped(isolated_homes, sim_server):
    """What the old writer left: the torn sample's retry appended onto the fragment, which wedged the run."""
    rows = prompts(6, "glued")
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    assert run(dataset, sim_server.base_url) == 0
    [raw] = (isolated_homes / "data" / "rs" / "raw").glob("*.jsonl")
    _, last = tear(raw)
    with raw.open("ab") as handle:
        handle.write(last)  # glued onto the fragment: line 6 is no JSON
    glued_prompt = rows[json.loads(last)["prompt_index"]]["prompt"]
    sent = Sent(sim_server)

    first = batch(dataset, sim_server.base_url)
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    assert f"warning: {raw}: line 6 (byte " in first.stderr and "is not a record, skipped" in first.stderr
    assert sent.counts() == Counter({glued_prompt: 1})
    second = batch(dataset, sim_server.base_url)
    assert second.returncode == 0 and "Traceback" not in second.stderr
    assert sum(sent.counts().values()) == 1


def test_the_ledger_reports_a_torn_line_with_its_offset_and_the_next_append_cuts_it_off(tmp_path: Path, said):
    raw = tmp_path / "raw"
    writer = Ledger(raw)
    writer.append("b00001-x", record("a"))
    path = raw / "b00001-x.jsonl"
    whole = path.stat().st_size
    with path.open("ab") as handle:
        handle.write(json.dumps(record("b", calls=7)).encode()[:20])  # a crash mid-write
    reader = Ledger(raw)
    assert set(reader.latest) == {"a"} and reader.spent["api_calls"] == 2
    assert said.messages == [f"warning: {path}: torn last line at byte {whole} (20 bytes, a crash mid-write?), skipped"]

    Ledger(raw).append("b00001-x", record("b", calls=5))  # the retry of b, by the next run
    assert f"warning: {path}: cut off a torn last line (20 bytes at byte {whole}, a crash mid-write) before appending" \
        in said.messages
    assert [r["sample_key"] for r in whole_lines(path)] == ["a", "b"]
    for ledger in (reader.refresh(), Ledger(raw)):  # the reader that saw the fragment, and a fresh one
        assert set(ledger.latest) == {"a", "b"} and ledger.spent["api_calls"] == 7
        assert ledger.record("b")["api_calls"] == 5


def test_a_damaged_line_in_the_middle_is_reported_with_its_line_and_skipped(tmp_path: Path, said):
    raw = tmp_path / "raw"
    raw.mkdir()
    path = raw / "b00001-x.jsonl"
    path.write_text(json.dumps(record("a")) + "\n" + '{"sample_key": "b", "partiti{"x": 1}\n' + "[1, 2]\n"
                    + '{"x": 1}\n' + json.dumps(record("c")) + "\n")
    ledger = Ledger(raw)
    assert set(ledger.latest) == {"a", "c"}
    assert ledger.record("c")["sample_key"] == "c"  # offsets past the damage are right
    text = path.read_text()
    offsets = [text.index('{"sample_key": "b"'), text.index("[1, 2]"), text.index('\n{"x"') + 1]
    assert [message.split(", skipped (")[0] for message in said.messages] == [
        f"warning: {path}: line {number} (byte {offset}) is not a record" for number, offset in zip((2, 3, 4), offsets)]
    assert said.messages[1].endswith("(a JSON list)") and said.messages[2].endswith("(no 'sample_key')")
    ledger.append("b00001-x", record("d"))  # appends after it, and reads on from where it was
    assert set(ledger.refresh().latest) == {"a", "c", "d"} and ledger.records_per_partition == {"b00001-x": 3}


def test_read_jsonl_and_the_last_stop_survive_a_torn_invocation(tmp_path: Path, said):
    paths = RunPaths(tmp_path / "r1")
    paths.root.mkdir()
    paths.invocations.write_text(json.dumps({"started": 1, "finished": 2, "stopped": "a budget"}) + "\n"
                                 + '{"started": 3, "fini')
    assert last_stop(paths) == "a budget" and len(read_invocations(paths)) == 1
    assert list(read_jsonl(paths.invocations)) == read_invocations(paths)
    assert len(said.messages) == 1 and "torn last line at byte" in said.messages[0]


def test_object_storage_segments_and_objects_with_damage_are_reported_and_skipped(said):
    url = "memory://ledgers-damaged/run"
    writer = ObjectLedger(url)
    for key in ("a", "b", "c"):
        writer.append("b00001-x", record(key))
    assert writer.compact("b00001-x") == 3
    fs, root = url_to_fs(url)
    [segment] = fs.find(root)
    lines = fs.cat_file(segment).split(b"\n")
    lines[2] = lines[2][:15]  # b's record damaged in the segment
    fs.pipe_file(segment, b"\n".join(lines)[:-5])  # and its last line torn
    fs.pipe_file(f"{root}/b00001-x/{99 * 10**17:020d}-broken000000-000000.json", b'{"sample_key": "d", "parti')
    reader = ObjectLedger(url)
    assert set(reader.latest) == {"a"} and reader.record("a")["sample_key"] == "a"
    assert any(f"{segment}: line 3 (byte" in m for m in said.messages)
    assert any(f"{segment}: torn last line at byte" in m for m in said.messages)
    assert any("broken000000-000000.json: line 1 (byte 0)" in m for m in said.messages)


def test_an_upload_copies_whole_records_only(tmp_path: Path, said):
    raw = tmp_path / "raw"
    Ledger(raw).append("b00001-x", record("a"))
    with (raw / "b00001-x.jsonl").open("a") as handle:
        handle.write("not json\n" + json.dumps(record("b"))[:30])
    assert upload_folder_ledger(raw, "memory://ledgers-upload/run") == 1
    assert set(ObjectLedger("memory://ledgers-upload/run").latest) == {"a"} and len(said.messages) == 2


def test_the_checks_line_reader_counts_a_torn_line_as_unreadable(tmp_path: Path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps({"sample_key": "a"}) + "\n" + '{"sample_key": "b", "conv')
    assert _parse_rows(path) == ([{"sample_key": "a"}], 1)
