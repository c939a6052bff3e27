"""A run's prompt table: its dataset validated and keyed (prompts.jsonl), and what it was made from
(dataset.json: the dataset file's path, hash and identity, the keying, the invalid lines).

Every command plans again. A table made from the same dataset file, unchanged since (same device,
inode, size, mtime and change time), with the same keying, is the dataset as `load_dataset` would
make it now: it is read back instead (at 100k rows ~0.4 s instead of ~0.9 s to validate and key)
and neither file is written again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from hermes_core.batch.dataset import Dataset, DatasetError, InvalidLine, Sample, dataset_path, load_dataset
from hermes_core.batch.recipe import Recipe
from hermes_core.batch.run_paths import RunPaths
from hermes_core.fileio import FileTableCache, atomic_write_json, atomic_write_jsonl, read_jsonl

# A dataset file changed this recently is not vouched for by its identity: timestamps move in clock
# ticks, so a second edit within the tick of the first could leave every field as it was.
RACY_S = 2.0

tables = FileTableCache()  # prompts.jsonl and assignments.jsonl of recent runs, while unchanged


def file_identity(path: Path) -> dict[str, int]:
    """Device, inode, size, mtime and change time of `path`; stat'ed through an open handle, as an
    open revalidates what a network filesystem cached of the file."""
    with open(path, "rb") as handle:
        stat = os.fstat(handle.fileno())
    return {"dev": stat.st_dev, "ino": stat.st_ino, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "ctime_ns": stat.st_ctime_ns}


def too_recent(identity: dict[str, int]) -> bool:
    """Whether a file of this identity changed less than RACY_S ago, so its identity cannot vouch for it."""
    return time.time_ns() - identity["ctime_ns"] < RACY_S * 1e9


def keying(recipe: Recipe) -> dict[str, Any]:
    """What the sample keys of a table depend on besides the dataset file."""
    return {"fingerprint": recipe.fingerprint(), "skip_invalid": recipe.skip_invalid,
            "max_samples": recipe.max_samples}


def run_dataset(recipe: Recipe, paths: RunPaths, keyed_with: dict[str, Any] | None = None) -> Dataset:
    """The run's dataset as validated and keyed now: the saved table when it was made from this very
    file with this keying (`keying(recipe)`), else the file loaded (DatasetError for bad input)."""
    keyed_with = keyed_with or keying(recipe)
    return saved_dataset(paths, Path(recipe.dataset_file), keyed_with) or load_dataset(
        recipe.dataset_file, keyed_with["fingerprint"], skip_invalid=recipe.skip_invalid,
        max_samples=recipe.max_samples)


def saved_dataset(paths: RunPaths, dataset_file: Path, keyed_with: dict[str, Any]) -> Dataset | None:
    """The dataset from the saved table, or None when anything about it or its source differs."""
    try:
        saved = json.loads(paths.dataset.read_bytes())
        if not (isinstance(saved, dict) and saved.get("path") == str(dataset_file)
                and saved.get("keyed_with") == keyed_with
                and saved.get("source_file") == file_identity(dataset_path(dataset_file))
                and saved.get("prompts_file") == file_identity(paths.prompts)):
            return None
        samples = read_samples(paths)
        invalid = [InvalidLine(**bad) for bad in saved["invalid_lines"]]
        if len(samples) != saved["rows"]:
            return None
        return Dataset(dataset_file, saved["sha256"], samples, invalid, saved["duplicates"])
    except (OSError, ValueError, KeyError, TypeError, DatasetError):
        return None  # no table, or a damaged one: the dataset is loaded, and the table written again


def save_table(paths: RunPaths, dataset: Dataset, keyed_with: dict[str, Any]) -> None:
    """Write prompts.jsonl and dataset.json for `dataset`, unless they already hold it."""
    info = {
        "path": str(dataset.path), "sha256": dataset.sha256, "rows": len(dataset.samples),
        "invalid_lines": [dataclasses.asdict(bad) for bad in dataset.invalid], "duplicates": dataset.duplicates,
        "keyed_with": keyed_with,
    }
    source = file_identity(dataset_path(dataset.path))
    if too_recent(source):
        source = None  # its next planning loads it again, and vouches for it then
    try:
        saved = json.loads(paths.dataset.read_bytes())
        same_table = saved.get("prompts_file") == file_identity(paths.prompts) and {
            key: value for key, value in saved.items() if key not in ("source_file", "prompts_file")} == info
    except (OSError, ValueError, AttributeError):
        saved, same_table = None, False
    if not same_table:
        atomic_write_jsonl(paths.prompts, (vars(sample) for sample in dataset.samples))  # asdict deep-copies: 10x slower
    if not same_table or saved.get("source_file") != source:
        atomic_write_json(paths.dataset, {**info, "source_file": source, "prompts_file": file_identity(paths.prompts)})
    tables.put(paths.prompts, dataset.samples)


SAMPLE_FIELDS = {field.name for field in dataclasses.fields(Sample)}


def read_samples(paths: RunPaths) -> list[Sample]:
    """The samples of prompts.jsonl; ValueError naming the line when one is not a sample row."""
    def load() -> list[Sample]:
        samples = []
        for number, row in enumerate(read_jsonl(paths.prompts), start=1):
            if row.keys() != SAMPLE_FIELDS:
                raise ValueError(f"{paths.prompts}: row {number} is not a sample of this version "
                                 f"(fields {sorted(row)}); plan the run again to rewrite it")
            samples.append(Sample.of(**row))
        return samples

    return tables.get(paths.prompts, load)
