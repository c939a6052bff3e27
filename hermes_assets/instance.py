"""The shared Dagster instance: `DAGSTER_HOME`, default ./dagster_home (SPEC §13)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import dagster as dg

DEFAULT_CONFIG = Path(__file__).with_name("default_dagster.yaml")


def dagster_home() -> Path:
    """DAGSTER_HOME, resolved; nothing created (the CLI asks this before it imports Dagster)."""
    return Path(os.environ.get("DAGSTER_HOME") or "dagster_home").resolve()


def ensure_dagster_home() -> Path:
    """Resolve DAGSTER_HOME (created with the default dagster.yaml when missing) and export it."""
    home = dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copyfile(DEFAULT_CONFIG, home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def get_instance() -> "dg.DagsterInstance":
    import dagster as dg  # here: the module is imported by the CLI before it knows it needs Dagster

    ensure_dagster_home()
    return dg.DagsterInstance.get()


def storage_failure(exc: BaseException) -> str | None:
    """One line for an error of the instance's SQLite storage, found in `exc` or what caused it, else
    None. A full disk shows there as "disk I/O error" or "database or disk is full"."""
    import sqlite3

    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, sqlite3.Error):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    home = dagster_home()
    free = shutil.disk_usage(home).free if home.exists() else 0
    return (f"Dagster's storage in {home} failed: {seen} ({free / 2**20:.1f} MiB free there). Finished samples "
            "are saved in the run's ledger; if the disk is full, free space, then run the same command to resume")
