"""The shared Dagster instance: `DAGSTER_HOME`, default ./dagster_home (SPEC §13)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import dagster as dg

DEFAULT_CONFIG = Path(__file__).with_name("default_dagster.yaml")


def ensure_dagster_home() -> Path:
    """Resolve DAGSTER_HOME (created with the default dagster.yaml when missing) and export it."""
    home = Path(os.environ.get("DAGSTER_HOME") or "dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copyfile(DEFAULT_CONFIG, home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def get_instance() -> dg.DagsterInstance:
    ensure_dagster_home()
    return dg.DagsterInstance.get()
