"""hermes-compress against the ORIGINAL trajectory_compressor.py (hermes-agent 0.19.0 in the oracle
venv), both run on the same inputs with the same original-style YAML and the same simulated
summariser on 127.0.0.1: output names and layout, row and metrics keys, summary turn and notice,
and the sampled rows must match.

How the original is made to run offline: its tokenizer comes from `transformers.AutoTokenizer`
(a hub download), which the oracle venv does not have; a stand-in `transformers` module on
PYTHONPATH counts ceil(characters / 4) per text, which is our approximate counter without its
per-turn overhead. Its summariser is the simulated endpoint (a custom base_url: the original then
uses a plain OpenAI client with the key named by `api_key_env`). HERMES_HOME is a temporary folder,
and every other HTTP(S) request goes to a closed local port through the proxy variables.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from compression_rows import full_original_config, make_row, original_style_yaml, read_rows, write_rows
from hermes_core.formats.compression import CACHE_FILE, SUMMARY_PREFIX, compress_main
from procs import free_port

ROOT = Path(__file__).resolve().parents[2]
ORACLE_PYTHON = ROOT / ".oracle-venv" / "bin" / "python"
STAND_IN = '''import math


class _Counter:
    def encode(self, text):
        return [0] * math.ceil(len(text) / 4)


class AutoTokenizer:
    @staticmethod
    def from_pretrained(name, trust_remote_code=False):
        return _Counter()
'''


@pytest.fixture()
def original(oracle: dict[str, Any], tmp_path: Path):
    """Runs the original compressor: original(args, cwd) -> completed process."""
    found = subprocess.run([str(ORACLE_PYTHON), "-c", "import trajectory_compressor as t; print(t.__file__)"],
                           capture_output=True, text=True, env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
                                                                "HERMES_HOME": str(tmp_path)})
    if found.returncode != 0:
        pytest.skip(f"the oracle venv cannot import trajectory_compressor: {found.stderr.strip()[-300:]}")
    script = found.stdout.strip()
    stand_in = tmp_path / "stand_in" / "transformers"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text(STAND_IN)
    home = tmp_path / "hermes_home"
    home.mkdir()
    dead = f"http://127.0.0.1:{free_port()}"

    def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "HERMES_HOME": str(home), "HC_SUMMARY_KEY": "k",
               "PYTHONPATH": str(stand_in.parent), "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "ALL_PROXY": dead,
               "NO_PROXY": "127.0.0.1,localhost", "COLUMNS": "100"}
        done = subprocess.run([str(ORACLE_PYTHON), script, *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0 and "Compression complete" in done.stdout, done.stdout[-2000:] + done.stderr
        return done

    return run


def two_copies(tmp_path: Path, make: Any) -> tuple[Path, Path]:
    """The same input under tmp/original/ and tmp/ours/ (each tool names its outputs beside it)."""
    copies = []
    for who in ("original", "ours"):
        (tmp_path / who).mkdir()
        copies.append(make(tmp_path / who))
    return copies[0], copies[1]


def listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def keys_of(value: Any) -> Any:
    """The key structure of a JSON value (nested keys, leaves as their type)."""
    if isinstance(value, dict):
        return {k: keys_of(v) for k, v in value.items()}
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


def assert_keys_within(theirs: Any, ours: Any, where: str) -> None:
    """Every key the original writes is in ours, with the same kind of value."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), where
        for key, value in theirs.items():
            assert key in ours, f"{where}.{key} missing"
            assert_keys_within(value, ours[key], f"{where}.{key}")
    else:
        assert theirs == ours, f"{where}: {theirs} != {ours}"


