"""A sample's working directory (`cwd`): untrusted input from a dataset row, normalised and checked
here, by dataset validation and by every backend before it uses one.

POSIX leaves a path with exactly two leading slashes implementation-defined, so posixpath.normpath
keeps them: `//proc` passed every `startswith("/proc")` check while the kernel, bubblewrap and the
engines read it as /proc. `normalised` makes any leading run of slashes one.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from hermes_core.sandbox.base import SandboxError
from hermes_core.sandbox.host_root import SYSTEM_DIRS

DEFAULT_CWD = "/workspace"  # a row without `cwd`; a relative one lies beneath it
KERNEL_DIRS = ("/proc", "/dev", "/sys")  # the kernel's in every sandbox, never a sample's own folder


def normalised(cwd: str | None, default: str = DEFAULT_CWD) -> str:
    """`cwd` as the absolute path every backend uses: a relative one taken from `default`, `.` and
    `..` resolved (lexically), and every run of slashes one, the leading one included."""
    path = posixpath.normpath(posixpath.join(default, cwd or default))
    return "/" + path.lstrip("/")


def within(path: str, folders: Iterable[str]) -> str | None:
    """The folder of `folders` that the normalised `path` is or lies beneath, or None."""
    return next((top for top in folders if path == top or path.startswith(top + "/")), None)


def cwd_problem(cwd: str, host_system: bool = False) -> str | None:
    """Why `cwd` cannot be a sample's working directory, or None. No backend takes the root or a
    kernel folder; with `host_system` (the sandbox's system folders are the host's, read-only) none of
    those either."""
    if "\0" in cwd:
        return "contains a NUL byte"
    path = normalised(cwd)
    spelled = "" if path == cwd else f" (that is {path})"
    if path == "/":
        return f"is the root folder{spelled}; a working directory is a folder of the sample's own"
    if top := within(path, KERNEL_DIRS):
        return f"is inside {top}{spelled}, the kernel's own folder, which no sandbox uses as a working directory"
    if host_system and (top := within(path, SYSTEM_DIRS)):
        return (f"is inside the host's read-only {top}{spelled}: without an image, the sandbox's system folders "
                "are the host's; choose another working directory or give the row an image")
    return None


def checked_cwd(cwd: str | None, host_system: bool = False) -> str:
    """`cwd` normalised, once `cwd_problem` finds nothing against it; else a SandboxError naming it."""
    if cwd is not None and (problem := cwd_problem(cwd, host_system)):
        raise SandboxError(f"cwd {cwd!r} {problem}")
    return normalised(cwd)
