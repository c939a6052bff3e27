"""Trajectory compression (SPEC §10) against the simulated endpoint on 127.0.0.1: the CLI, the
span planning rules, offline token counting and the Dagster asset on a real run folder."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from hermes_assets.cli import batch_main
from hermes_assets.compression_assets import build_compression_assets, validate_compression_settings
from hermes_assets.resources import ModelEndpointResource
from hermes_assets.run_assets import build_run_assets
from hermes_core.formats.compression import (
    SUMMARY_NOTICE,
    SUMMARY_PREFIX,
    ApproximateCounter,
    TokenizerFileCounter,
    compress_main,
    load_counter,
    plan_span,
    turn_tokens,
)
from hermes_core.formats.compression.tokens import TokenizerError
from hermes_core.batch.recipe import load_recipe
from hermes_core.batch.pipeline import RunPaths
from compression_rows import make_row, read_rows, write_rows
from procs import free_port

def tokens_of(row: dict[str, Any]) -> int:
    return sum(turn_tokens(row["conversations"], ApproximateCounter()))


def assert_pairs_intact(turns: list[dict[str, str]]) -> None:
    """Every tool turn follows a gpt turn with calls, and answers as many calls as that turn made."""
    for i, turn in enumerate(turns):
        if turn["from"] == "tool":
            call_turn = turns[i - 1]
            assert call_turn["from"] == "gpt" and "<tool_call>" in call_turn["value"]
            assert turn["value"].count("<tool_response>") == call_turn["value"].count("<tool_call>")
        elif turn["from"] == "gpt" and "<tool_call>" in turn["value"] and i + 1 < len(turns):
            assert turns[i + 1]["from"] == "tool"


METRICS = "trajectories_compressed_metrics.json"  # the original's name beside an output file


def compress(inp: Path, url: str, *extra: str) -> int:
    return compress_main([f"--input={inp}", f"--base_url={url}", "--api_key=k", "--model=hermes-sim", *extra])


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    rows = [make_row(i, rounds) for i, rounds in enumerate([12, 1, 8, 12, 2, 20])]
    return write_rows(tmp_path / "trajectories.jsonl", rows)


def test_over_budget_rows_fit_with_summary_protected_turns_and_pairs_intact(dataset, sim_url, capsys):
    target = 2000
    assert compress(dataset, sim_url, f"--target_max_tokens={target}", "--summary_target_tokens=200") == 0
    assert "compressed" in capsys.readouterr().out
    originals, outputs = read_rows(dataset), read_rows(dataset.with_name("trajectories_compressed.jsonl"))
    assert len(outputs) == len(originals)
    compressed = 0
    for before, after in zip(originals, outputs):
        metrics = after.pop("compression_metrics")
        assert metrics["original_tokens"] == tokens_of(before)
        assert metrics["compressed_tokens"] == tokens_of(after)
        assert_pairs_intact(after["conversations"])
        if tokens_of(before) <= target:
            assert after == before and metrics["skipped_reason"] == "under_budget" and not metrics["compressed"]
            continue
        compressed += 1
        assert metrics["compressed"] and metrics["skipped_reason"] is None
        assert metrics["compressed_tokens"] <= target or metrics["still_over_budget"]
        turns, old = after["conversations"], before["conversations"]
        summaries = [i for i, t in enumerate(turns) if t["value"].startswith(SUMMARY_PREFIX)]
        assert len(summaries) == 1 and turns[summaries[0]]["from"] == "human"
        # protected head and last N turns; the system turn carries the summary notice
        assert turns[0] == {**old[0], "value": old[0]["value"] + SUMMARY_NOTICE}
        assert turns[1:4] == old[1:4] and turns[-4:] == old[-4:]
        start, end = metrics["span"]
        # turns_removed has the original's meaning (turns before - turns after), not the span's length
        assert metrics["turns_removed"] == len(old) - len(turns) == end - start - 1
        assert turns[start]["value"].startswith(SUMMARY_PREFIX + " the assistant made")  # the model's label is dropped
        assert turns[start + 1:] == old[end:]
        assert old[start]["from"] != "tool" and (end == len(old) or old[end]["from"] != "tool")
        assert metrics["summary_tokens"] == turn_tokens([turns[start]], ApproximateCounter())[0]
        # the tool_call / tool_response blocks that remain still match one for one
        assert sum(t["value"].count("<tool_call>") for t in turns if t["from"] == "gpt") == sum(
            t["value"].count("<tool_response>") for t in turns if t["from"] == "tool")
    assert compressed == 4


def test_untouched_rows_keep_their_bytes_and_metrics_add_up(dataset, sim_url):
    assert compress(dataset, sim_url, "--target_max_tokens=2000", "--summary_target_tokens=200") == 0
    out = dataset.with_name("trajectories_compressed.jsonl")
    for line_in, line_out in zip(dataset.read_text("utf-8").splitlines(), out.read_text("utf-8").splitlines()):
        row = json.loads(line_out)
        if not row["compression_metrics"]["compressed"]:
            assert line_out.startswith(line_in[:-1] + ', "compression_metrics": ')
    per_row = [row["compression_metrics"] for row in read_rows(out)]
    report = json.loads((dataset.parent / METRICS).read_text())
    assert report["counts"]["rows"] == len(per_row)
    assert report["counts"]["compressed"] == sum(m["compressed"] for m in per_row) == 4
    assert report["counts"]["still_over_budget"] == sum(m["still_over_budget"] for m in per_row)
    assert report["tokens"]["original"] == sum(m["original_tokens"] for m in per_row)
    assert report["tokens"]["compressed"] == sum(m["compressed_tokens"] for m in per_row)
    assert report["tokens"]["saved"] == report["tokens"]["original"] - report["tokens"]["compressed"] > 0
    assert report["tokens"]["summary"] == sum(m["summary_tokens"] for m in per_row)
    assert report["turns_removed"] == sum(m["turns_removed"] for m in per_row)
    assert report["counts"]["skipped"] == {"under_budget": 2} and report["counts"]["failed"] == 0
    assert report["tokenizer"]["kind"] == "approximate" and "chars/4" in report["tokenizer"]["description"]
    assert report["summariser"]["calls"] == 4 and report["summariser"]["model"] == "hermes-sim"


def test_rerun_reuses_paid_summaries(dataset, sim_url, sim_server):
    assert compress(dataset, sim_url, "--target_max_tokens=2000") == 0
    first = dataset.with_name("trajectories_compressed.jsonl").read_text()
    before = sim_server.log.requests
    assert compress(dataset, sim_url, "--target_max_tokens=2000") == 0
    assert sim_server.log.requests == before
    report = json.loads((dataset.parent / METRICS).read_text())
    assert report["summariser"]["cache_hits"] == 4 and report["summariser"]["calls"] == 0
    strip = [{k: v for k, v in r.items() if k != "compression_metrics"} for r in read_rows(dataset.parent
             / "trajectories_compressed.jsonl")]
    assert strip == [{k: v for k, v in json.loads(line).items() if k != "compression_metrics"}
                     for line in first.splitlines()]


def test_dry_run_calls_nothing_and_writes_nothing(dataset, sim_url, sim_server, capsys):
    files = set(dataset.parent.iterdir())
    before = sim_server.log.requests
    assert compress(dataset, sim_url, "--target_max_tokens=2000", "--dry_run") == 0
    assert sim_server.log.requests == before and set(dataset.parent.iterdir()) == files
    report = json.loads(capsys.readouterr().out)
    assert report["dry_run"] and report["output"] is None
    assert report["counts"]["compressed"] == 4 and report["counts"]["over_budget"] == 4
    [file] = report["files"]
    assert file["compressed_rows"] == 4 and file["written"] is None and file["output"] is None
    assert report["summariser"]["calls"] == 0 and report["tokens"]["compressed"] < report["tokens"]["original"]
    # no endpoint is needed for a dry run
    assert compress_main([f"--input={dataset}", "--dry_run", "--target_max_tokens=2000"]) == 0


def test_sample_percent_outputs_only_the_seeded_sample(tmp_path, sim_url):
    # As the original: only the sampled rows are compressed and written (the others are left out).
    inp = write_rows(tmp_path / "t.jsonl", [make_row(i, 10) for i in range(12)])

    def sampled(seed: int, name: str, percent: str = "50") -> list[int]:
        out = tmp_path / name
        assert compress(inp, sim_url, f"--output={out}", "--target_max_tokens=1500", f"--sample_percent={percent}",
                        f"--seed={seed}") == 0
        rows = read_rows(out)
        assert all(r["compression_metrics"]["compressed"] for r in rows)
        report = json.loads(out.with_name(f"{out.stem}_metrics.json").read_text())
        assert report["counts"]["rows"] == len(rows) and report["files"][0]["rows"] == 12
        indexes = [r["prompt_index"] for r in rows]
        assert indexes == sorted(indexes)  # input order
        return indexes

    first = sampled(7, "a.jsonl")
    assert len(first) == 6 and first == sampled(7, "b.jsonl") and first != sampled(8, "c.jsonl")
    assert len(sampled(7, "d.jsonl", "1")) == 1  # at least one row, as the original draws



def test_summariser_failure_keeps_rows_unchanged_with_the_reason(dataset, capsys):
    url = f"http://127.0.0.1:{free_port()}/v1"
    assert compress(dataset, url, "--target_max_tokens=2000", "--max_retries=0") == 1
    assert "kept uncompressed" in capsys.readouterr().err
    for before, after in zip(read_rows(dataset), read_rows(dataset.with_name("trajectories_compressed.jsonl"))):
        metrics = after.pop("compression_metrics")
        assert after == before and not metrics["compressed"]
        if metrics["original_tokens"] > 2000:
            assert metrics["skipped_reason"].startswith("summary_failed: ") and metrics["still_over_budget"]
    report = json.loads((dataset.parent / METRICS).read_text())
    assert report["counts"]["failed"] == 4 and len(report["failures"]) == 4
    assert report["tokens"]["saved"] == 0 and report["counts"]["skipped"]["summary_failed"] == 4


def test_per_trajectory_timeout(tmp_path, sim_url):
    # The simulated model reads directives from the request, and the span sent to it carries this one.
    slow = make_row(0, 12, middle_human="Keep going. [sim:latency=3]")
    inp = write_rows(tmp_path / "t.jsonl", [slow, make_row(1, 12)])
    assert compress(inp, sim_url, "--target_max_tokens=2000", "--timeout=0.5", "--max_retries=0") == 1
    rows = read_rows(tmp_path / "t_compressed.jsonl")
    assert rows[0]["compression_metrics"]["skipped_reason"] == "summary_failed: timed out after 0.5s"
    assert rows[0]["conversations"] == slow["conversations"] and rows[1]["compression_metrics"]["compressed"]


def test_span_planning_rules():
    roles = ["system", "human", "gpt", "tool"] + ["gpt", "tool"] * 6 + ["gpt"]
    counts = [100, 20, 10, 10] + [50, 200] * 6 + [10]
    total = sum(counts)
    # smallest span that fits: one gpt/tool pair saves 250 - 60 for a summary estimate of 60
    plan = plan_span(roles, counts, total - 150, 60, 4)
    assert (plan.start, plan.end, plan.span_tokens, plan.reaches_budget) == (4, 6, 250, True)
    # a span never starts or ends on a tool turn, and never enters the protected head/tail
    for target in range(total - 1200, total, 37):
        plan = plan_span(roles, counts, target, 60, 4)
        assert roles[plan.start] != "tool" and roles[plan.end] != "tool" and 4 <= plan.start < plan.end <= 12
    # cannot fit: the largest allowed span, flagged
    plan = plan_span(roles, counts, 100, 60, 4)
    assert (plan.start, plan.end, plan.reaches_budget) == (4, 12, False)
    assert plan_span(roles, counts, 100, 10_000, 4) == "would_not_save_tokens"
    assert plan_span(["system", "human", "gpt", "tool", "gpt"], [9, 9, 9, 9, 9], 10, 5, 4) == "no_compressible_span"


def test_tokenizer_file_versus_approximate_counter(tmp_path, dataset, sim_url):
    tokenizers = pytest.importorskip("tokenizers")
    words = sorted({w for row in read_rows(dataset) for t in row["conversations"] for w in re.findall(r"\w+", t["value"])})
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    tokenizer.save(str(path))

    exact, approx = load_counter(path.parent), load_counter(None)
    assert isinstance(exact, TokenizerFileCounter) and isinstance(approx, ApproximateCounter)
    assert exact.count_many(["lorem ipsum, dolor"]) == [4] and approx.count_many(["lorem ipsum, dolor"]) == [5]
    assert compress(dataset, sim_url, "--target_max_tokens=2000", f"--tokenizer={path}") == 0
    report = json.loads((dataset.parent / METRICS).read_text())
    assert report["tokenizer"] == exact.describe() and report["tokenizer"]["kind"] == "tokenizer_file"
    rows = read_rows(dataset)
    out = read_rows(dataset.with_name("trajectories_compressed.jsonl"))
    assert out[0]["compression_metrics"]["original_tokens"] == sum(turn_tokens(rows[0]["conversations"], exact))
    assert out[0]["compression_metrics"]["original_tokens"] != tokens_of(rows[0])
    with pytest.raises(TokenizerError, match="never downloads"):
        load_counter("moonshotai/Kimi-K2-Thinking")
    assert compress(dataset, sim_url, "--tokenizer=/nonexistent/tokenizer.json") == 2


def test_bad_input_is_refused_before_any_call(tmp_path, sim_url, sim_server, capsys):
    inp = tmp_path / "bad.jsonl"
    inp.write_text(json.dumps(make_row(0, 12)) + "\nnot json\n" + json.dumps({"conversations": "x"}) + "\n")
    before = sim_server.log.requests
    assert compress(inp, sim_url, "--target_max_tokens=500") == 2
    assert "2 invalid line(s): 2 (not JSON), 3" in capsys.readouterr().err
    assert sim_server.log.requests == before and not (tmp_path / "bad_compressed.jsonl").exists()


def test_compression_settings_are_validated():
    assert validate_compression_settings(True) == {}
    settings = {"target_max_tokens": 8000, "sample_percent": 10, "model": "small", "tokenizer": None}
    assert validate_compression_settings(settings) == settings
    for bad in ({"target_max_token": 1}, {"target_max_tokens": "8000"}, {"model": 3}, {"sample_percent": 0}, "yes"):
        with pytest.raises(ValueError):
            validate_compression_settings(bad)


def test_asset_compresses_a_real_run_folder(isolated_homes, sim_url, monkeypatch):
    prompts = [{"prompt": f"Run a command that prints {i} [sim:tools=12]"} for i in range(3)]
    prompts.append({"prompt": "Say hi [sim:no-tools]"})
    dataset = write_rows(isolated_homes / "d.jsonl", prompts)
    assert batch_main([f"--dataset_file={dataset}", "--run_name=long", f"--base_url={sim_url}", "--api_key=k",
                       "--distribution=terminal_only", "--max_turns=20", "--batch_size=2"]) == 0
    root = isolated_homes / "data"
    recipe = load_recipe(root, "long")
    monkeypatch.delenv("HERMES_COMPRESSION", raising=False)
    assert build_compression_assets(recipe, root) == []  # off unless the run or the environment enables it
    monkeypatch.setenv("HERMES_COMPRESSION", "1")
    [asset] = build_compression_assets(recipe, root)
    assert asset.key == dg.AssetKey(["long", "compressed_trajectories"])
    assert asset.group_names_by_key[asset.key] == "long"
    assert dg.AssetKey(["long", "filtered_trajectories"]) in asset.asset_deps[asset.key]

    rows = read_rows(root / "long" / "trajectories.jsonl")
    sizes = sorted(tokens_of(row) for row in rows)
    target = (sizes[0] + sizes[-1]) // 2  # the tool-less row fits, the 12-round rows do not
    instance = dg.DagsterInstance.get()
    result = dg.materialize(
        [*build_run_assets(recipe, root), asset], selection=[asset.key], instance=instance,
        resources={"model_endpoint": ModelEndpointResource(base_url=sim_url)},
        run_config={"ops": {"long__compressed_trajectories": {"config": {
            "target_max_tokens": target, "summary_target_tokens": 100}}}},
    )
    assert result.success
    out = read_rows(RunPaths(root / "long").compressed)
    assert len(out) == len(rows) == 4
    for before, after in zip(rows, out):
        metrics = after.pop("compression_metrics")
        assert_pairs_intact(after["conversations"])
        assert metrics["compressed"] == (tokens_of(before) > target)
        assert metrics["compressed_tokens"] <= target or metrics["still_over_budget"]
        if not metrics["compressed"]:
            assert after == before
    report = json.loads((root / "long" / "compression_metrics.json").read_text())
    assert report["counts"]["compressed"] == 3 and report["counts"]["failed"] == 0
    event = instance.get_latest_materialization_event(asset.key)
    metadata = event.asset_materialization.metadata
    assert metadata["compressed"].value == 3 and metadata["rows"].value == 4
    assert metadata["original_tokens"].value == report["tokens"]["original"]
    assert metadata["code_version"].value == asset.code_versions_by_key[asset.key]