def test_folder_input_matches_the_original(original, tmp_path, sim_url, monkeypatch):
    monkeypatch.setenv("HC_SUMMARY_KEY", "k")
    rows = [make_row(i, rounds) for i, rounds in enumerate([12, 1, 8, 12, 2, 20, 10])]

    def make(parent: Path) -> Path:
        (parent / "run").mkdir()
        write_rows(parent / "run" / "a.jsonl", rows[:3])
        write_rows(parent / "run" / "b.jsonl", rows[3:])
        return parent / "run"

    theirs_in, ours_in = two_copies(tmp_path, make)
    sections = full_original_config(sim_url)
    config = original_style_yaml(tmp_path / "compression.yaml", sections)
    original([f"--input={theirs_in}", f"--config={config}"], cwd=tmp_path)
    assert compress_main([f"--input={ours_in}", f"--config={config}"]) == 0
    theirs, ours = theirs_in.with_name("run_small"), ours_in.with_name("run_small")
    # the same layout; ours also keeps its summary cache there
    assert listing(theirs) == {"a.jsonl", "b.jsonl", "run_metrics.json"} == listing(ours) - {CACHE_FILE}
    notice = sections["output"]["summary_notice_text"]
    both = 0
    for name in ("a.jsonl", "b.jsonl"):
        for given, their_row, our_row in zip(read_rows(theirs_in / name), read_rows(theirs / name),
                                             read_rows(ours / name), strict=True):
            assert set(their_row) - {"compression_metrics"} == set(our_row) - {"compression_metrics"}
            if "compression_metrics" not in their_row:  # the original leaves it off untouched rows
                assert their_row == given
                # ours counts 4 tokens more per turn (the chat template), so a row just under the
                # original's budget can be over ours
                assert our_row["compression_metrics"]["was_compressed"] or our_row["conversations"] == \
                    given["conversations"]
                continue
            # our counts are never below the original's, so what it compressed we compressed too
            assert our_row["compression_metrics"]["was_compressed"]
            both += 1
            assert_keys_within(keys_of(their_row["compression_metrics"]), keys_of(our_row["compression_metrics"]),
                               "compression_metrics")
            for row in (their_row, our_row):
                turns = row["conversations"]
                start = row["compression_metrics"]["compression_region"]["start_idx"]
                assert turns[0]["value"] == given["conversations"][0]["value"] + notice
                assert turns[start]["from"] == "human" and turns[start]["value"].startswith(SUMMARY_PREFIX + " ")
                assert sum(t["value"].startswith(SUMMARY_PREFIX) for t in turns) == 1
    assert both >= 3
    their_report = json.loads((theirs / "run_metrics.json").read_text())
    our_report = json.loads((ours / "run_metrics.json").read_text())
    assert_keys_within(keys_of(their_report), keys_of(our_report), "metrics")
    assert their_report["summary"]["total_trajectories"] == our_report["summary"]["total_trajectories"] == 7


def test_file_input_sampling_and_names_match_the_original(original, tmp_path, sim_url, monkeypatch):
    monkeypatch.setenv("HC_SUMMARY_KEY", "k")
    rows = [make_row(i, 3 + i) for i in range(9)]
    theirs_in, ours_in = two_copies(tmp_path, lambda parent: write_rows(parent / "trajectories.jsonl", rows))
    config = original_style_yaml(tmp_path / "compression.yaml", full_original_config(sim_url))
    flags = ["--sample_percent=40", "--seed=11", f"--config={config}"]
    original([f"--input={theirs_in}", *flags], cwd=tmp_path)
    assert compress_main([f"--input={ours_in}", *flags]) == 0
    names = {"trajectories.jsonl", "trajectories_small.jsonl", "trajectories_small_metrics.json"}
    assert listing(theirs_in.parent) == names == listing(ours_in.parent) - {CACHE_FILE}
    their_ids = [r["id"] for r in read_rows(theirs_in.with_name("trajectories_small.jsonl"))]
    our_ids = [r["id"] for r in read_rows(ours_in.with_name("trajectories_small.jsonl"))]
    # the same rows (int(9 * 40 / 100) = 3); the original writes them in draw order, ours in file order
    assert len(our_ids) == 3 and sorted(their_ids) == sorted(our_ids) and our_ids == sorted(our_ids, key=lambda i: int(i[1:]))
    their_report = json.loads(theirs_in.with_name("trajectories_small_metrics.json").read_text())
    our_report = json.loads(ours_in.with_name("trajectories_small_metrics.json").read_text())
    assert_keys_within(keys_of(their_report), keys_of(our_report), "metrics")
    assert their_report["summary"]["total_trajectories"] == our_report["summary"]["total_trajectories"] == 3
