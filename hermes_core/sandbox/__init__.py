"""Sandboxes: where tools run commands and touch files. `get_backend()` picks the configured one.

Backends are imported lazily by name, so a run on `local` never imports the docker or modal SDKs.
"""

from __future__ import annotations

import dataclasses
import importlib

from hermes_core.sandbox.base import (
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_OUTPUT_CAP_BYTES,
    ExecResult,
    ProcessStatus,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSettings,
)
from hermes_core.sandbox.terminal_env import backend_from_env, default_image

BACKEND_ENV_VAR = "HERMES_TERMINAL_BACKEND"
DEFAULT_BACKEND = "local"

# name -> "module:class"; every class is built as Class(settings: SandboxSettings).
_BACKENDS: dict[str, str] = {
    "local": "hermes_core.sandbox.bubblewrap:BubblewrapBackend",
    "plain": "hermes_core.sandbox.local:PlainBackend",
    "docker": "hermes_core.sandbox.docker:DockerBackend",
    "modal": "hermes_core.sandbox.modal:ModalBackend",
    "singularity": "hermes_core.sandbox.singularity:SingularityBackend",
}


def register_backend(name: str, target: str) -> None:
    """Add a backend: `target` is "module:Class", built as Class(settings)."""
    _BACKENDS[name] = target


def known_backends() -> list[str]:
    return sorted(_BACKENDS)


def get_backend(name: str | None = None, settings: SandboxSettings | None = None) -> SandboxBackend:
    """The backend `name`, else the one named by $HERMES_TERMINAL_BACKEND (or hermes-agent's
    $TERMINAL_ENV), else "local". On container backends, samples without an image get
    `settings.default_image`, else TERMINAL_<BACKEND>_IMAGE, else hermes-agent's default image."""
    chosen = (name or backend_from_env(BACKEND_ENV_VAR) or DEFAULT_BACKEND).strip().lower()
    target = _BACKENDS.get(chosen)
    if target is None:
        raise ValueError(f"unknown sandbox backend {chosen!r}; known backends: {', '.join(known_backends())}")
    module_name, class_name = target.split(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    settings = settings or SandboxSettings.from_env()
    return backend_class(dataclasses.replace(settings, default_image=default_image(chosen, settings.default_image)))


__all__ = [
    "BACKEND_ENV_VAR",
    "DEFAULT_COMMAND_TIMEOUT_S",
    "DEFAULT_OUTPUT_CAP_BYTES",
    "ExecResult",
    "ProcessStatus",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxSettings",
    "get_backend",
    "known_backends",
    "register_backend",
]
