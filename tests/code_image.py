"""The code location image of the docker launcher test (deploy/docker/build_image.sh, about a minute of
copying the venv into an image). It builds in the background from collection on, beside the tests
before it; the test's fixture then only waits for it. With pytest-xdist the controller starts the one
build (tests/conftest.py) and whichever worker runs the test waits for its files."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SANDBOX_IMAGE = "hermes-test/bookworm:latest"  # the base of the code image, and the sandboxes' image
CODE_IMAGE = "hermes-foundry/code:test"
SHARED = "HERMES_TEST_CODE_IMAGE_DIR"  # the build's folder, set by an xdist controller for its workers
# The build's output and exit status land in files, so that another process can collect them.
_SCRIPT = 'mkdir -p "$2" && "$3" "$1" >"$2/out" 2>"$2/err"; echo $? >"$2/rc.tmp" && mv "$2/rc.tmp" "$2/rc"'


def engine_answers() -> bool:
    """A Docker engine answers (DOCKER_HOST or the default socket) and has the sandbox test image."""
    try:
        import docker

        docker.from_env(timeout=5).images.get(SANDBOX_IMAGE)
        return True
    except Exception:
        return False


def remove_code_image() -> None:
    """Remove the code image and the run containers made from it. A rebuild only untags the old image,
    so each run left ~1.2 GB of image and two exited containers in the engine, until a CI disk filled up."""
    import docker

    client = docker.from_env(timeout=120)
    for container in client.containers.list(all=True, filters={"ancestor": CODE_IMAGE}):
        container.remove(force=True)
    try:
        client.images.remove(CODE_IMAGE, force=True)
    except docker.errors.ImageNotFound:
        pass


class ImageBuild:
    """One run of build_image.sh in its own process group; its output and status in a folder."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._folder: Path | None = None
        self._owned = False  # made by this process, which removes it at the end

    @property
    def folder(self) -> Path:
        if self._folder is None:
            shared = os.environ.get(SHARED)
            self._folder = Path(shared) if shared else Path(tempfile.mkdtemp(prefix="hermes-code-image-"))
            self._owned = not shared
        return self._folder

    def start(self) -> None:
        """Start the build unless this or another process of the session did."""
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(self.folder / "started", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        remove_code_image()  # what a run that was killed before its teardown left
        self._process = subprocess.Popen(
            ["sh", "-c", _SCRIPT, "sh", CODE_IMAGE, str(self.folder), str(ROOT / "deploy/docker/build_image.sh")],
            env={**os.environ, "VENV": str(Path(sys.executable).parents[1])}, start_new_session=True)

    def result(self, timeout: float = 900) -> str:
        """The image's name once built (starting the build if nothing did); a failed build fails the caller."""
        self.start()
        deadline = time.monotonic() + timeout
        while not (self.folder / "rc").exists():
            assert time.monotonic() < deadline, f"the code image was not built in {timeout:.0f} s"
            time.sleep(0.5)
        assert (self.folder / "rc").read_text().strip() == "0", (self.folder / "err").read_text(errors="replace")
        return (self.folder / "out").read_text().strip()

    def stop(self) -> None:
        """End a build still running (its test was not run; the script removes its build context), and
        remove the build's folder if this process made it."""
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)
            self._process.wait(timeout=60)
        if self._owned and self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


BUILD = ImageBuild()
