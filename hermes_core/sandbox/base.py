"""The sandbox interface every backend implements: one isolated environment per session.

Tools never touch the host directly; they go through a `Sandbox`, so the same tool code runs on
every backend (local, docker, ...). A backend creates sandboxes, checks images before a run
(pre-flight) and removes leftovers of dead runs (reaping).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

DEFAULT_COMMAND_TIMEOUT_S = 180.0
DEFAULT_OUTPUT_CAP_BYTES = 64 * 1024


class SandboxError(RuntimeError):
    """A sandbox operation failed in a way the tool should report to the model."""


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

    @abc.abstractmethod
    def read_file(self, path: str) -> bytes:
        """Bytes of a file; raises FileNotFoundError or SandboxError."""

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


class SandboxBackend(abc.ABC):
    name: str

    @abc.abstractmethod
    def open(self, session_id: str, image: str | None = None, cwd: str | None = None) -> Sandbox:
        """Create the environment of one session."""

    def preflight(self, images: set[str]) -> list[str]:
        """Problems with the given images on this backend (empty when all are usable)."""
        return [f"image {image!r}: the {self.name} backend does not run images" for image in sorted(images)]

    def reap(self) -> int:
        """Remove leftovers of dead runs; returns how many were removed."""
        return 0
