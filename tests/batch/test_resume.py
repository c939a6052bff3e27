"""Exact resume, counted at the endpoint: what each invocation sent to the model (issue 4)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import dagster as dg

from batch_runs import Sent, ledger_records, prompts, read_jsonl, run, write_dataset

BIN = Path(sys.executable).parent


def test_kill_9_mid_run_then_rerun_gives_every_prompt_exactly_once(isolated_homes, sim_server):
    rows = [{"prompt": r["prompt"] + " [sim:latency=0.05]"} for r in prompts(200, "crash")]
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    sent = Sent(sim_server)
    run_dir = isolated_homes / "data" / "rs"
    batch = subprocess.Popen(
        [str(BIN / "hermes-batch"), f"--dataset_file={dataset}", "--run_name=rs", f"--base_url={sim_server.base_url}",
         "--distribution=terminal_only", "--batch_size=20", "--num_workers=4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and batch.poll() is None:
        if (run_dir / "raw").exists() and len(ledger_records(run_dir)) >= 60:
            break
        time.sleep(0.05)
    batch.send_signal(signal.SIGKILL)
    batch.wait(timeout=10)
    recorded_at_kill = len(ledger_records(run_dir))
    assert 60 <= recorded_at_kill < 200, "the kill must land mid-run"

    assert run(dataset, sim_server.base_url) == 0
    output = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(output) == 200 and len({r["sample_key"] for r in output}) == 200
    assert [r["prompt_index"] for r in output] == list(range(200))
    counts = sent.counts()
    assert set(counts) == {r["prompt"] for r in rows}
    resent = [p for p, c in counts.items() if c > 1]
    assert len(resent) <= 4  # at most the samples in flight at the kill (num_workers)
    assert max(counts.values()) <= 2


def test_shuffle_insert_and_append_send_exactly_the_new_samples(isolated_homes, sim_server):
    rows = prompts(60, "edit")
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    assert run(dataset, sim_server.base_url) == 0
    inserted, appended = prompts(10, "inserted"), prompts(20, "appended")
    shuffled = rows[:]
    random.Random(7).shuffle(shuffled)
    edited = shuffled[:30] + inserted + shuffled[30:] + appended
    write_dataset(dataset, edited)
    sent = Sent(sim_server)
    assert run(dataset, sim_server.base_url) == 0
    assert sent.counts() == Counter({r["prompt"]: 1 for r in inserted + appended})
    output = read_jsonl(isolated_homes / "data" / "rs" / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in output] == [r["prompt"] for r in edited]


def test_identical_prompts_are_distinct_samples_and_survive_resume(isolated_homes, sim_server):
    same = prompts(1, "same")[0]
    dataset = write_dataset(isolated_homes / "d.jsonl", [same, same, same])
    sent = Sent(sim_server)
    assert run(dataset, sim_server.base_url) == 0
    assert run(dataset, sim_server.base_url) == 0
    output = read_jsonl(isolated_homes / "data" / "rs" / "trajectories.jsonl")
    assert len(output) == 3 and len({r["sample_key"] for r in output}) == 3
    assert sent.counts() == Counter({same["prompt"]: 3})


def test_failures_retry_only_themselves_then_become_terminal(isolated_homes, sim_server):
    good, bad = prompts(5, "good"), [{"prompt": f"bad {uuid.uuid4().hex[:6]} [sim:always-fail]"}]
    dataset = write_dataset(isolated_homes / "d.jsonl", good + bad)
    sent = Sent(sim_server)
    raw_key = dg.AssetKey(["rs", "raw_trajectories"])
    for attempt in (1, 2):
        assert run(dataset, sim_server.base_url) == 1  # samples remain failed: non-zero exit
        assert dg.DagsterInstance.get().get_materialized_partitions(raw_key) == set()  # the batch shows failed
    assert run(dataset, sim_server.base_url) == 0  # third attempt: failed_terminal, the batch materializes
    assert len(dg.DagsterInstance.get().get_materialized_partitions(raw_key)) == 1
    counts = sent.counts()
    assert counts[bad[0]["prompt"]] == 3 and all(counts[g["prompt"]] == 1 for g in good)
    stats = json.loads((isolated_homes / "data" / "rs" / "statistics.json").read_text())
    assert stats["counts"]["failed_terminal"] == 1 and stats["counts"]["kept"] == 5
    output = read_jsonl(isolated_homes / "data" / "rs" / "trajectories.jsonl")
    assert bad[0]["prompt"] not in {r["conversations"][1]["value"] for r in output}
    assert run(dataset, sim_server.base_url) == 0 and sent.counts() == counts  # terminal: never re-sent


def test_discarded_samples_are_counted_and_never_resent(isolated_homes, sim_server):
    tag = uuid.uuid4().hex[:6]
    rows = prompts(3, "kept") + [{"prompt": f"{tag} a [sim:no-reasoning]"}, {"prompt": f"{tag} b [sim:no-reasoning]"},
                                 {"prompt": f"{tag} c: run ls [sim:hallucinate]"}]
    dataset = write_dataset(isolated_homes / "d.jsonl", rows)
    sent = Sent(sim_server)
    assert run(dataset, sim_server.base_url) == 0
    assert run(dataset, sim_server.base_url) == 0
    assert sent.counts() == Counter({r["prompt"]: 1 for r in rows})
    counts = json.loads((isolated_homes / "data" / "rs" / "statistics.json").read_text())["counts"]
    assert (counts["kept"], counts["discarded_no_reasoning"], counts["discarded_hallucinated_tool"]) == (3, 2, 1)


def test_statistics_cover_the_whole_run_across_invocations(isolated_homes, sim_server):
    first, second = prompts(7, "one"), prompts(5, "two")
    dataset = write_dataset(isolated_homes / "d.jsonl", first)
    assert run(dataset, sim_server.base_url) == 0
    write_dataset(dataset, first + second + [{"prompt": "x [sim:no-reasoning]"}])
    assert run(dataset, sim_server.base_url) == 0
    stats = json.loads((isolated_homes / "data" / "rs" / "statistics.json").read_text())
    counts = stats["counts"]
    assert stats["total_prompts"] == 13
    assert sum(v for k, v in counts.items() if k != "invalid_input_lines") == 13
    assert counts["kept"] == 12 and counts["pending"] == 0
    assert stats["api_calls"] == 2 * 13  # one tool round + the answer, for every sample of both invocations


def test_a_replan_keeps_the_saved_prompt_table_unless_its_source_changed(isolated_homes, monkeypatch):
    """Every command plans again; a prompt table already saved from the same file and recipe is not
    rewritten (100k rows: ~0.25 s). Any change to what it was built from, or to the file itself, is."""
    from hermes_core.batch import prompt_table

    # A dataset file is vouched for once its change time is RACY_S old, which rewrites dataset.json
    # once: here at once, so that no replan below depends on how long the previous one took.
    monkeypatch.setattr(prompt_table, "RACY_S", 0.0)
    given = prompts(5, "table")
    dataset = write_dataset(isolated_homes / "d.jsonl", given[:4])
    run_dir = isolated_homes / "data" / "rs"
    table, info = run_dir / "prompts.jsonl", run_dir / "dataset.json"

    def plan(*extra: str) -> tuple[list[dict], dict, tuple[int, int]]:
        assert run(dataset, "http://127.0.0.1:9/v1", "--plan_only", *extra) == 0
        return read_jsonl(table), json.loads(info.read_text()), (table.stat().st_mtime_ns, info.stat().st_mtime_ns)

    rows, saved, written = plan()
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in given[:4]] and saved["rows"] == 4
    assert plan() == (rows, saved, written)  # the same table, not written again

    assert len(plan("--max_samples=2")[0]) == 2  # another recipe: another table
    assert plan()[0] == rows

    table.write_text(table.read_text().replace("#0", "#9"))  # the table itself changed
    assert plan()[0] == rows

    write_dataset(dataset, given)  # the dataset changed
    rows, saved, _ = plan()
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in given] and saved["rows"] == 5


def test_a_new_command_plans_from_the_saved_table_while_the_dataset_file_is_unchanged(isolated_homes, monkeypatch):
    """A command (its process's caches empty) reads prompts.jsonl back instead of validating and keying
    the dataset again when dataset.json vouches that the table was made from this very file (device,
    inode, size, mtime, change time) with this keying. An edit that keeps the size and mtime still
    changes the change time, so the file is loaded again; so is one changed too recently to tell."""
    from hermes_core.batch import dataset as dataset_module, prompt_table
    from hermes_core.fileio import FileTableCache

    given = prompts(4, "vouched")
    dataset = write_dataset(isolated_homes / "d.jsonl", given)
    run_dir = isolated_homes / "data" / "rs"
    loads: list[Path] = []
    real_load = dataset_module._load
    monkeypatch.setattr(dataset_module, "_load", lambda path, *a: loads.append(path) or real_load(path, *a))

    def new_command(*extra: str) -> tuple[int, list[str], dict]:
        """A plan as a new process makes it: nothing cached."""
        for cache in (dataset_module._loaded, prompt_table.tables):
            monkeypatch.setattr(cache, "_entries", FileTableCache()._entries)
        before = len(loads)
        assert run(dataset, "http://127.0.0.1:9/v1", "--plan_only", *extra) == 0
        rows = [row["prompt"] for row in read_jsonl(run_dir / "prompts.jsonl")]
        return len(loads) - before, rows, json.loads((run_dir / "dataset.json").read_text())

    monkeypatch.setattr(prompt_table, "RACY_S", 0.0)  # the file just written counts as settled
    loaded, rows, saved = new_command()
    assert loaded == 1 and rows == [row["prompt"] for row in given] and saved["source_file"]["size"] > 0
    assert new_command()[:2] == (0, rows)  # read back, not loaded
    assert new_command("--max_samples=2")[:2] == (1, rows[:2])  # another keying: loaded

    stat = dataset.stat()
    dataset.write_text(dataset.read_text().replace("vouched #0", "vouched #9"))  # same size...
    os.utime(dataset, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ...and mtime: only the change time differs
    assert dataset.stat().st_size == stat.st_size and dataset.stat().st_mtime_ns == stat.st_mtime_ns
    loaded, rows, _ = new_command()
    assert loaded == 1 and rows[0] == given[0]["prompt"].replace("vouched #0", "vouched #9")

    monkeypatch.setattr(prompt_table, "RACY_S", 3600.0)  # every change now "too recent" to vouch for
    write_dataset(dataset, given)
    loaded, _, saved = new_command()
    assert loaded == 1 and saved["source_file"] is None
    assert new_command()[0] == 1
