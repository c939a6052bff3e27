"""`hermes-batch`, with the time Dagster spends recording events (every event write goes through
`DagsterInstance.handle_new_event`) summed into the JSON file named by $HERMES_BENCH_EVENTS."""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

import dagster as dg

from hermes_assets.cli import batch_main

totals = {"events": 0, "seconds": 0.0}
_handle = dg.DagsterInstance.handle_new_event


def _timed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    try:
        return _handle(self, *args, **kwargs)
    finally:
        totals["events"] += 1
        totals["seconds"] += time.perf_counter() - started


dg.DagsterInstance.handle_new_event = _timed
atexit.register(lambda: open(os.environ["HERMES_BENCH_EVENTS"], "w").write(json.dumps(totals)))

if __name__ == "__main__":
    sys.exit(batch_main(sys.argv[1:]))
