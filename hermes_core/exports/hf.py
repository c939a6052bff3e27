"""The run as a Hugging Face dataset: `hf/` (save_to_disk), `trajectories.parquet`, the dataset card,
and `push_to_hub`.

One explicit `datasets.Features` (`trajectory_features`), identical on every row, run and machine:
- the §8.1 columns in order, then `tool_stats_other`, `tools` and `disposition`;
- `conversations`: list of `{from, value}` strings;
- `metadata`: a struct of the fixed fields `records.py` writes; the dataset row's own `metadata`
  (`input_metadata`, any JSON) and any key outside the fixed ones (`other`) as JSON strings;
- `tool_stats` / `tool_error_counts`: structs over the tool universe (SPEC §3.1: the static tool list
  plus registered tools — never what happens to be installed), zeros when unused. Names outside it
  (hallucinated tools, which only discarded rows have) move to `tool_stats_other`, a list of
  `{tool, count, success, failure}`: a struct field per invented name would change the schema per row;
- `id`, `extra` (caller's values of any JSON type) and `tools` (the offered tool definitions
  `{name, description, parameters}`, whose parameter schemas differ per tool) as JSON strings;
  tool-call arguments live inside the ShareGPT turn text already;
- `toolset_seed` is int64 (63 bits of a sha256, so JSON readers keep it an integer).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
from huggingface_hub import HfApi, get_token

from hermes_core.exports.rows import ExportError, ExportPaths, ExportRow, atomic_path, collect_rows, to_dataset
from hermes_core.exports.card import render_card
from hermes_core.exports.trl import export_trl, tool_definitions
from hermes_core.fileio import atomic_write_text

_STRING, _INT = datasets.Value("string"), datasets.Value("int64")
METADATA_FIELDS: dict[str, datasets.Value] = {
    "batch_num": _INT, "timestamp": _STRING, "model": _STRING, "served_model": _STRING,
    "tool_call_mode": _STRING, "run_name": _STRING,
    "partition_key": _STRING, "dagster_run_id": _STRING, "distribution": _STRING, "code_version": _STRING,
    "recipe_fingerprint": _STRING, "dataset_sha256": _STRING,
}
USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens")
_STAT = {"count": _INT, "success": _INT, "failure": _INT}
# Where push_to_hub puts each export in the Hub repo (the card's `configs` point at these).
HUB_TRAJECTORIES = "data/train-00000-of-00001.parquet"
HUB_MESSAGES = "messages/train-00000-of-00001.parquet"


def tool_universe() -> list[str]:
    from hermes_core.tools import registry  # importing the tools package registers every tool

    return registry.universe


def trajectory_features(universe: list[str] | None = None) -> datasets.Features:
    universe = tool_universe() if universe is None else universe
    return datasets.Features({
        "prompt_index": _INT,
        "conversations": datasets.List({"from": _STRING, "value": _STRING}),
        "metadata": {**METADATA_FIELDS, "input_metadata": _STRING, "other": _STRING},
        "completed": datasets.Value("bool"),
        "partial": datasets.Value("bool"),
        "api_calls": _INT,
        "toolsets_used": datasets.List(_STRING),
        "tool_stats": {name: dict(_STAT) for name in universe},
        "tool_error_counts": {name: _INT for name in universe},
        "tool_stats_other": datasets.List({"tool": _STRING, **_STAT}),
        "sample_key": _STRING,
        "tools_offered": datasets.List(_STRING),
        "toolset_seed": datasets.Value("int64"),
        "usage": {name: _INT for name in USAGE_FIELDS},
        "id": _STRING,
        "extra": _STRING,
        "tools": _STRING,
        "disposition": _STRING,
    })


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def hf_row(item: ExportRow, universe: list[str]) -> dict[str, Any]:
    """One §8.1 row in the shape of `trajectory_features`."""
    row = item.row
    metadata = dict(row.get("metadata") or {})
    fixed = {name: metadata.pop(name, None) for name in METADATA_FIELDS}
    input_metadata = metadata.pop("input_metadata", None)
    stats = row.get("tool_stats") or {}
    zero = {"count": 0, "success": 0, "failure": 0}
    system = next((t["value"] for t in row["conversations"] if t.get("from") == "system"), "")
    return {
        "prompt_index": row["prompt_index"],
        "conversations": [{"from": t.get("from"), "value": t.get("value")} for t in row["conversations"]],
        "metadata": {**fixed, "input_metadata": _json(input_metadata), "other": _json(metadata)},
        "completed": row.get("completed"),
        "partial": row.get("partial"),
        "api_calls": row.get("api_calls"),
        "toolsets_used": row.get("toolsets_used") or [],
        "tool_stats": {name: {**zero, **stats.get(name, {})} for name in universe},
        "tool_error_counts": {name: stats.get(name, zero)["failure"] for name in universe},
        "tool_stats_other": [{"tool": name, **{k: s[k] for k in zero}} for name, s in stats.items()
                             if name not in universe],
        "sample_key": row["sample_key"],
        "tools_offered": row.get("tools_offered") or [],
        "toolset_seed": row.get("toolset_seed"),
        "usage": {name: (row.get("usage") or {}).get(name) for name in USAGE_FIELDS},
        "id": _json(row.get("id")),
        "extra": _json(row.get("extra")),
        "tools": _json(tool_definitions(system) or []),
        "disposition": item.disposition,
    }


def content_sha256(rows: list[dict[str, Any]]) -> str:
    """sha256 of the exported rows as canonical JSON lines: the same for every format of one export."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update((json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))
    return digest.hexdigest()


