"""The rows of a run's exports and where they are written: shared by `hf`, `trl` and `card`."""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from hermes_core.batch.pipeline import RunPaths, current_records
from hermes_core.fileio import fsync_path, read_jsonl
from hermes_core.formats.filters import Disposition

DISCARDED = frozenset({Disposition.DISCARDED_NO_REASONING, Disposition.DISCARDED_HALLUCINATED_TOOL,
                       Disposition.DISCARDED_INCOMPLETE})
SFT_ROWS = "sft.jsonl"  # an environment run's reward-filtered rows (its `sft_rows` asset writes them)


class ExportError(ValueError):
    """The run cannot be exported (no such run, nothing planned, no token for a push...)."""


class ExportPaths:
    """Where the exports of one run live (the layout is in the `hermes_core.exports` docstring)."""

    def __init__(self, run_dir: Path, include_discarded: bool = False):
        self.run = RunPaths(Path(run_dir))
        self.include_discarded = include_discarded
        self.root = self.run.root / "with_discarded" if include_discarded else self.run.root
        self.hf = self.root / "hf"
        self.parquet = self.root / "trajectories.parquet"
        self.card = self.root / "DATASET_CARD.md"
        self.trl = self.root / "trl"
        self.trl_jsonl = self.trl / "messages.jsonl"
        self.trl_parquet = self.trl / "messages.parquet"


@dataclass(frozen=True)
class ExportRow:
    row: dict[str, Any]  # the §8.1 row, `prompt_index` as of the dataset now
    disposition: str
    messages: list[dict[str, Any]] | None  # the agent's OpenAI messages, when the ledger recorded them


def environment_rows(paths: RunPaths) -> Path | None:
    """The reward-filtered rows file when the folder is an environment run's (no planned batch run), else None."""
    sft = paths.root / SFT_ROWS
    return sft if not paths.prompts.is_file() and sft.is_file() else None


def collect_rows(paths: RunPaths, include_discarded: bool = False) -> list[ExportRow]:
    """Kept (and optionally discarded) samples of the current dataset, in prompt order; for an environment
    run, its reward-filtered rows (all kept: the filter was the reward)."""
    if (sft := environment_rows(paths)) is not None:
        return [ExportRow(row, Disposition.KEPT, None) for row in read_jsonl(sft)]
    if not paths.prompts.is_file():
        raise ExportError(f"{paths.root}: no planned run here (run hermes-batch, or materialize its prompts)")
    wanted = {Disposition.KEPT} | (DISCARDED if include_discarded else set())
    return [
        ExportRow({**record["row"], "prompt_index": sample.prompt_index}, record["disposition"], record.get("messages"))
        for sample, record in current_records(paths)
        if record["disposition"] in wanted and record.get("row") is not None
    ]


def to_dataset(rows: list[dict[str, Any]], features: Any) -> Any:
    """A `datasets.Dataset` of exactly `features` (a `datasets.Features`), built through an Arrow table of
    that schema so no column type is inferred from the data."""
    import datasets
    import pyarrow as pa

    return datasets.Dataset(pa.Table.from_pylist(rows, schema=features.arrow_schema))


@contextmanager
def atomic_path(final: Path, directory: bool = False) -> Iterator[Path]:
    """A temp path beside `final` to write into; on success it replaces `final` (fsync'd first), on
    error it is removed and `final` is untouched. A folder cannot be renamed over a non-empty one, so
    the old folder is moved aside first: the only window shows no folder, never a partial one."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        yield tmp
        for file in (p for p in tmp.rglob("*") if p.is_file()) if directory else [tmp]:
            fsync_path(file)
        if directory:
            fsync_path(tmp)
            old = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}.old"
            if final.exists():
                os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_path(final.parent)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
