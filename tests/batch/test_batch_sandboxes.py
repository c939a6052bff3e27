"""Sandboxes seen from a batch run: images and cwd per row, pre-flight, crash safety, reaping."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from hermes_assets.cli import batch_main
from batch_runs import ledger_records, read_jsonl, write_dataset
from leftover_trees import BUILD_COMMAND, dead_owner_session, immutable, no_deep_tree_left  # noqa: F401 (fixture)
from procs import marker, processes_with

BIN = Path(sys.executable).parent
TEST_IMAGE = "hermes-test/bookworm:latest"


def run(dataset: Path, url: str, *extra: str, run_name: str = "sb") -> int:
    return batch_main([f"--dataset_file={dataset}", f"--run_name={run_name}", f"--base_url={url}", "--api_key=k",
                       "--distribution=terminal_only", "--max_retries=0", *extra])


def tool_outputs(rows: list[dict]) -> list[str]:
    return [turn["value"] for row in rows for turn in row["conversations"] if turn["from"] == "tool"]


@pytest.fixture()
def local_images(isolated_homes, monkeypatch):
    import contract_backends.local as local_contract

    backend = local_contract.make_backend(isolated_homes)  # skips only where no rootfs can exist
    monkeypatch.setenv("HERMES_SANDBOX_IMAGE_ROOT", str(backend.settings.image_root))
    monkeypatch.setenv("HERMES_SANDBOX_STATE_ROOT", str(isolated_homes / "sandboxes"))
    return backend


@pytest.mark.parametrize("backend_name", ["local", "docker"])
def test_a_row_with_image_and_cwd_runs_its_tools_inside_that_image(isolated_homes, sim_url, monkeypatch, backend_name):
    monkeypatch.setenv("HERMES_SANDBOX_STATE_ROOT", str(isolated_homes / "sandboxes"))
    contract = __import__(f"contract_backends.{backend_name}", fromlist=["make_backend"])
    backend = contract.make_backend(isolated_homes)
    if backend.settings.image_root:
        monkeypatch.setenv("HERMES_SANDBOX_IMAGE_ROOT", str(backend.settings.image_root))
    dataset = write_dataset(isolated_homes / "d.jsonl", [
        {"prompt": "Where am I? [sim:command=pwd && grep VERSION_CODENAME /etc/os-release]",
         "image": TEST_IMAGE, "cwd": "/srv/app"},
        {"prompt": "And here? [sim:command=pwd]"} if backend_name == "local" else
        {"prompt": "And here? [sim:command=pwd]", "image": TEST_IMAGE},
    ])
    assert run(dataset, sim_url, f"--sandbox_backend={backend_name}") == 0
    run_dir = isolated_homes / "data" / "sb"
    outputs = tool_outputs(read_jsonl(run_dir / "trajectories.jsonl"))
    assert "/srv/app" in outputs[0] and "VERSION_CODENAME=bookworm" in outputs[0]
    assert "/workspace" in outputs[1]
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["sandbox"]["backend"] == backend_name and stats["sandbox"]["created"] == 2
    assert stats["sandbox"]["failed"] == 0


def test_missing_images_stop_the_run_at_preflight_listing_all(isolated_homes, sim_url, local_images, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", [
        {"prompt": "ok", "image": TEST_IMAGE},
        {"prompt": "a", "image": "nosuch/one:1"},
        {"prompt": "b", "image": "nosuch/two:2"},
    ])
    assert run(dataset, sim_url) != 0
    err = capsys.readouterr().err
    assert "pre-flight" in err and "nosuch/one:1" in err and "nosuch/two:2" in err
    assert TEST_IMAGE not in err.split("pre-flight", 1)[1]
    assert ledger_records(isolated_homes / "data" / "sb") == []


def test_kill_9_of_the_orchestrator_leaves_no_sandbox_process_and_the_next_run_reaps(
        isolated_homes, sim_server, local_images):
    tag = marker()
    # With an image, a session is a bubblewrap of its own whose state folder (in this test's state root)
    # exists from its start: the count below is of those. The slot cgroups, named for the crashed run,
    # can be reaped first by a run on the other test worker. (Without an image, test_sandbox_bubblewrap.)
    dataset = write_dataset(isolated_homes / "d.jsonl", [
        {"prompt": f"Wait [sim:command=sleep {tag}]", "image": TEST_IMAGE},
        {"prompt": f"Wait more [sim:command=sleep {tag}]", "image": TEST_IMAGE}])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    batch = subprocess.Popen(
        [str(BIN / "hermes-batch"), f"--dataset_file={dataset}", "--run_name=crash", f"--base_url={sim_server.base_url}",
         "--distribution=terminal_only", "--num_workers=2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=False)
    try:
        deadline = time.monotonic() + 60
        sleeping = lambda: [p for p in processes_with(f"sleep {tag}") if p.startswith("sleep")]  # noqa: E731
        while len(sleeping()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(sleeping()) == 2, "the sandboxed commands never started"
        batch.send_signal(signal.SIGKILL)
        batch.wait(timeout=10)
        deadline = time.monotonic() + 10
        while processes_with(f"sleep {tag}") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_with(f"sleep {tag}") == []
    finally:
        if batch.poll() is None:
            batch.kill()

    from hermes_core.sandbox.cgroups import detect, session_names

    hierarchy = detect()
    crashed = lambda: [n for n in session_names(hierarchy) if n.startswith(f"o{batch.pid}-")] if hierarchy else []  # noqa: E731
    quick = write_dataset(isolated_homes / "q.jsonl", [{"prompt": "hi [sim:command=true]"}])
    assert run(quick, sim_server.base_url, run_name="after") == 0
    stats = json.loads((isolated_homes / "data" / "after" / "statistics.json").read_text())
    # At least the crashed run's two sandboxes (a run on the other test worker may have died too).
    assert stats["sandbox"]["reaped_leftovers"] >= 2 and crashed() == []
    assert not any((isolated_homes / "sandboxes").iterdir()) if (isolated_homes / "sandboxes").exists() else True


def test_a_rows_image_never_leaves_the_image_root(isolated_homes, sim_url, monkeypatch, capsys):
    """Issue 17: `image: ".."` ran the sample on the parent of the image root (the host's `/` when the
    root is a top-level folder) and the canary outside the root landed in trajectories.jsonl."""
    from rootfs import tiny_rootfs

    canary = f"CANARY-{uuid.uuid4().hex}"
    outer = tiny_rootfs(isolated_homes, "outer")  # `..` of the image root: a runnable root filesystem
    (outer / "canary.txt").write_text(canary + "\n")
    (outer / "images").mkdir()
    (outer / "images" / "escape_1").symlink_to(outer)  # a link leading out of the image root
    monkeypatch.setenv("HERMES_SANDBOX_IMAGE_ROOT", str(outer / "images"))
    monkeypatch.setenv("HERMES_SANDBOX_STATE_ROOT", str(isolated_homes / "sandboxes"))
    cat = "Show it [sim:command=cat /canary.txt]"
    dataset = write_dataset(isolated_homes / "d.jsonl", [
        {"prompt": cat, "image": ".."}, {"prompt": cat + " again", "image": "escape:1"}])
    assert run(dataset, sim_url) != 0
    err = capsys.readouterr().err
    assert "pre-flight" in err and "image '..'" in err and "image 'escape:1'" in err
    assert "not an image reference" in err and "outside the image root" in err
    run_dir = isolated_homes / "data" / "sb"
    assert ledger_records(run_dir) == []
    written = [path for path in run_dir.rglob("*") if path.is_file()] if run_dir.exists() else []
    assert not [path for path in written if canary.encode() in path.read_bytes()]
    assert canary not in err


def test_a_sample_whose_sandbox_is_broken_is_failed_and_never_kept(isolated_homes, sim_url, local_images):
    """Issue 28: a sandbox that could not start answered each command with "could not start the
    sandbox" as a tool error, and its sample was kept as training data. Such a sample is now failed
    (retried on resume), with the reason; the others are kept, and a command that is not found is an
    ordinary tool error, kept as data."""
    dataset = write_dataset(isolated_homes / "d.jsonl", [
        {"prompt": "Fine [sim:command=echo all-fine]"},
        # bubblewrap cannot make this folder (/etc/hostname is a file): the sandbox never starts
        {"prompt": "Broken [sim:command=pwd]", "image": TEST_IMAGE, "cwd": "/etc/hostname/app"},
        {"prompt": "Typo [sim:command=no-such-command-here]"},
    ])
    assert run(dataset, sim_url) == 1
    run_dir = isolated_homes / "data" / "sb"
    by_index = {r["prompt_index"]: r for r in ledger_records(run_dir)}
    assert [by_index[i]["disposition"] for i in range(3)] == ["kept", "failed_retryable", "kept"]
    broken = by_index[1]
    assert broken["sandbox_failed"] and broken["row"] is None
    assert broken["error"].startswith("sandbox: could not start the sandbox: bwrap: Can't mkdir")
    kept = read_jsonl(run_dir / "trajectories.jsonl")
    assert sorted(row["prompt_index"] for row in kept) == [0, 2]
    outputs = tool_outputs(kept)
    assert "all-fine" in outputs[0] and "command not found" in outputs[1]
    assert not any("could not start" in output for output in outputs)
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["sandbox"]["failed"] == 1 and stats["counts"]["kept"] == 2


def test_a_run_readies_its_sessions_slots_ahead(isolated_homes, sim_url, local_images, monkeypatch):
    """The `local` slots of a run's sessions are made in the background as the run starts, not each by
    its session's first sandbox (~13 ms of CPU each, which at 1,024 sessions fell on the first round);
    a sandbox of an image makes its own root, so a run of only such rows makes none ahead."""
    from hermes_core.sandbox.bubblewrap import BubblewrapBackend

    asked: list[int] = []
    prepare = BubblewrapBackend.prepare
    monkeypatch.setattr(BubblewrapBackend, "prepare", lambda self, sessions: (asked.append(sessions),
                                                                              prepare(self, sessions))[1])
    dataset = write_dataset(isolated_homes / "d.jsonl", [{"prompt": f"Say {n} [sim:command=echo said-{n}]"}
                                                         for n in range(6)])
    assert run(dataset, sim_url, "--num_workers=3") == 0 and asked == [3]
    outputs = tool_outputs(read_jsonl(isolated_homes / "data" / "sb" / "trajectories.jsonl"))
    assert sorted(output for output in outputs if "said-" in output) == sorted(outputs) and len(outputs) == 6
    images = write_dataset(isolated_homes / "i.jsonl", [{"prompt": "Where? [sim:command=pwd]", "image": TEST_IMAGE}])
    assert run(images, sim_url, run_name="img") == 0 and asked == [3]


def test_a_sessions_sandbox_closes_behind_its_record_and_the_next_one_opens_after(isolated_homes, sim_url,
                                                                                   monkeypatch):
    """A sample's sandbox closes in the background: the session's next sample sends its first request
    without waiting for it (a close took 8-13 ms between every two samples at 64 sessions). That
    sample's own sandbox opens only once the one before is closed, so a session never holds two, and
    the command returns with every sandbox closed."""
    from hermes_core.endpoints.model_client import ModelClient
    from hermes_core.sandbox.bubblewrap import BubblewrapBackend, BubblewrapSandbox

    events: list[str] = []
    close, open_, complete = BubblewrapSandbox.close, BubblewrapBackend.open, ModelClient.complete

    def slow_close(self) -> None:
        if not self._closed:
            events.append("close")
            time.sleep(0.5)
        close(self)
        events.append("closed")

    async def logged_complete(self, body, stream=False):
        if len(body["messages"]) == 1:  # the task alone: a sample's first request
            events.append("request " + body["messages"][0]["content"].split()[1])
        return await complete(self, body, stream)

    monkeypatch.setattr(BubblewrapSandbox, "close", slow_close)
    monkeypatch.setattr(BubblewrapBackend, "open", lambda *args: (events.append("open"), open_(*args))[1])
    monkeypatch.setattr(ModelClient, "complete", logged_complete)
    dataset = write_dataset(isolated_homes / "d.jsonl", [{"prompt": f"Say {n} [sim:command=echo said-{n}]"}
                                                         for n in range(3)])
    assert run(dataset, sim_url, "--num_workers=1") == 0
    assert events.count("close") == 3 and events[-1] == "closed"

    def closing(at: int) -> int:  # sandboxes closing at the event `at`
        return events[:at].count("close") - events[:at].count("closed")

    assert [closing(events.index(f"request {n}")) for n in (1, 2)] == [1, 1], events
    assert [closing(at) for at, event in enumerate(events) if event == "open"] == [0, 0, 0], events
    outputs = "".join(tool_outputs(read_jsonl(isolated_homes / "data" / "sb" / "trajectories.jsonl")))
    assert all(f"said-{n}" in outputs for n in range(3))


def test_sessions_left_without_work_free_their_slots_while_the_last_sample_runs(isolated_homes, sim_url):
    """A session that finds no job left gives its slot up at once (its cgroup becomes a spare, its
    zygote ends) instead of keeping it until the last sample of the run is done: at 1,024 sessions
    that teardown was ~1 s after the last record."""
    from hermes_core.sandbox.cgroups import detect, session_names

    hierarchy = detect()
    if hierarchy is None:
        pytest.skip("no cgroup hierarchy on this machine: slots keep no cgroup")
    mine = f"o{os.getpid()}-"
    # Slots of this process that an earlier test on this worker left to its backend are not this run's.
    before = set(session_names(hierarchy))

    def slots() -> int:
        return sum(name.startswith(mine) and "-slot" in name and name not in before
                   for name in session_names(hierarchy))

    dataset = write_dataset(isolated_homes / "d.jsonl", [
        {"prompt": "Slow one [sim:latency=2] [sim:command=echo slow]"},
        # The quick ones hold their slots 1.5 s: on a loaded machine the third session's slot can come
        # later than an instant sample's end.
        *({"prompt": f"Quick {n} [sim:command=sleep 1.5; echo quick-{n}]"} for n in range(2))])
    seen: list[int] = []
    running = threading.Event()
    running.set()

    def watch() -> None:
        while running.is_set():
            seen.append(slots())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert run(dataset, sim_url, "--num_workers=3") == 0
    finally:
        running.clear()
        watcher.join()
    assert max(seen) == 3, seen  # one slot per session
    first_full = seen.index(3)
    assert 1 in seen[first_full:], seen  # the two quick sessions' slots went while the slow sample ran
    assert slots() == 0
    outputs = tool_outputs(read_jsonl(isolated_homes / "data" / "sb" / "trajectories.jsonl"))
    assert len(outputs) == 3 and all(any(word in output for output in outputs) for word in ("quick-0", "quick-1", "slow"))


@pytest.mark.parametrize("backend_name", ["local", "plain"])
def test_a_deep_folder_never_fails_a_run_and_a_leftover_that_cannot_go_is_reported_and_skipped(
        isolated_homes, sim_url, monkeypatch, caplog, no_deep_tree_left, backend_name):
    """Issue 28: a 1,200-deep folder crashed clean-up (RecursionError): the sample's close failed the
    step, the folder stayed in the shared state root, and every later run failed at start, reaping it.
    Now the dead runs' deep folders are reaped, the sample's own is removed, and the one file that
    nothing can remove is reported once and skipped."""
    state_root, plain = isolated_homes / "sandboxes", backend_name == "plain"
    monkeypatch.setenv("HERMES_SANDBOX_STATE_ROOT", str(state_root))
    gone = dead_owner_session(state_root, "gone-1", plain)
    stuck = dead_owner_session(state_root, "stuck-1", plain)
    dataset = write_dataset(isolated_homes / "d.jsonl", [{"prompt": f"Build it [sim:command={BUILD_COMMAND}]"}])
    with immutable(stuck / "stuck"), caplog.at_level(logging.WARNING):
        assert run(dataset, sim_url, f"--sandbox_backend={backend_name}") == 0
        assert not gone.exists() and sorted(path.name for path in stuck.iterdir()) == ["stuck"]
        assert sorted(path.name for path in state_root.iterdir()) == [stuck.name, f"{stuck.name}.state"][:1 + plain]
    run_dir = isolated_homes / "data" / "sb"
    assert "built" in tool_outputs(read_jsonl(run_dir / "trajectories.jsonl"))[0]
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["counts"]["kept"] == 1 and stats["sandbox"]["failed"] == 0
    assert stats["sandbox"]["reaped_leftovers"] >= 1  # the dead session that could go (local: and dead slots)
    warnings = [record.getMessage() for record in caplog.records if record.name == "hermes_core.sandbox.trees"]
    assert len(warnings) == 1 and warnings[0].startswith(f"could not remove all of {stuck}: 1 entry stayed")
