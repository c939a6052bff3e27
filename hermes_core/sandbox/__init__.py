"""Sandboxes: where tools run commands and touch files. `get_backend()` picks the configured one."""

from __future__ import annotations

import os
from typing import Any, Callable

from hermes_core.sandbox.base import (
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_OUTPUT_CAP_BYTES,
    ExecResult,
    ProcessStatus,
    Sandbox,
    SandboxBackend,
    SandboxError,
)
from hermes_core.sandbox.local import LocalBackend, LocalSandbox
from hermes_core.sandbox.processes import truncate_output

BACKEND_ENV_VAR = "HERMES_TERMINAL_BACKEND"

# Factories by name; later backends (bubblewrap, docker...) add themselves with `register_backend`.
_BACKENDS: dict[str, Callable[..., SandboxBackend]] = {"local": LocalBackend}


def register_backend(name: str, factory: Callable[..., SandboxBackend]) -> None:
    _BACKENDS[name] = factory


def known_backends() -> list[str]:
    return sorted(_BACKENDS)


def get_backend(name: str | None = None, **options: Any) -> SandboxBackend:
    """The backend `name`, else the one named by $HERMES_TERMINAL_BACKEND, else "local"."""
    chosen = (name or os.environ.get(BACKEND_ENV_VAR) or "local").strip().lower()
    factory = _BACKENDS.get(chosen)
    if factory is None:
        raise ValueError(f"unknown sandbox backend {chosen!r}; known backends: {', '.join(known_backends())}")
    return factory(**options)


__all__ = [
    "BACKEND_ENV_VAR",
    "DEFAULT_COMMAND_TIMEOUT_S",
    "DEFAULT_OUTPUT_CAP_BYTES",
    "ExecResult",
    "LocalBackend",
    "LocalSandbox",
    "ProcessStatus",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "get_backend",
    "known_backends",
    "register_backend",
    "truncate_output",
]
