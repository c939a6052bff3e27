"""hermes-batch end to end: a real Dagster instance, the simulated endpoint on 127.0.0.1, real
sandboxes, and the files a user gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from hermes_assets.cli import batch_main
from hermes_core.tools import registry
from batch_runs import ledger_records, read_jsonl, write_dataset  # noqa: F401  (used by the tests below)
from procs import free_port
from upstreams import Upstream, hung_upstream, wrong_key_upstream  # noqa: F401  (fixtures)

ROW_KEYS = [
    "prompt_index", "conversations", "metadata", "completed", "partial", "api_calls", "toolsets_used",
    "tool_stats", "tool_error_counts", "sample_key", "tools_offered", "toolset_seed", "usage", "id", "extra",
]


def run(homes: Path, url: str, dataset: Path, *extra: str, run_name: str = "t1") -> int:
    return batch_main([
        f"--dataset_file={dataset}", f"--run_name={run_name}", f"--base_url={url}", "--api_key=k",
        "--batch_size=2", "--num_workers=3", "--distribution=terminal_only", *extra,
    ])


PROMPTS = [{"prompt": f"Run a command that prints {i}", "id": f"p{i}"} for i in range(5)]


def test_run_writes_hermes_sharegpt_rows_and_statistics(isolated_homes, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", PROMPTS + [{"prompt": "Say hi", "metadata": {"k": 1}, "x": 2}])
    umask = os.umask(0o027)
    try:
        assert run(isolated_homes, sim_url, dataset) == 0
    finally:
        os.umask(umask)
    out = capsys.readouterr().out
    run_dir = isolated_homes / "data" / "t1"
    assert "SIMULATED" in out and str(run_dir / "trajectories.jsonl") in out and "6 prompts in 3 batches of ≤2" in out
    # Every file as the umask makes it, the ones written atomically too: a team shares the outputs.
    modes = {str(path.relative_to(run_dir)): oct(path.stat().st_mode & 0o777) for path in run_dir.rglob("*")
             if path.is_file()}
    assert set(modes.values()) == {oct(0o640)}, modes

    rows = read_jsonl(run_dir / "trajectories.jsonl")
    assert [r["prompt_index"] for r in rows] == list(range(6))
    for row in rows:
        assert list(row) == ROW_KEYS
        assert set(registry.universe) <= set(row["tool_stats"])
        assert set(row["tool_stats"]) == set(row["tool_error_counts"])
        turns = [c["from"] for c in row["conversations"]]
        assert turns[:2] == ["system", "human"] and "<tools>" in row["conversations"][0]["value"]
        assert row["conversations"][2]["value"].startswith("<think>\n")
        assert row["metadata"]["run_name"] == "t1" and row["metadata"]["dagster_run_id"]
    tool_turn = next(c for c in rows[0]["conversations"] if c["from"] == "tool")
    assert tool_turn["value"].startswith("<tool_response>\n")
    assert "<tool_call>" in rows[0]["conversations"][2]["value"]
    assert rows[5]["metadata"]["input_metadata"] == {"k": 1} and rows[5]["extra"] == {"x": 2}

    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["counts"]["kept"] == 6 and stats["counts"]["pending"] == 0
    assert stats["total_batches"] == 3 and stats["tool_statistics"]["terminal"]["count"] >= 5
    checkpoint = json.loads((run_dir / "checkpoint.json").read_text())
    assert checkpoint["completed_prompts"] == list(range(6))

    instance = dg.DagsterInstance.get()
    raw_key = dg.AssetKey(["t1", "raw_trajectories"])
    batches = json.loads((run_dir / "batches.json").read_text())["batches"]
    assert instance.get_materialized_partitions(raw_key) == {b["key"] for b in batches}
    assert instance.get_latest_materialization_event(dg.AssetKey(["t1", "statistics"])) is not None
    # Runs of the code location's own jobs, linked to it as Launchpad runs are (not __ephemeral_asset_job__):
    # the planning and the batches in one run, as "Materialize selected" makes it, then the outputs.
    runs = instance.get_runs()  # newest first
    assert [run.job_name for run in runs] == ["t1__finalize_job", "__ASSET_JOB"]
    assert {key.path[-1] for key in runs[1].asset_selection} == {"prompts", "toolset_assignments", "raw_trajectories"}
    assert {run.remote_job_origin.location_name for run in runs} == {"hermes_assets.definitions"}


def test_resume_after_reorder_insert_and_append_runs_only_new_samples(isolated_homes, sim_url):
    dataset = write_dataset(isolated_homes / "d.jsonl", PROMPTS)
    assert run(isolated_homes, sim_url, dataset) == 0
    run_dir = isolated_homes / "data" / "t1"
    assert len(ledger_records(run_dir)) == 5

    # A run folder from an older version: its invocations did not record the sandbox backend.
    invocations = run_dir / "invocations.jsonl"
    invocations.write_text("".join(json.dumps({k: v for k, v in row.items() if k != "sandbox_backend"}) + "\n"
                                   for row in read_jsonl(invocations)))
    (run_dir / "statistics.json").unlink()
    assert run(isolated_homes, sim_url, dataset) == 0  # nothing to do
    assert len(ledger_records(run_dir)) == 5
    assert json.loads((run_dir / "statistics.json").read_text())["sandbox"]["backend"] == "local"

    edited = [{"prompt": "A brand new first prompt"}] + list(reversed(PROMPTS)) + [{"prompt": "Run a command that prints 0", "id": "dup"}]
    write_dataset(dataset, edited)
    assert run(isolated_homes, sim_url, dataset) == 0
    records = ledger_records(run_dir)
    assert len(records) == 7  # only the inserted row and the second copy of a duplicate ran
    rows = read_jsonl(run_dir / "trajectories.jsonl")
    assert [r["prompt_index"] for r in rows] == list(range(7))
    assert rows[0]["conversations"][1]["value"] == "A brand new first prompt"
    assert len({r["sample_key"] for r in rows}) == 7


def test_invalid_lines_stop_the_run_before_any_model_call(isolated_homes, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", [PROMPTS[0], "{not json", '["a list"]', {"prompt": 3}, {"x": 1}])
    assert run(isolated_homes, sim_url, dataset) == 2
    err = capsys.readouterr().err
    assert str(dataset) in err
    for line in ("line 2", "line 3", "line 4", "line 5"):
        assert line in err
    assert not (isolated_homes / "data" / "t1" / "raw").exists()


def test_skip_invalid_runs_the_rest_and_counts_them(isolated_homes, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", [PROMPTS[0], "{not json", PROMPTS[1]])
    assert run(isolated_homes, sim_url, dataset, "--skip-invalid") == 0
    assert "skipped 1 invalid line(s)" in capsys.readouterr().err
    stats = json.loads((isolated_homes / "data" / "t1" / "statistics.json").read_text())
    assert stats["counts"]["invalid_input_lines"] == 1 and stats["counts"]["kept"] == 2


def test_changed_recipe_under_the_same_run_name_is_refused(isolated_homes, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", PROMPTS[:1])
    assert run(isolated_homes, sim_url, dataset) == 0
    assert "1 prompt in 1 batch of ≤2" in capsys.readouterr().out
    assert run(isolated_homes, sim_url, dataset, "--seed=7") == 2
    assert "seed" in capsys.readouterr().err
    assert run(isolated_homes, sim_url, dataset, "--seed=7", "--force-new-fingerprint") == 0


def test_filters_discard_and_failures_stay_retryable(isolated_homes, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", [
        {"prompt": "Run ls"},
        {"prompt": "Run ls [sim:hallucinate]"},
        {"prompt": "Explain [sim:no-reasoning]"},
        {"prompt": "Run ls [sim:always-fail]"},
    ])
    code = run(isolated_homes, sim_url, dataset, "--max_attempts=2", "--max_retries=1")
    assert code == 1  # a batch with a retryable failure fails its step
    run_dir = isolated_homes / "data" / "t1"
    stats = json.loads((run_dir / "statistics.json").read_text())
    counts = stats["counts"]
    assert (counts["kept"], counts["discarded_hallucinated_tool"], counts["discarded_no_reasoning"]) == (1, 1, 1)
    assert counts["failed_retryable"] == 1 and counts["pending"] == 1
    assert len(read_jsonl(run_dir / "trajectories.jsonl")) == 1

    instance = dg.DagsterInstance.get()
    materialized = instance.get_materialized_partitions(dg.AssetKey(["t1", "raw_trajectories"]))
    assert len(materialized) == 1  # the batch holding the failing sample is not materialized

    assert run(isolated_homes, sim_url, dataset, "--max_attempts=2", "--max_retries=1") == 0  # now terminal
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["counts"]["failed_terminal"] == 1 and stats["counts"]["pending"] == 0
    assert len(ledger_records(run_dir)) == 5  # discarded samples were not re-run


def test_discard_incomplete_drops_trajectories_that_hit_max_turns(isolated_homes, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", [{"prompt": "Run ls"}, {"prompt": "Run ls [sim:loop]"}])
    assert run(isolated_homes, sim_url, dataset, "--max_turns=2", "--discard_incomplete") == 0
    counts = json.loads((isolated_homes / "data" / "t1" / "statistics.json").read_text())["counts"]
    assert (counts["kept"], counts["discarded_incomplete"]) == (1, 1)
    assert "incomplete 1" in capsys.readouterr().out
    assert run(isolated_homes, sim_url, dataset, "--max_turns=2") == 2  # the filter is part of the recipe


def test_list_distributions(capsys):
    assert batch_main(["--list_distributions"]) == 0
    out = capsys.readouterr().out
    for name in ("default", "terminal_only", "mixed_tasks", "browser_tasks"):
        assert name in out


def test_missing_endpoint_is_one_clear_error(isolated_homes, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", PROMPTS[:1])
    assert batch_main([f"--dataset_file={dataset}", "--run_name=t1"]) == 2
    assert "HERMES_BASE_URL" in capsys.readouterr().err


def test_dagster_docker_imports():
    """Guards the pinned Dagster set: a broken resolution fails here first."""
    import dagster_docker

    assert dagster_docker.DockerRunLauncher


def test_unusable_images_stop_the_run_before_any_model_call(isolated_homes, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", [
        PROMPTS[0], {"prompt": "Compile it", "image": "rust:1.75"}, {"prompt": "Serve", "image": "node:20-alpine"},
    ])
    assert run(isolated_homes, sim_url, dataset) == 1
    err = capsys.readouterr().err
    assert "pre-flight" in err and "rust:1.75" in err and "node:20-alpine" in err
    assert ledger_records(isolated_homes / "data" / "t1") == []


def test_compress_flag_adds_the_compressed_output(isolated_homes, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", [{"prompt": "Run many commands [sim:tools=30]"}, PROMPTS[0]])
    assert run(isolated_homes, sim_url, dataset, "--max_turns=40", "--compress",
               "--compress_target_max_tokens=3000") == 0
    run_dir = isolated_homes / "data" / "t1"
    out, err = capsys.readouterr()
    assert "compress 2/2 rows | compressed 1" in err  # the step's progress line
    assert "  compressed 1 of 2 row(s): 1 over budget, 0 still over budget, 0 failed" in out
    assert f"  output: {run_dir / 'trajectories.compressed.jsonl'}" in out
    rows = read_jsonl(run_dir / "trajectories.compressed.jsonl")
    assert [r["compression_metrics"]["compressed"] for r in rows] == [True, False]
    assert any(t["value"].startswith("[CONTEXT SUMMARY]:") for t in rows[0]["conversations"])
    assert json.loads((run_dir / "recipe.json").read_text())["compression"] == {"target_max_tokens": 3000}
    # A resume rebuilds a deleted compressed file (it is part of what a settled run left), and a
    # settled resume prints the same lines.
    (run_dir / "trajectories.compressed.jsonl").unlink()
    assert run(isolated_homes, sim_url, dataset, "--max_turns=40", "--compress",
               "--compress_target_max_tokens=3000") == 0
    assert [r["conversations"] for r in read_jsonl(run_dir / "trajectories.compressed.jsonl")] == \
        [r["conversations"] for r in rows]  # the same summary, from the cache
    capsys.readouterr()
    assert run(isolated_homes, sim_url, dataset, "--max_turns=40", "--compress",
               "--compress_target_max_tokens=3000") == 0
    assert "  compressed 1 of 2 row(s): 1 over budget, 0 still over budget, 0 failed" in capsys.readouterr().out


def test_hermes_foundry_export_writes_every_format(isolated_homes, sim_url):
    from datasets import load_dataset

    from hermes_assets.foundry_cli import foundry_main

    dataset = write_dataset(isolated_homes / "d.jsonl", PROMPTS[:3])
    assert run(isolated_homes, sim_url, dataset) == 0
    assert foundry_main(["export", "--run_name", "t1"]) == 0
    run_dir = isolated_homes / "data" / "t1"
    assert (run_dir / "hf" / "README.md").is_file() and (run_dir / "trajectories.parquet").is_file()
    messages = load_dataset("json", data_files=str(run_dir / "trl" / "messages.jsonl"), split="train",
                            cache_dir=str(isolated_homes / "hf-cache"))
    assert len(messages) == 3 and {"messages", "tools"} <= set(messages.column_names)


# --- every input byte (issue 17, item 6) ---------------------------------------------------------

LINE_BREAKING_PROMPTS = ["Say hi\u2028then bye", "Run a command that prints\x85two lines"]


def raw_row(value: dict) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")  # U+2028 and U+0085 written raw


def test_line_breaking_characters_reach_the_record_and_bad_bytes_are_refused(isolated_homes, sim_url, capsys):
    dataset = isolated_homes / "d.jsonl"
    dataset.write_bytes(raw_row({"prompt": LINE_BREAKING_PROMPTS[0]}) + b"\n" + b'{"prompt": "caf\xe9"}\n'
                        + raw_row({"prompt": LINE_BREAKING_PROMPTS[1]}) + b"\r\n")
    run_dir = isolated_homes / "data" / "t1"
    assert run(isolated_homes, sim_url, dataset) == 2
    err = capsys.readouterr().err
    assert f"{dataset}: 1 invalid line(s)" in err and "line 2: not valid UTF-8 (byte 0xe9 at column 16)" in err
    assert not (run_dir / "raw").exists()  # nothing was sent

    assert run(isolated_homes, sim_url, dataset, "--skip-invalid") == 0
    assert f"skipped 1 invalid line(s) of {dataset}: 2" in capsys.readouterr().err
    rows = read_jsonl(run_dir / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in rows] == LINE_BREAKING_PROMPTS  # byte-exact
    counts = json.loads((run_dir / "statistics.json").read_text())["counts"]
    assert counts["invalid_input_lines"] == 1 and counts["kept"] == 2

    produced = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    assert run(isolated_homes, sim_url, dataset) == 2  # refused again without --skip-invalid ...
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == produced  # ... losing nothing


def bad_dataset(tmp: Path, kind: str) -> Path:
    """A dataset path that is wrong in one way a user can get it wrong."""
    path = tmp / f"{kind}.jsonl"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling_symlink":
        path.symlink_to(tmp / "nowhere.jsonl")
    elif kind == "symlink_loop":
        path.symlink_to(path)
    elif kind == "unreadable":
        return Path("/proc/self/mem")  # a regular file whose read fails (EIO), even for root
    elif kind == "lone_surrogate":
        path.write_bytes(b'{"prompt": "x \\ud800"}\n')
    elif kind == "empty":
        path.write_bytes(b"\n\r\n")
    return path


BAD_DATASETS = {"directory": "is a directory", "fifo": "not a regular file", "dangling_symlink": "symbolic link",
                "symlink_loop": "symbolic link", "unreadable": "cannot read the dataset file: Input/output error",
                "lone_surrogate": "line 1: holds a lone surrogate", "empty": "no valid rows", "absent": "not found"}


@pytest.mark.parametrize("kind", sorted(BAD_DATASETS))
def test_bad_dataset_paths_are_one_clear_error(isolated_homes, sim_url, capsys, kind):
    dataset = bad_dataset(isolated_homes, kind)
    assert run(isolated_homes, sim_url, dataset) == 2
    err = capsys.readouterr().err
    # /proc/self/mem is named as the CLI resolved it (this process: the same file)
    assert err.startswith((f"error: {dataset}: ", f"error: {os.path.realpath(dataset)}: ")) and BAD_DATASETS[kind] in err
    assert not (isolated_homes / "data" / "t1").exists()


def test_a_recipe_can_change_until_the_run_has_a_record(isolated_homes, sim_url, capsys):
    """A run refused before any sample (here its endpoint) made nothing under its recipe: fixing a
    typo in the model is not a changed recipe yet."""
    dataset = write_dataset(isolated_homes / "d.jsonl", PROMPTS[:2])
    assert run(isolated_homes, f"http://127.0.0.1:{free_port()}/v1", dataset, "--model=hermes-simm") == 2
    assert "No sample was sent" in capsys.readouterr().err
    assert run(isolated_homes, sim_url, dataset, "--model=hermes-sim") == 0
    rows = [json.loads(line) for line in (isolated_homes / "data" / "t1" / "trajectories.jsonl").open()]
    assert [row["metadata"]["model"] for row in rows] == ["hermes-sim", "hermes-sim"]
    assert run(isolated_homes, sim_url, dataset, "--model=other") == 2  # now it has records: refused
    assert "different recipe (changed: model)" in capsys.readouterr().err


def test_output_dir_that_is_a_file_is_one_clear_error(isolated_homes, sim_url, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", PROMPTS[:1])
    taken = isolated_homes / "taken"
    taken.write_text("keep me")
    assert run(isolated_homes, sim_url, dataset, f"--output_dir={taken}") == 2
    err = capsys.readouterr().err
    assert err == f"error: the data root {taken} (--output_dir, else $HERMES_DATA_DIR) is a file, not a folder\n"
    assert taken.read_text() == "keep me"


def test_the_console_script_prints_no_traceback_for_user_errors(isolated_homes, sim_url):
    dataset = write_dataset(isolated_homes / "d.jsonl", PROMPTS[:1])
    (isolated_homes / "taken").write_text("")
    script = Path(sys.executable).with_name("hermes-batch")
    for extra in ([f"--dataset_file={dataset}", f"--output_dir={isolated_homes / 'taken'}"],
                  ["--dataset_file=/proc/self/mem"], [f"--dataset_file={isolated_homes}"]):
        done = subprocess.run([str(script), *extra, "--run_name=t1", f"--base_url={sim_url}", "--api_key=k"],
                              capture_output=True, text=True, timeout=120, env=os.environ)
        assert done.returncode == 2 and done.stderr.startswith("error: ") and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1


# --- bad endpoints fail fast and say why (issue 17, item 5) ---------------------------------------

HERMES_BATCH = str(Path(sys.executable).with_name("hermes-batch"))
TWENTY = [{"prompt": f"Run a command that prints {i}"} for i in range(20)]


def batch_process(url: str, dataset: Path, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    """hermes-batch as a user runs it, in its own process with its own console; and its seconds."""
    started = time.monotonic()
    done = subprocess.run([HERMES_BATCH, f"--dataset_file={dataset}", "--run_name=t1", f"--base_url={url}",
                           "--api_key=wrong-key", "--batch_size=2", "--num_workers=3", "--distribution=terminal_only",
                           *extra], capture_output=True, text=True, timeout=120, env=os.environ)
    return done, time.monotonic() - started


def test_a_wrong_key_stops_the_run_before_any_sample(isolated_homes, wrong_key_upstream: Upstream):
    dataset = write_dataset(isolated_homes / "d.jsonl", TWENTY)
    done, seconds = batch_process(wrong_key_upstream.base_url, dataset)
    console = done.stdout + done.stderr
    assert done.returncode == 2 and seconds < 20, console
    assert len(wrong_key_upstream.hits) <= 3
    assert "HTTP 401" in done.stderr and "check the API key (--api_key, else $HERMES_API_KEY" in done.stderr
    assert "Stack Trace" not in console and "Traceback" not in console
    assert ledger_records(isolated_homes / "data" / "t1") == []  # no sample was sent


def test_without_preflight_the_first_refusal_stops_the_run(isolated_homes, wrong_key_upstream: Upstream):
    dataset = write_dataset(isolated_homes / "d.jsonl", TWENTY)
    done, seconds = batch_process(wrong_key_upstream.base_url, dataset, "--no_preflight")
    console = done.stdout + done.stderr
    assert done.returncode == 2 and seconds < 20, console
    assert 1 <= len(wrong_key_upstream.hits) <= 3 and "/v1/models" not in wrong_key_upstream.hits
    assert len(ledger_records(isolated_homes / "data" / "t1")) == len(wrong_key_upstream.hits)
    [reason] = [line for line in done.stdout.splitlines() if "most common failure" in line]
    assert "HTTP 401" in reason and "Incorrect API key" in reason
    assert "HTTP 401" in done.stderr and "every later sample would fail the same way" in done.stderr
    assert "Stack Trace" not in console and "Traceback" not in console


def test_a_hung_upstream_fails_the_sample_after_the_request_timeout(isolated_homes, hung_upstream: Upstream, capsys):
    dataset = write_dataset(isolated_homes / "d.jsonl", [{"prompt": "Say hi"}])
    attempts = 2
    assert run(isolated_homes, hung_upstream.base_url, dataset, "--model=stuck-model", "--request_timeout=5",
               f"--max_retries={attempts - 1}") == 1
    [record] = ledger_records(isolated_homes / "data" / "t1")
    assert 5 * attempts <= record["duration_s"] < 5 * attempts + 15
    assert "within 5 s (--request_timeout)" in record["error"]
    assert hung_upstream.hits.count("/v1/chat/completions") == attempts
    assert "most common failure (1 of 1 failed samples): no answer from" in capsys.readouterr().out


# None: a port nothing listens on, "unreachable" and not "misconfigured": the same command works once it is up
@pytest.mark.parametrize("url, says", [("htp://x", "expected http:// or https://"),
                                       ("http://127.0.0.1:0/v1", "port 0 cannot be connected to"),
                                       (None, "model endpoint unreachable: cannot connect to")])
def test_a_bad_or_dead_url_is_refused_at_once(isolated_homes, capsys, url, says):
    dataset = write_dataset(isolated_homes / "d.jsonl", PROMPTS)
    started = time.monotonic()
    assert run(isolated_homes, url or f"http://127.0.0.1:{free_port()}/v1", dataset, "--max_retries=5") == 2
    assert time.monotonic() - started < 20
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and "--base_url" in err
    assert ledger_records(isolated_homes / "data" / "t1") == []


def test_the_sample_deadline_and_timeouts_can_change_on_resume(isolated_homes, sim_url):
    dataset = write_dataset(isolated_homes / "d.jsonl", [{"prompt": "Say hi [sim:latency=2]"}])
    run_dir = isolated_homes / "data" / "t1"
    assert run(isolated_homes, sim_url, dataset, "--sample_timeout=1") == 1
    [cut] = ledger_records(run_dir)
    assert cut["duration_s"] < 1 + 3 and "deadline passed (1 s, --sample_timeout)" in cut["error"]
    fingerprint = json.loads((run_dir / "recipe.json").read_text())["fingerprint"]
    # Timeouts change no sample's data: the run resumes under new ones without --force-new-fingerprint.
    assert run(isolated_homes, sim_url, dataset, "--sample_timeout=0", "--request_timeout=30") == 0
    recipe = json.loads((run_dir / "recipe.json").read_text())
    assert recipe["fingerprint"] == fingerprint
    assert (recipe["sample_timeout_s"], recipe["request_timeout_s"]) == (None, 30)
    assert [r["disposition"] for r in ledger_records(run_dir)] == ["failed_retryable", "kept"]

