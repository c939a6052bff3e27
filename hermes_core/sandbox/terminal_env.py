"""hermes-agent's `TERMINAL_*` environment names, accepted beside ours (ours win when both are set).

A machine set up for the original keeps working: `TERMINAL_ENV` picks the backend (its `local`
is bubblewrap here: isolated, where the original runs on the host), `TERMINAL_TIMEOUT`,
`TERMINAL_CONTAINER_CPU`, `TERMINAL_CONTAINER_MEMORY` (MB) and `TERMINAL_DOCKER_NETWORK` set the
sandbox limits, and `TERMINAL_DOCKER_IMAGE` / `TERMINAL_MODAL_IMAGE` / `TERMINAL_SINGULARITY_IMAGE`
name the image of a sample whose row names none — by default the original's own image.
"""

from __future__ import annotations

import os

BACKEND_ALIAS = "TERMINAL_ENV"
# The original's default image (Python and Node.js), for container backends when a row names none.
ORIGINAL_DEFAULT_IMAGE = "nikolaik/python-nodejs:python3.11-nodejs20"
_DEFAULT_IMAGES = {"docker": ORIGINAL_DEFAULT_IMAGE, "modal": ORIGINAL_DEFAULT_IMAGE,
                   "singularity": f"docker://{ORIGINAL_DEFAULT_IMAGE}"}
# SandboxSettings field -> the original's name for the same setting.
SETTING_ALIASES = {"command_timeout_s": "TERMINAL_TIMEOUT", "cpus": "TERMINAL_CONTAINER_CPU",
                   "memory_mb": "TERMINAL_CONTAINER_MEMORY", "network": "TERMINAL_DOCKER_NETWORK"}


def setting_from_env(field: str) -> tuple[str, str] | None:
    """(variable, raw value) for a SandboxSettings field: HERMES_SANDBOX_<FIELD>, else its alias."""
    for name in (f"HERMES_SANDBOX_{field.upper()}", SETTING_ALIASES.get(field)):
        if name and (raw := os.environ.get(name)) is not None:
            return name, raw
    return None


def backend_from_env(ours: str) -> str | None:
    """The backend named by our variable `ours`, else by the original's TERMINAL_ENV."""
    return os.environ.get(ours) or os.environ.get(BACKEND_ALIAS) or None


def default_image(backend: str, configured: str | None = None) -> str | None:
    """The image of a sample whose row names none, on docker, modal and singularity: `configured`
    (HERMES_SANDBOX_DEFAULT_IMAGE), else TERMINAL_<BACKEND>_IMAGE, else the original's default.
    None elsewhere: the other backends take no default image."""
    if backend not in _DEFAULT_IMAGES:
        return None
    return configured or os.environ.get(f"TERMINAL_{backend.upper()}_IMAGE") or _DEFAULT_IMAGES[backend]
