"""Trees that sandbox clean-up must cope with (issue 28): deeper than Python's recursion limit and
than PATH_MAX, folders a command locked, and files that nothing can remove."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from hermes_core.sandbox.trees import remove_tree

DEPTH = 1200  # past Python's recursion limit (shutil.rmtree recursed per level) and PATH_MAX
# What a sandboxed command makes in its workspace: the deep folder, one it locked (mode 000) and one
# it made read-only. No `]`, so it fits a `[sim:command=...]` directive.
BUILD_COMMAND = (f"for i in $(seq {DEPTH}); do mkdir d && cd d || exit 1; done; echo x > bottom; cd ~ && "
                 "mkdir -p locked/in ro && touch locked/in/f ro/f && chmod 000 locked && chmod 555 ro && echo built")


def deep_tree(base: Path, depth: int = DEPTH) -> Path:
    """`base/d/d/.../d/bottom` (`depth` folders, built one name at a time: the path is too long to
    use whole), plus `base/locked` (mode 000, not empty) and `base/ro` (read-only, not empty)."""
    base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(parent)
        os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)
    for name, mode in (("locked", 0o000), ("ro", 0o555)):
        (base / name / "in").mkdir(parents=True)
        (base / name / "in" / "f").write_text("x")
        (base / name).chmod(mode)
    return base


def dead_owner_session(state_root: Path, name: str, plain: bool = False) -> Path:
    """A session folder of a process that is gone (named for this pid with another start time: a reused
    pid), holding a `deep_tree`; the plain backend's state (named the same) is the sibling `<folder>.state`."""
    folder = f"{name}-o{os.getpid()}.1-dead"
    if plain:
        (state_root / f"{folder}.state").mkdir(parents=True)
    return deep_tree(state_root / folder)


@contextmanager
def immutable(path: Path) -> Iterator[Path]:
    """`path`, a new file that not even root can remove (chattr +i) until the end of the block."""
    path.write_text("stays")
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.fixture()
def no_deep_tree_left(tmp_path: Path) -> Iterator[None]:
    """Removes the test's tmp_path at its end, deep trees included, failed or not: pytest's own removal
    of old tmp folders recurses per level, and a deep tree left there would crash it in later sessions."""
    yield
    remove_tree(tmp_path)
