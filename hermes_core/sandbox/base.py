"""The sandbox interface every backend implements: one isolated environment per session.

Tools never touch the host directly; they go through a `Sandbox`, so the same tool code runs on
every backend (local, docker, ...). A backend creates sandboxes, checks images before a run
(pre-flight) and removes leftovers of dead runs (reaping).
"""

from __future__ import annotations

import abc
import errno
import os
import stat
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping, TypeVar

from hermes_core.sandbox.images import Images, image_problems
from hermes_core.sandbox.terminal_env import setting_from_env

DEFAULT_COMMAND_TIMEOUT_S = 180.0
DEFAULT_OUTPUT_CAP_BYTES = 64 * 1024
MAX_READ_BYTES = 256 << 20  # what read_file takes at most by default (a sandbox's file may grow forever)
# How backends that read through a shell in the sandbox read a file: $1 the path, $2 the most bytes
# to print (one more than the limit, so that a larger file shows). Only a regular file is opened: a
# FIFO would hold the read until its timeout, a device stream forever.
READ_MISSING, READ_DIRECTORY, READ_IRREGULAR = 90, 91, 92  # its exit codes, apart from the shell's own
READ_SCRIPT = (f'[ -e "$1" ] || exit {READ_MISSING}; [ -d "$1" ] && exit {READ_DIRECTORY}; '
               f'[ -f "$1" ] || exit {READ_IRREGULAR}; exec head -c "$2" -- "$1"')
Job = TypeVar("Job")


@dataclass(frozen=True)
class SandboxSettings:
    """What every backend honours. Environment: HERMES_SANDBOX_<FIELD> (e.g. HERMES_SANDBOX_NETWORK=1)."""

    run_name: str = "adhoc"  # labels sandboxes so a reaper can tell whose they are
    network: bool = False  # sandboxes have no network unless asked
    memory_mb: int = 2048
    pids: int = 512
    cpus: float = 1.0
    # All sandboxes of the host together (0: half its memory, half its process ids); see cgroups.host_share.
    host_memory_mb: int = 0
    host_pids: int = 0
    # The local backend's writable folders (workspace and /tmp, or an image's writable layer) are each
    # a tmpfs of this size: a full one fails the write with "No space left on device".
    disk_mb: int = 1024
    host_uid: int = 100000  # local backend as root: the sandbox's root is this unprivileged host uid
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES
    exec_server: bool = True  # local backend: one bubblewrap per session, commands through its exec server
    allow_pull: bool = False  # may pre-flight pull missing images (docker/singularity)
    state_root: Path | None = None  # where session state lives on the host (default: temp dir)
    image_root: Path | None = None  # the only host folder images may come from (local rootfs, singularity)
    # The image of a sample whose row names none (docker, modal, singularity); get_backend fills in
    # TERMINAL_<BACKEND>_IMAGE or hermes-agent's default (hermes_core.sandbox.terminal_env).
    default_image: str | None = None

    @classmethod
    def from_env(cls, **overrides: object) -> "SandboxSettings":
        values: dict[str, object] = {}
        for field in fields(cls):
            found = setting_from_env(field.name)  # HERMES_SANDBOX_<FIELD>, else hermes-agent's TERMINAL_* name
            if found is None or field.name in overrides:
                continue
            variable, raw = found
            kind = field.type if isinstance(field.type, str) else field.type.__name__
            try:
                if kind.startswith("bool"):
                    values[field.name] = raw.strip().lower() in ("1", "true", "yes", "on")
                elif kind.startswith("int"):
                    values[field.name] = int(raw)
                elif kind.startswith("float"):
                    values[field.name] = float(raw)
                elif kind.startswith("Path"):
                    values[field.name] = Path(raw)
                else:
                    values[field.name] = raw
            except ValueError as exc:
                raise ValueError(f"{variable}={raw!r}: {exc}") from exc
        return cls(**{**values, **overrides})  # type: ignore[arg-type]


class SandboxError(RuntimeError):
    """A sandbox operation failed in a way the tool should report to the model."""


class SandboxFailed(SandboxError):
    """The sandbox is unusable for good (e.g. closed, or its server died): every later operation fails
    alike, so whoever waits on it (execute_code's tool channel) stops instead of asking again."""


@dataclass(frozen=True)
class ExecResult:
    output: str  # stdout and stderr interleaved, capped
    exit_code: int | None  # None when the command was killed by the timeout
    timed_out: bool = False
    truncated: bool = False


@dataclass(frozen=True)
class ProcessStatus:
    process_id: int
    command: str
    running: bool
    exit_code: int | None
    output: str  # the tail of its output, capped
    truncated: bool = False


def find_job(jobs: Mapping[int, Job], process_id: int) -> Job:
    """A session's background command `process_id`; a SandboxError naming the known ones if there is none."""
    if process_id not in jobs:
        known = ", ".join(map(str, jobs)) or "none"
        raise SandboxError(f"no background process {process_id} (known: {known})")
    return jobs[process_id]


