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
import sys
from pathlib import Path

from hermes_core.exports.rows import (DISCARDED, ExportError, ExportPaths, ExportRow, atomic_path, collect_rows,
                                      to_dataset)

FORMATS = ("hf", "parquet", "trl")
REPO_ENV = "HERMES_HF_REPO"  # with a token (HF_TOKEN or `hf auth login`), exports are pushed there


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
