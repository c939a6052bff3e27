"""Code versions: a sha256 over the installed `hermes_core` source files that shape each output's rows
(`ROW_SHAPING`); not `hermes_core.__version__`, which stays the same while that code changes.

Every trajectory row names the version of the code that shaped it (`metadata.code_version`), and the
Dagster assets carry the same versions, so a row and its materialization name the same code.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # hermes_core/

# tools/ whole: every tool's schema is rendered into each row's system turn and its code writes the
# tool results; endpoints/constrained.py is the tool-call protocol without a template.
_RAW = ("batch/records.py", "batch/runner.py", "agent/", "formats/sharegpt.py", "formats/filters.py", "tools/",
        "endpoints/constrained.py")
# Per asset, the hermes_core files (a folder: every .py under it) whose change changes what it writes.
# Plumbing that moves bytes without shaping them (ledger storage, locks, progress) is left out on
# purpose: changing it must not mark every run stale.
ROW_SHAPING: dict[str, tuple[str, ...]] = {
    # validation and keying; the recipe's fingerprint is part of every sample key
    "prompts": ("batch/dataset.py", "batch/recipe.py"),
    # the seeded toolset draw and the batch plan
    "toolset_assignments": ("tools/distributions.py", "batch/ledger.py"),
    # the agent loop, the tools offered, the ShareGPT row, its metadata and its disposition
    "raw_trajectories": _RAW,
    # the merge (pipeline.write_trajectories) of rows shaped upstream
    "filtered_trajectories": ("batch/pipeline.py", "fileio.py"),
    "statistics": ("batch/stats.py", "batch/pipeline.py"),
    "compressed_trajectories": ("formats/compression/",),
    "exports": ("exports/",),
}


def source_version(files: Iterable[str], root: Path = PACKAGE_ROOT) -> str:
    """sha256 (16 hex) over the named files under `root` (a folder name: its .py files), path and bytes."""
    paths: list[Path] = []
    for name in files:
        target = root / name
        paths += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def code_version(output: str) -> str:
    """The code version of one of `ROW_SHAPING`'s outputs (hashed once per process)."""
    return source_version(ROW_SHAPING[output])