class Sandbox(abc.ABC):
    """One session's environment. Paths are as seen from inside the sandbox; relative ones
    resolve against `cwd`."""

    session_id: str
    cwd: str

    @abc.abstractmethod
    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run a shell command to completion; a timeout kills its whole process tree."""

    @abc.abstractmethod
    def spawn(self, command: str) -> int:
        """Start a background shell command; returns its process id for `poll`/`kill`."""

    @abc.abstractmethod
    def poll(self, process_id: int) -> ProcessStatus:
        """State and output so far of a background command started by `spawn`."""

    @abc.abstractmethod
    def kill(self, process_id: int) -> ProcessStatus:
        """Stop a background command and its children."""

    @abc.abstractmethod
    def processes(self) -> list[ProcessStatus]:
        """Every background command of this session."""

    def spawn_pty(self, command: str) -> int:
        """`spawn` with a pseudo-terminal as the command's stdin, stdout and stderr."""
        raise SandboxError(f"the {type(self).__name__} backend cannot give background processes a terminal")

    def write_stdin(self, process_id: int, data: bytes) -> None:
        """Send `data` to the stdin of a running background command."""
        raise SandboxError(f"the {type(self).__name__} backend cannot send input to background processes")

    def close_stdin(self, process_id: int) -> None:
        """End the input of a running background command (it reads end-of-file)."""
        raise SandboxError(f"the {type(self).__name__} backend cannot send input to background processes")

    def start(self) -> None:
        """Get ready for commands now rather than at the first (e.g. start the session's own process);
        the first command does whatever is left. Raises SandboxError."""

    def interrupt(self) -> bool:
        """Stop the commands running right now (called from another thread) as their timeout would:
        each call returns with its command's tree killed. Background processes, files and the sandbox
        stay usable. False when the backend cannot; its commands then run until their timeout."""
        return False

    @abc.abstractmethod
    def read_file(self, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        """Bytes of a regular file (links followed) of at most `limit` bytes; raises FileNotFoundError,
        or SandboxError for a directory, anything else that is not a regular file (never opened: a FIFO
        would block, a device stream) and a larger file (never read whole: `too_large`)."""

    @abc.abstractmethod
    def write_file(self, path: str, data: bytes) -> str:
        """Write a file (creating parent folders); returns the resolved path."""

    @abc.abstractmethod
    def close(self) -> None:
        """Kill every process of the session and delete its writable state. Idempotent."""

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _amount(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 and not size % (1 << 20) else f"{size:,} bytes"


def too_large(path: str, limit: int) -> SandboxError:
    return SandboxError(f"{path!r} is larger than {_amount(limit)}, the limit of this read")


def not_regular(path: str) -> SandboxError:
    return SandboxError(f"{path!r} is not a regular file (a FIFO, socket or device); only regular files are read")


def script_read(path: str, exit_code: int | None, data: bytes, limit: int, message: str = "") -> bytes:
    """The file a READ_SCRIPT run printed (`data`), or the error its exit code (None: timed out) means."""
    if exit_code == READ_MISSING:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    if exit_code == READ_DIRECTORY:
        raise SandboxError(f"{path!r} is a directory")
    if exit_code == READ_IRREGULAR:
        raise not_regular(path)
    if exit_code is None:
        raise SandboxError(f"reading {path!r} timed out")
    if len(data) > limit:
        raise too_large(path, limit)
    if exit_code != 0:
        raise SandboxError(f"could not read {path!r}: {message or f'exit code {exit_code}'}")
    return data


def read_host_file(host: Path, path: str, limit: int) -> bytes:
    """A regular file at `host` (a resolved host path: no link is followed) of at most `limit` bytes,
    named `path` in errors. Opened without blocking and checked after opening, so a FIFO or device
    swapped in meanwhile is refused too."""
    try:
        fd = os.open(host, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
    except OSError as exc:
        raise SandboxError(f"could not read {path!r}: {exc.strerror or exc}") from exc
    with open(fd, "rb", closefd=True) as handle:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise SandboxError(f"{path!r} is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise not_regular(path)
        if info.st_size > limit:
            raise too_large(path, limit)
        data = handle.read(limit + 1)  # it may have grown since
    if len(data) > limit:
        raise too_large(path, limit)
    return data


class SandboxBackend(abc.ABC):
    """Backends are built as `Backend(settings: SandboxSettings)`."""

    name: str
    isolated: bool = True  # False only for the explicit, unisolated `plain` backend

    @abc.abstractmethod
    def open(self, session_id: str, image: str | None = None, cwd: str | None = None) -> Sandbox:
        """Create the environment of one session."""

    def image_problem(self, image: str) -> str | None:
        """Why this backend refuses `image` (a dataset row's: untrusted) without looking anything up
        beyond the host's image root; None when it may be used. Every backend's `open` and
        `preflight` go through it (shared checks: `hermes_core.sandbox.images`)."""
        return f"the {self.name} backend does not run images"

    def preflight(self, images: Images) -> list[str]:
        """Problems with the given images on this backend (empty when all are usable). `images` may
        map each image to the dataset lines naming it, so that problems name those lines too."""
        return image_problems(images, self.image_problem)

    def reap(self) -> int:
        """Remove leftovers of dead runs; returns how many were removed."""
        return 0

    def prepare(self, sessions: int) -> None:
        """Get ready, in the background, for `sessions` sessions without an image about to open (e.g.
        make their reusable parts ahead); `close` frees what it made. Nothing by default."""

    def close(self) -> None:
        """Free what the backend keeps between sessions (e.g. reusable namespaces). Sessions still
        open stay usable; the backend may be used again afterwards."""

    def __enter__(self) -> "SandboxBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
