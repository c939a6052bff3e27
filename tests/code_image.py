"""The code location image of the docker launcher test (deploy/docker/build_image.sh, about a minute of
copying the venv into an image). tests/assets/conftest.py starts the build when that test is collected,
so it runs beside the tests before it; the test's fixture then only waits for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SANDBOX_IMAGE = "hermes-test/bookworm:latest"  # the base of the code image, and the sandboxes' image
CODE_IMAGE = "hermes-foundry/code:test"


def engine_answers() -> bool:
    """A Docker engine answers (DOCKER_HOST or the default socket) and has the sandbox test image."""
    try:
        import docker

        docker.from_env(timeout=5).images.get(SANDBOX_IMAGE)
        return True
    except Exception:
        return False


class ImageBuild:
    """One run of build_image.sh in its own process group, its output in temporary files."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._out = tempfile.TemporaryFile()
        self._err = tempfile.TemporaryFile()

    def start(self) -> None:
        if self._process is None:
            self._process = subprocess.Popen(
                [str(ROOT / "deploy/docker/build_image.sh"), CODE_IMAGE], stdout=self._out, stderr=self._err,
                env={**os.environ, "VENV": str(Path(sys.executable).parents[1])}, start_new_session=True)

    def result(self, timeout: float = 900) -> str:
        """The image's name once built (starting the build if nothing did); a failed build fails the caller."""
        self.start()
        assert self._process is not None
        returncode = self._process.wait(timeout=timeout)
        self._err.seek(0)
        assert returncode == 0, self._err.read().decode(errors="replace")
        self._out.seek(0)
        return self._out.read().decode().strip()

    def stop(self) -> None:
        """End a build still running (its test was not run): the script removes its build context."""
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)
            self._process.wait(timeout=60)


BUILD = ImageBuild()