@dataclass(frozen=True)
class HfExport:
    rows: int
    features: datasets.Features
    sha256: str
    paths: dict[str, Path]
    dispositions: dict[str, int]


def export_hf(run_dir: Path, include_discarded: bool = False, targets: tuple[str, ...] = ("hf", "parquet"),
              repo_id: str | None = None) -> HfExport:
    """Write `hf/` (with README.md) and/or `trajectories.parquet` (with DATASET_CARD.md beside it)."""
    paths = ExportPaths(run_dir, include_discarded)
    items = collect_rows(paths.run, include_discarded)
    universe = tool_universe()
    features = trajectory_features(universe)
    rows = [hf_row(item, universe) for item in items]
    dataset = to_dataset(rows, features)
    sha = content_sha256(rows)
    card = render_card(paths, items, features=features, sha256=sha, repo_id=repo_id)
    written: dict[str, Path] = {}
    if "parquet" in targets:
        with atomic_path(paths.parquet) as tmp:
            dataset.to_parquet(str(tmp))
        written["parquet"] = paths.parquet
        written["dataset_card"] = atomic_write_text(paths.card, card)
    if "hf" in targets:
        with atomic_path(paths.hf, directory=True) as tmp:
            dataset.save_to_disk(str(tmp))
            (tmp / "README.md").write_text(card, encoding="utf-8")
        written["hf_dataset"] = paths.hf
    counts: dict[str, int] = {}
    for item in items:
        counts[item.disposition] = counts.get(item.disposition, 0) + 1
    return HfExport(len(rows), features, sha, written, counts)


def push_to_hub(run_dir: Path, repo_id: str, token: str | None = None, private: bool = True,
                include_discarded: bool = False) -> str:
    """Export afresh, then upload in one commit to the dataset repo `repo_id` (created if missing,
    private unless asked): README.md (the card, whose `configs` name both files),
    `data/…parquet` (this module's Features) and `messages/…parquet` (the TRL form).

    The token is `token`, else $HF_TOKEN or the saved `hf auth login`. Returns the commit URL."""
    token = token or get_token()
    if not token:
        raise ExportError(f"pushing to {repo_id!r} needs a Hugging Face token: set HF_TOKEN or run `hf auth login`")
    paths = ExportPaths(run_dir, include_discarded)
    result = export_hf(run_dir, include_discarded, targets=("parquet",), repo_id=repo_id)
    export_trl(run_dir, include_discarded)
    with tempfile.TemporaryDirectory(prefix="hermes-hub-") as staging:
        folder = Path(staging)
        for source, target in ((result.paths["parquet"], HUB_TRAJECTORIES), (paths.trl_parquet, HUB_MESSAGES)):
            (folder / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, folder / target)
        shutil.copyfile(paths.card, folder / "README.md")
        api = HfApi(token=token)
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=folder,
                                   commit_message=f"Hermes Foundry export of run {paths.run.root.name} "
                                   f"({result.rows} rows, sha256 {result.sha256[:12]})")
    return str(getattr(commit, "commit_url", commit))
