"""Training exports of a run (SPEC §8.2): HF `datasets` (save_to_disk + Parquet + dataset card, optional
push to the Hub) and OpenAI messages for TRL `SFTTrainer`.

Layout, inside `data/<run>/` (or `data/<run>/with_discarded/` when discarded samples are exported too,
so the training set and the audit set can never be mistaken for each other):

    hf/                    `Dataset.save_to_disk`, with the dataset card as README.md
    trajectories.parquet   the same rows and Features; the card beside it as DATASET_CARD.md
    trl/messages.jsonl     `messages` (OpenAI format) + `tools` (JSON string); trl/messages.parquet

Rows come from the ledger (`raw/*.jsonl`): the latest record of every sample of the dataset as loaded
now, in prompt order — the same selection as `trajectories.jsonl` — so a discarded sample can be
exported with its disposition. Every final file or folder is written beside its target and renamed
into place: a crash leaves the previous export or the new one, never half of one.

`hf`, `trl` and `card` import `datasets`/`transformers`-adjacent code; they are imported lazily here so
`hermes-foundry --help` stays fast.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from hermes_core.fileio import fsync_path
from hermes_core.filters import Disposition
from hermes_core.pipeline import RunPaths, current_records

FORMATS = ("hf", "parquet", "trl")
REPO_ENV = "HERMES_HF_REPO"  # with a token (HF_TOKEN or `hf auth login`), exports are pushed there
DISCARDED = frozenset({Disposition.DISCARDED_NO_REASONING, Disposition.DISCARDED_HALLUCINATED_TOOL,
                       Disposition.DISCARDED_INCOMPLETE})


class ExportError(ValueError):
    """The run cannot be exported (no such run, nothing planned, no token for a push...)."""


class ExportPaths:
    """Where the exports of one run live (see the module docstring)."""

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


def collect_rows(paths: RunPaths, include_discarded: bool = False) -> list[ExportRow]:
    """Kept (and optionally discarded) samples of the current dataset, in prompt order."""
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


def export_run(run_dir: Path, formats: tuple[str, ...] = FORMATS, include_discarded: bool = False,
               repo_id: str | None = None, token: str | None = None, private: bool = True) -> dict[str, str]:
    """Write the requested exports (and push when `repo_id` is given); returns label -> path or URL."""
    from hermes_core.exports import hf, trl

    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ExportError(f"unknown export format(s) {unknown}; known: {', '.join(FORMATS)}")
    outputs: dict[str, str] = {}
    if "hf" in formats or "parquet" in formats:
        result = hf.export_hf(run_dir, include_discarded, targets=tuple(f for f in formats if f != "trl"))
        outputs.update({f"{label} ({result.rows} rows)": str(path) for label, path in result.paths.items()})
    if "trl" in formats:
        result = trl.export_trl(run_dir, include_discarded)
        outputs.update({f"{label} ({result.rows} rows)": str(path) for label, path in result.paths.items()})
    if repo_id:
        outputs["hub"] = hf.push_to_hub(run_dir, repo_id, token, private=private, include_discarded=include_discarded)
    return outputs


def add_export_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of `hermes-foundry export` (also used by the standalone `export_main`)."""
    parser.add_argument("--run_name", required=True, help="the run to export (a folder under the data root)")
    parser.add_argument("--output_dir", help="data root holding the run (default $HERMES_DATA_DIR or ./data)")
    parser.add_argument("--format", choices=(*FORMATS, "all"), default="all",
                        help="hf: datasets save_to_disk; parquet; trl: OpenAI messages JSONL + Parquet (default all)")
    parser.add_argument("--include_discarded", "--include-discarded", action="store_true",
                        help="also export discarded samples, with their disposition, under <run>/with_discarded/")
    parser.add_argument("--push_to_hub", metavar="REPO", default=os.environ.get(REPO_ENV) or None,
                        help=f"push the Parquet exports and the card to this Hub dataset repo (default ${REPO_ENV}); "
                        "token from $HF_TOKEN or `hf auth login`")
    parser.add_argument("--public", action="store_true", help="create the Hub repo public (default private)")
    return parser


def run_export(args: argparse.Namespace) -> int:
    """`hermes-foundry export`: exit 0 on success, 2 on a usage or data error."""
    from hermes_core.config import data_root

    formats = FORMATS if args.format == "all" else (args.format,)
    try:
        outputs = export_run(data_root(args.output_dir) / args.run_name, formats, args.include_discarded,
                             repo_id=args.push_to_hub, private=not args.public)
    except (ExportError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for label, where in outputs.items():
        print(f"  {label}: {where}")
    return 0


def export_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hermes-foundry export",
                                     description="Export a run's trajectories for training (HF datasets, Parquet, TRL).")
    return run_export(add_export_arguments(parser).parse_args(argv))


__all__ = ["DISCARDED", "FORMATS", "REPO_ENV", "ExportError", "ExportPaths", "ExportRow", "add_export_arguments",
           "atomic_path", "collect_rows", "to_dataset", "export_main", "export_run", "run_export"]
