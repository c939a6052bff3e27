"""The `plain` backend: NO isolation. Commands run directly on the host, as this process's user, in
a private temporary folder; they can read (and, with this user's rights, change) the host's files,
reach the network and see other processes. Use it only when explicitly chosen (e.g. on machines
without bubblewrap). It prints nothing itself: callers read `PlainBackend.isolated` (False) and
`name` ("plain") to warn their users.

The isolated default is `hermes_core.sandbox.bubblewrap` ("local"); both share the process helpers of
`hermes_core.sandbox.processes`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hermes_core.sandbox.base import (MAX_READ_BYTES, ExecResult, Sandbox, SandboxBackend, SandboxError,
                                      SandboxSettings, read_host_file)
from hermes_core.sandbox.cwd import checked_cwd
from hermes_core.sandbox.jobs import BackgroundJobs, BackgroundJobsMixin
from hermes_core.sandbox.processes import orphaned, owned_folder, sanitized_env, shell_argv
from hermes_core.sandbox.trees import remove_tree

NO_IMAGES = "the plain backend runs commands on the host and has no images; choose a backend that runs images"


class PlainSandbox(BackgroundJobsMixin, Sandbox):
    """A session on the host: commands run in `workdir` (a private temporary folder) as this user.
    File tools are confined to the workdir; commands are not (that is what `plain` means)."""

    def __init__(self, session_id: str, workdir: Path, state_dir: Path, settings: SandboxSettings,
                 cwd: str | None = None) -> None:
        self.session_id, self.workdir, self.state_dir = session_id, workdir.resolve(), state_dir
        self.command_timeout, self.output_cap = settings.command_timeout_s, settings.output_cap_bytes
        # The dataset's cwd (often absolute, like "/app") becomes a folder inside the workdir.
        target = (self.workdir / (cwd or "").lstrip("/")).resolve()
        if not target.is_relative_to(self.workdir):
            raise SandboxError(f"cwd {cwd!r} escapes the sandbox working directory")
        target.mkdir(parents=True, exist_ok=True)
        self.cwd = str(target)
        self.env = sanitized_env(str(self.workdir))
        # Logs outside the workdir: commands can't clobber them.
        self.jobs = BackgroundJobs(lambda: state_dir, self.output_cap, settings.disk_mb << 20)
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.session_id!r} is closed")
        Path(self.cwd).mkdir(parents=True, exist_ok=True)  # a command may have deleted it

    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        self._check_open()
        timeout = self.command_timeout if timeout is None else float(timeout)
        if timeout <= 0:
            raise SandboxError("timeout must be positive")
        return self.jobs.run(shell_argv(command), self.cwd, self.env, timeout, self.output_cap)[0]

    def spawn(self, command: str, pty: bool = False) -> int:
        self._check_open()
        return self.jobs.start(command, shell_argv(command), self.cwd, self.env, pty=pty)

    def spawn_pty(self, command: str) -> int:
        return self.spawn(command, pty=True)

    def _resolve(self, path: str) -> Path:
        self._check_open()
        # resolve() follows symlinks, so a link inside the workdir can't lead a read or write outside.
        resolved = (Path(self.cwd) / path).resolve()
        if not resolved.is_relative_to(self.workdir):
            raise SandboxError(f"path {path!r} is outside the sandbox working directory {self.workdir}")
        if resolved.is_dir():
            raise SandboxError(f"{path!r} is a directory")
        return resolved

    def read_file(self, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        return read_host_file(self._resolve(path), path, limit)

    def write_file(self, path: str, data: bytes) -> str:
        resolved = self._resolve(path)
        resolved.parent.mkdir(parents=True, exist_ok=True)
        resolved.write_bytes(data)
        return str(resolved)

    def _release(self) -> None:
        if not remove_tree(self.workdir):  # else its state folder (named for us) stays: a later reap() tries again
            remove_tree(self.state_dir)


class PlainBackend(SandboxBackend):
    """Sessions in `state_root/<session_id>-<random>`; their private state (owner pid, background
    logs) in the sibling folder `<session_id>-<random>.state`."""

    name = "plain"
    isolated = False

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self.state_root = Path(self.settings.state_root or Path(tempfile.gettempdir()) / "hermes-sandboxes")

    def open(self, session_id: str, image: str | None = None, cwd: str | None = None) -> PlainSandbox:
        if image:
            raise SandboxError(f"image {image!r}: {NO_IMAGES}")
        checked_cwd(cwd)  # what every backend refuses; the rest becomes a folder inside the workdir
        self.state_root.mkdir(parents=True, exist_ok=True)
        # The state folder (its name says the owner) exists before the workdir, so reap() never finds
        # a workdir without an owner.
        state_dir = owned_folder(self.state_root, session_id, suffix=".state")
        workdir = state_dir.with_suffix("")
        workdir.mkdir(mode=0o700)
        try:
            return PlainSandbox(session_id, workdir, state_dir, self.settings, cwd)
        except BaseException:
            remove_tree(workdir)
            remove_tree(state_dir)
            raise

    def image_problem(self, image: str) -> str | None:
        return NO_IMAGES

    def reap(self) -> int:
        removed = 0
        for state_dir in self.state_root.glob("*.state") if self.state_root.is_dir() else []:
            if orphaned(state_dir) and not remove_tree(state_dir.with_suffix("")):  # else a later reap tries again
                removed += not remove_tree(state_dir)
        return removed
