"""Small file systems of a test's own (needs root), to fill up without touching the host's disk."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def tmpfs(point: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` MiB mounted on `point` (made here) until the block ends."""
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=True)
