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
