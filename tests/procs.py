"""Finding processes on the host by command line, to prove sandboxes left nothing running."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable


def processes_with(text: str) -> list[str]:
    """Command lines of live (non-zombie) host processes that contain `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            raw = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in raw and "State:\tZ" not in (cmdline.parent / "status").read_text():
                found.append(raw)
        except OSError:
            continue
    return found


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `predicate` until it holds or `timeout` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
