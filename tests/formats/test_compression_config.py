"""`hermes-compress --config` with the original trajectory_compressor's YAML, directory input, the
original's sampling and output layout, against the simulated summariser on 127.0.0.1."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from compression_rows import full_original_config, make_row, original_style_yaml, read_rows, write_rows
from hermes_core.formats.compression import SUMMARY_NOTICE, SUMMARY_PREFIX, compress_main

# What the original writes per compressed row and in its aggregate file (hermes-agent 0.19.0).
ORIGINAL_ROW_KEYS = {"original_tokens", "compressed_tokens", "tokens_saved", "compression_ratio", "original_turns",
                     "compressed_turns", "turns_removed", "compression_region", "was_compressed", "still_over_limit",
                     "skipped_under_target", "summarization_api_calls", "summarization_errors"}
ORIGINAL_AGGREGATE = {"summary", "tokens", "turns", "averages", "summarization", "processing"}


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    """A run folder with two trajectory files (and a non-JSONL file that is not an input)."""
    root = tmp_path / "run"
    root.mkdir()
    rows = [make_row(i, rounds) for i, rounds in enumerate([12, 1, 8, 12, 2, 20, 10])]
    write_rows(root / "a.jsonl", rows[:3])
    write_rows(root / "b.jsonl", rows[3:])
    (root / "notes.txt").write_text("not an input\n")
    return root


def test_original_style_config_runs_end_to_end_on_a_folder(folder, tmp_path, sim_url, sim_server, monkeypatch, capsys):
    monkeypatch.setenv("HC_SUMMARY_KEY", "k")
    monkeypatch.delenv("HERMES_BASE_URL", raising=False)
    sections = full_original_config(sim_url, protected_turns={"first_gpt": False, "first_tool": False})
    config = original_style_yaml(tmp_path / "compression.yaml", sections)
    before = sim_server.log.requests
    assert compress_main([f"--input={folder}", f"--config={config}"]) == 0
    out = tmp_path / "run_small"  # the original's layout: <folder><output_suffix>/<same file names>
    assert sorted(p.name for p in out.iterdir()) == ["a.jsonl", "b.jsonl", "compression_summaries.jsonl",
                                                      "run_metrics.json"]
    notice = sections["output"]["summary_notice_text"]
    compressed = 0
    for name in ("a.jsonl", "b.jsonl"):
        for old, new in zip(read_rows(folder / name), read_rows(out / name), strict=True):
            metrics = new.pop("compression_metrics")
            assert ORIGINAL_ROW_KEYS <= set(metrics)
            if not metrics["was_compressed"]:
                assert new == old and metrics["skipped_under_target"] == (metrics["original_tokens"] <= 2000)
                continue
            compressed += 1
            turns, region = new["conversations"], metrics["compression_region"]
            assert turns[0]["value"] == old["conversations"][0]["value"] + notice
            # first gpt/tool unprotected: the span may start right after the first human turn
            assert region["start_idx"] == 2 and turns[2]["from"] == "human"
            assert turns[2]["value"].startswith(SUMMARY_PREFIX + " ")
            assert region["turns_count"] == region["end_idx"] - region["start_idx"]
            assert metrics["turns_removed"] == metrics["original_turns"] - metrics["compressed_turns"] == \
                len(old["conversations"]) - len(turns)
            assert metrics["tokens_saved"] == metrics["original_tokens"] - metrics["compressed_tokens"] > 0
            assert metrics["summarization_api_calls"] == 1 and metrics["summarization_errors"] == 0
    assert compressed == 5
    report = json.loads((out / "run_metrics.json").read_text())
    assert ORIGINAL_AGGREGATE <= set(report)
    assert report["summary"]["total_trajectories"] == 7 and report["summary"]["trajectories_compressed"] == 5
    assert report["turns"]["total_removed"] == report["turns_removed"]
    assert report["tokens"]["total_saved"] == report["tokens"]["saved"]
    assert report["summarization"] == {"total_api_calls": 5, "total_errors": 0, "success_rate": 1.0}
    assert report["settings"]["concurrency"] == 3 and report["settings"]["temperature"] == 0.2
    assert "not in the local Hugging Face cache" in report["tokenizer"]["description"]  # the hub id: approximated
    # the summariser got the file's model and temperature
    bodies = list(sim_server.log.recent)[-(sim_server.log.requests - before):]
    assert {(b["model"], b["temperature"]) for b in bodies} == {("hermes-sim", 0.2)}
    assert "run_metrics.json" in capsys.readouterr().out


def test_flags_win_over_the_file_and_absent_keys_take_the_originals_defaults(tmp_path, sim_url, monkeypatch,
                                                                             capsys):
    monkeypatch.setenv("HERMES_BASE_URL", sim_url)
    inp = write_rows(tmp_path / "t.jsonl", [make_row(0, 12), make_row(1, 1)])
    config = original_style_yaml(tmp_path / "c.yaml", {"compression": {"target_max_tokens": 100000}})
    assert compress_main([f"--input={inp}", f"--config={config}", "--target_max_tokens=2000", "--dry_run"]) == 0
    report = json.loads(capsys.readouterr().out)
    settings = report["settings"]
    assert settings["target_max_tokens"] == 2000 and report["counts"]["compressed"] == 1
    assert (settings["concurrency"], settings["temperature"], settings["summary_target_tokens"]) == (50, 0.3, 750)
    assert settings["summary_notice_text"] == SUMMARY_NOTICE and settings["add_summary_notice"]
    # no model call, and the original's default names for a file: <stem>_compressed.jsonl
    assert compress_main([f"--input={inp}", f"--config={config}", "--target_max_tokens=2000"]) == 0
    assert read_rows(tmp_path / "t_compressed.jsonl")[0]["compression_metrics"]["was_compressed"]
    assert json.loads((tmp_path / "t_compressed_metrics.json").read_text())["summary"]["trajectories_compressed"] == 1


def test_sample_percent_per_file_draws_the_originals_rows(folder, sim_url):
    assert compress_main([f"--input={folder}", f"--base_url={sim_url}", "--target_max_tokens=2000",
                          "--sample_percent=50", "--seed=3"]) == 0
    out = folder.with_name("run_compressed")
    # the original's draw: one generator seeded once, max(1, int(n * p / 100)) rows from each sorted file
    rng = random.Random(3)
    for name in ("a.jsonl", "b.jsonl"):
        rows = read_rows(folder / name)
        drawn = rng.sample(rows, max(1, int(len(rows) * 50 / 100)))
        written = read_rows(out / name)
        assert [r["id"] for r in written] == [r["id"] for r in rows if r in drawn]  # only those, in file order
    report = json.loads((out / "compression_metrics.json").read_text())
    assert report["counts"]["rows"] == 3 and [f["rows"] for f in report["files"]] == [3, 4]


def test_save_over_limit_false_per_trajectory_false_and_metrics_off(tmp_path, sim_url, monkeypatch):
    monkeypatch.setenv("HC_SUMMARY_KEY", "k")
    inp = write_rows(tmp_path / "t.jsonl", [make_row(0, 12), make_row(1, 1), make_row(2, 20)])
    config = original_style_yaml(tmp_path / "c.yaml", full_original_config(
        sim_url, compression={"target_max_tokens": 1000}, processing={"save_over_limit": False},
        metrics={"per_trajectory": False, "enabled": False}, output={"add_summary_notice": False}))
    assert compress_main([f"--input={inp}", f"--config={config}"]) == 0
    rows = read_rows(tmp_path / "t_small.jsonl")
    # the 12- and 20-round rows cannot get under 1000 tokens: left out; the short row is kept as it was
    assert [r["id"] for r in rows] == ["r1"] and rows[0] == make_row(1, 1)
    assert not list(tmp_path.glob("*metrics*"))


@pytest.mark.parametrize(("body", "expected"), [
    ("compression:\n  target_max_token: 10\n", r"c.yaml:2: unknown key 'compression.target_max_token'; known in compression: target_max_tokens"),
    ("tokeniser:\n  name: x\n", r"c.yaml:1: unknown section 'tokeniser'; known: tokenizer, compression"),
    ("compression:\n  summary_target_tokens: 10\n  target_max_tokens: '15k'\n",
     r"c.yaml:3: compression.target_max_tokens: expected a whole number, got '15k'"),
    ("protected_turns:\n  first_gpt: 1\n", r"c.yaml:2: protected_turns.first_gpt: expected true/false, got 1"),
    ("processing:\n  max_concurrent_requests: true\n", r"c.yaml:2: processing.max_concurrent_requests: expected a whole"),
    ("summarization:\n  temperature: -1\n", r"c.yaml:2: summarization.temperature: must be at least 0"),
    ("output:\n  output_suffix: ''\n", r"c.yaml:2: output.output_suffix: must not be empty"),
    ("metrics:\n  output_file: ../m.json\n", r"c.yaml:2: metrics.output_file: must be a plain file name"),
    ("metrics: [enabled]\n", r"c.yaml:1: metrics: expected a mapping of keys"),
    ("compression:\n  target_max_tokens: [1\n", r"c.yaml:3: not valid YAML"),
    ("summarization:\n  api_key_env: HC_UNSET_KEY\n",
     r"c.yaml:2: summarization.api_key_env: the environment variable HC_UNSET_KEY is not set"),
    ("tokenizer:\n  name: ./no/such/tokenizer.json\n", r"c.yaml:2: tokenizer.name: no/such/tokenizer.json: no such local"),
])
def test_bad_config_is_one_error_naming_file_line_and_key(tmp_path, sim_url, sim_server, capsys, body, expected):
    inp = write_rows(tmp_path / "t.jsonl", [make_row(0, 12)])
    config = tmp_path / "c.yaml"
    config.write_text(body)
    before = sim_server.log.requests
    assert compress_main([f"--input={inp}", f"--config={config}", f"--base_url={sim_url}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path}/") and expected in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    assert sim_server.log.requests == before and not list(tmp_path.glob("t_*"))


def test_missing_folder_empty_folder_and_output_over_input(tmp_path, sim_url, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv, expected in (([f"--input={tmp_path / 'nope'}"], "no such file or directory"),
                           ([f"--input={empty}"], "no *.jsonl files in this directory"),
                           ([f"--input={empty}", f"--output={empty}"], "the output would replace the input")):
        assert compress_main([*argv, f"--base_url={sim_url}"]) == 2
        assert expected in capsys.readouterr().err


def test_tokenizer_hub_id_is_read_from_the_local_cache_only(tmp_path, monkeypatch, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    model = tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(snapshot / "tokenizer.json"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    inp = write_rows(tmp_path / "t.jsonl", [make_row(0, 2)])
    for name, kind in (("acme/tiny", "tokenizer_file"), ("acme/absent", "approximate")):
        config = original_style_yaml(tmp_path / "c.yaml", {"tokenizer": {"name": name}})
        assert compress_main([f"--input={inp}", f"--config={config}", "--dry_run"]) == 0
        assert json.loads(capsys.readouterr().out)["tokenizer"]["kind"] == kind
