"""Which ledger holds a run's records, opened once per process.

A run's ledger is a folder (`ledger.Ledger`: `raw/<partition>.jsonl`) or a prefix on object storage
(`object_ledger.ObjectLedger`: `HERMES_LEDGER_URL`). This module picks the kind from the location,
so neither kind's module imports the other, and object storage (fsspec) is imported only when used.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from hermes_core.batch.ledger import Ledger
from hermes_core.config import ledger_location

KEEP_OPEN = 4  # ledgers kept parsed per process (the steps of one CLI run share one)
_open: OrderedDict[Path | str, Ledger] = OrderedDict()
_open_lock = threading.Lock()


def ledger_kind(location: Path | str) -> type[Ledger]:
    """The ledger kind at `location`: a folder, or an fsspec URL of object storage."""
    if isinstance(location, str):
        from hermes_core.batch.object_ledger import ObjectLedger  # fsspec and its backends only when asked for

        return ObjectLedger
    return Ledger


def open_ledger(location: Path | str) -> Ledger:
    """The ledger at `location` (a folder, or an fsspec URL of object storage), shared within this
    process and brought up to date."""
    key = location if isinstance(location, str) else location.resolve()
    with _open_lock:
        ledger = _open.get(key)
        if ledger is None:
            ledger = _open[key] = ledger_kind(location)(location)
        _open.move_to_end(key)
        while len(_open) > KEEP_OPEN:
            _open.popitem(last=False)
    return ledger.refresh()


def has_records(location: Path | str) -> bool:
    """Whether any sample of the ledger at `location` was recorded (without loading the records)."""
    return ledger_kind(location).has_records(location)


class LedgerElsewhere(RuntimeError):
    """The run's records are in its folder, but its ledger is configured on object storage."""


def check_one_ledger(run_root: Path) -> None:
    """Refuse to run with the ledger on object storage while the run folder still holds records:
    the run would not see them and would pay for every finished sample again."""
    location, folder = ledger_location(run_root), run_root / "raw"
    if isinstance(location, str) and Ledger.has_records(folder):
        raise LedgerElsewhere(
            f"{folder} holds this run's ledger records, but HERMES_LEDGER_URL puts its ledger at {location}: "
            f"copy them there first with `hermes-foundry ledger-upload --run_name {run_root.name}` "
            "(or unset HERMES_LEDGER_URL); nothing was run")
