"""The docker backend under the sandbox contract: a real engine and a real image.

The engine is DOCKER_HOST's, else the default socket, else the private engine of
`scripts/dockerd.sh start` when it runs. The image is built from the Debian mirror by
`scripts/test_images.sh` (tried once per test session when missing).
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from hermes_core.sandbox import SandboxSettings
from hermes_core.sandbox.docker import LABEL_RUN, DockerBackend

IMAGE = "hermes-test/bookworm:latest"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_SOCKET = "/var/run/docker.sock"
PRIVATE_SOCKET = "/run/hermes-foundry-docker.sock"  # scripts/dockerd.sh


def no_engine_reason() -> str | None:
    """Why no engine can be reached at all (then the tests skip), else None."""
    if os.environ.get("DOCKER_HOST") or os.path.exists(DEFAULT_SOCKET):
        return None  # an engine is configured: if it does not answer, that is a failure, not a skip
    if os.path.exists(PRIVATE_SOCKET):
        os.environ["DOCKER_HOST"] = f"unix://{PRIVATE_SOCKET}"
        return None
    return (f"no Docker engine: DOCKER_HOST is unset and {DEFAULT_SOCKET} is absent "
            "(run `scripts/dockerd.sh start` and export the DOCKER_HOST it prints)")


@functools.lru_cache(maxsize=None)
def missing_image_reason() -> str | None:
    """None when the test image is present, building it once if it is not."""
    backend = DockerBackend(SandboxSettings())
    if not backend.preflight({IMAGE}):
        return None
    built = subprocess.run([str(REPO / "scripts" / "test_images.sh"), "docker"], capture_output=True, text=True,
                           timeout=1800)
    problems = backend.preflight({IMAGE})
    if not problems:
        return None
    tail = "\n".join((built.stdout + built.stderr).strip().splitlines()[-5:])
    return f"test image {IMAGE} is missing and scripts/test_images.sh did not build it: {problems[0]}\n{tail}"


def run_name_for(tmp_path: Path) -> str:
    return "contract-" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]


def make_backend(tmp_path: Path, **settings) -> DockerBackend:
    reason = no_engine_reason()
    if reason:
        pytest.skip(reason)
    DockerBackend(SandboxSettings()).client()  # a configured engine that does not answer fails the test here
    reason = missing_image_reason()
    if reason:
        pytest.skip(reason)
    settings.setdefault("run_name", run_name_for(tmp_path))
    return DockerBackend(SandboxSettings(state_root=tmp_path / "state", **settings))


def leftovers(tmp_path: Path) -> list[str]:
    """Containers of the sessions made with this tmp_path that still exist."""
    client = DockerBackend(SandboxSettings()).client()
    found = client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_name_for(tmp_path)}"})
    return [container.name for container in found]
