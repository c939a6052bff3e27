"""The local backend: every session runs on the host, unisolated, in a private temporary folder.

Isolated backends (bubblewrap, containers) come later and reuse the process helpers of
`hermes_core.sandbox.processes`; a subclass of `LocalSandbox` only has to wrap `_argv`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hermes_core.sandbox.base import (DEFAULT_COMMAND_TIMEOUT_S, DEFAULT_OUTPUT_CAP_BYTES, ExecResult, ProcessStatus,
                                      Sandbox, SandboxBackend, SandboxError)
from hermes_core.sandbox.processes import (group_alive, kill_process_group, owner_alive, process_start_time,
                                           read_capped_file, run_command, sanitized_env, shell_argv, shell_exit_code)

STALE_STATE_S = 60.0  # a session folder without an owner file is only reaped after this long
NO_IMAGE_SUPPORT = "the local backend has no image support yet; configure a sandbox backend that runs images"


def _remove_tree(path: Path) -> None:
    def retry(func, target, _exc):  # type: ignore[no-untyped-def]
        try:  # a command may have made folders read-only
            os.chmod(os.path.dirname(target), 0o700)
            func(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


@dataclass
class _Background:
    command: str
    proc: subprocess.Popen
    log: Path


class LocalSandbox(Sandbox):
    """A session on the host: commands run in `workdir` (a private temporary folder) as this user."""

    def __init__(self, session_id: str, workdir: Path, state_dir: Path, cwd: str | None = None,
                 command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S, output_cap: int = DEFAULT_OUTPUT_CAP_BYTES) -> None:
        self.session_id, self.workdir, self.state_dir = session_id, workdir.resolve(), state_dir
        self.command_timeout, self.output_cap = command_timeout, output_cap
        # The dataset's cwd (often absolute, like "/app") becomes a folder inside the workdir.
        target = (self.workdir / (cwd or "").lstrip("/")).resolve()
        if not target.is_relative_to(self.workdir):
            raise SandboxError(f"cwd {cwd!r} escapes the sandbox working directory")
        target.mkdir(parents=True, exist_ok=True)
        self.cwd = str(target)
        self.env = sanitized_env(str(self.workdir))
        self._background: dict[int, _Background] = {}
        self._exec_groups: set[int] = set()  # groups of `exec` commands that left processes behind
        self._closed = False

    def _argv(self, command: str) -> list[str]:
        return shell_argv(command)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.session_id!r} is closed")
        Path(self.cwd).mkdir(parents=True, exist_ok=True)  # a command may have deleted it

    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        self._check_open()
        timeout = self.command_timeout if timeout is None else float(timeout)
        if timeout <= 0:
            raise SandboxError("timeout must be positive")
        result, pgid = run_command(self._argv(command), self.cwd, self.env, timeout, self.output_cap)
        if group_alive(pgid):  # e.g. `server > log 2>&1 &` outlives the command; close() stops it
            self._exec_groups.add(pgid)
        return result

    def spawn(self, command: str) -> int:
        self._check_open()
        process_id = len(self._background) + 1  # small ids, easy for a model to quote
        log = self.state_dir / f"process-{process_id}.log"  # outside the workdir: commands can't clobber it
        with open(log, "wb") as out:
            try:
                proc = subprocess.Popen(self._argv(command), cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                raise SandboxError(f"could not start command: {exc}") from exc
        self._background[process_id] = _Background(command, proc, log)
        return process_id

    def _get(self, process_id: int) -> _Background:
        if process_id not in self._background:
            known = ", ".join(map(str, self._background)) or "none"
            raise SandboxError(f"no background process {process_id} (known: {known})")
        return self._background[process_id]

    def poll(self, process_id: int) -> ProcessStatus:
        background = self._get(process_id)
        returncode = background.proc.poll()
        output, truncated = read_capped_file(background.log, self.output_cap)
        return ProcessStatus(process_id=process_id, command=background.command, running=returncode is None,
                             exit_code=None if returncode is None else shell_exit_code(returncode),
                             output=output, truncated=truncated)

    def kill(self, process_id: int) -> ProcessStatus:
        background = self._get(process_id)
        kill_process_group(background.proc.pid, background.proc)
        return self.poll(process_id)

    def processes(self) -> list[ProcessStatus]:
        return [self.poll(process_id) for process_id in sorted(self._background)]

    def _resolve(self, path: str) -> Path:
        self._check_open()
        # resolve() follows symlinks, so a link inside the workdir can't lead a read or write outside.
        resolved = (Path(self.cwd) / path).resolve()
        if not resolved.is_relative_to(self.workdir):
            raise SandboxError(f"path {path!r} is outside the sandbox working directory {self.workdir}")
        if resolved.is_dir():
            raise SandboxError(f"{path!r} is a directory")
        return resolved

    def read_file(self, path: str) -> bytes:
        return self._resolve(path).read_bytes()

    def write_file(self, path: str, data: bytes) -> str:
        resolved = self._resolve(path)
        resolved.parent.mkdir(parents=True, exist_ok=True)
        resolved.write_bytes(data)
        return str(resolved)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for background in self._background.values():
            kill_process_group(background.proc.pid, background.proc)
        for pgid in self._exec_groups:
            if group_alive(pgid):
                kill_process_group(pgid)
        _remove_tree(self.workdir)
        _remove_tree(self.state_dir)


class LocalBackend(SandboxBackend):
    """Sessions in `state_root/<session_id>-<random>`; their private state (owner pid, background
    logs) in the sibling folder `<session_id>-<random>.state`."""

    name = "local"

    def __init__(self, state_root: str | Path | None = None, command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S,
                 output_cap: int = DEFAULT_OUTPUT_CAP_BYTES) -> None:
        self.state_root = Path(state_root or Path(tempfile.gettempdir()) / "hermes-sandboxes")
        self.command_timeout, self.output_cap = command_timeout, output_cap

    def open(self, session_id: str, image: str | None = None, cwd: str | None = None) -> LocalSandbox:
        if image:
            raise SandboxError(f"image {image!r}: {NO_IMAGE_SUPPORT}")
        self.state_root.mkdir(parents=True, exist_ok=True)
        prefix = (re.sub(r"[^A-Za-z0-9_.-]+", "_", session_id)[:48] or "session") + "-"
        # The state folder (with the owner file) exists before the workdir, so reap() never finds
        # a workdir without an owner.
        state_dir = Path(tempfile.mkdtemp(prefix=prefix, suffix=".state", dir=self.state_root))
        owner = {"pid": os.getpid(), "start": process_start_time(os.getpid()), "session_id": session_id}
        (state_dir / "owner.json").write_text(json.dumps(owner))
        workdir = state_dir.with_suffix("")
        workdir.mkdir(mode=0o700)
        try:
            return LocalSandbox(session_id, workdir, state_dir, cwd, self.command_timeout, self.output_cap)
        except BaseException:
            _remove_tree(workdir)
            _remove_tree(state_dir)
            raise

    def preflight(self, images: set[str]) -> list[str]:
        return [f"image {image!r}: {NO_IMAGE_SUPPORT}" for image in sorted(images)]

    def reap(self) -> int:
        removed = 0
        for state_dir in self.state_root.glob("*.state") if self.state_root.is_dir() else []:
            try:
                if owner_alive(json.loads((state_dir / "owner.json").read_text())):
                    continue
            except (OSError, ValueError, TypeError, KeyError):
                try:  # no readable owner: maybe a session being created right now
                    if time.time() - state_dir.stat().st_mtime < STALE_STATE_S:
                        continue
                except OSError:
                    continue
            _remove_tree(state_dir.with_suffix(""))
            _remove_tree(state_dir)
            removed += 1
        return removed
