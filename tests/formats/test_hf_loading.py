"""The HF datasets load behind the `loads_with_hf_datasets` check, in this process and through the
loader process a command line run starts ahead of time: same answers, same errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_core.formats import hf_loading


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(3)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "text": "ok"}\nthis line is not JSON\n')
    return good, bad


def test_the_loader_process_answers_like_this_process(files: tuple[Path, Path]) -> None:
    good, bad = files
    here = hf_loading.load_in_process(good)
    hf_loading.start_loader()
    assert hf_loading.load_with_datasets(good) == here == (3, {"id": "Value('int64')", "text": "Value('string')"})
    with pytest.raises(Exception) as in_process:
        hf_loading.load_in_process(bad)
    hf_loading.start_loader()
    with pytest.raises(hf_loading.LoadError) as through_loader:
        hf_loading.load_with_datasets(bad)
    assert hf_loading.describe_error(through_loader.value) == hf_loading.describe_error(in_process.value)


def test_an_unused_loader_is_stopped(files: tuple[Path, Path]) -> None:
    hf_loading.start_loader()
    loader = hf_loading._started
    hf_loading.stop_loader()
    assert loader is not None and loader.poll() is not None and hf_loading._started is None
    assert hf_loading.load_with_datasets(files[0])[0] == 3  # no loader: loads in this process


def test_a_prefetched_load_is_collected_and_a_different_path_is_loaded_here(files: tuple[Path, Path]) -> None:
    good, bad = files
    hf_loading.start_loader()
    hf_loading.prefetch(good)
    assert hf_loading.load_with_datasets(good)[0] == 3
    hf_loading.start_loader()
    hf_loading.prefetch(bad)  # then the check asks for another file: the loader's answer is not used
    assert hf_loading.load_with_datasets(good)[0] == 3 and hf_loading._started is None
    hf_loading.prefetch(good)  # no loader started: nothing happens
