"""`modal.Sandbox` of the fake SDK: the subset of the real API (modal 1.6) the backend uses, with the
real parameter names, backed by the bubblewrap containers of `modal._cloud`.

Exec semantics copied from the real client: output streams end at the exec's deadline and `wait()`
then returns -1; the fake kills the exec's process group at the deadline (not processes that left
it with setsid: cleaning those up is the caller's job, as with Modal); a signal death reads 128+n.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from typing import Iterator

from modal import _cloud
from modal.exception import (InvalidError, NotFoundError, SandboxFilesystemError, SandboxFilesystemIsADirectoryError,
                             SandboxFilesystemNotFoundError, SandboxTerminatedError)

_READ = '[ -e "$1" ] || exit 2; [ -d "$1" ] && exit 3; exec cat -- "$1"'
_WRITE = '[ -d "$1" ] && exit 3; mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'


class StreamReader:
    def __init__(self, pipe, text: bool, deadline: float | None) -> None:
        self._chunks: queue.Queue = queue.Queue()
        self._text, self._deadline = text, deadline
        threading.Thread(target=self._pump, args=(pipe,), daemon=True).start()

    def _pump(self, pipe) -> None:
        with pipe:
            while chunk := os.read(pipe.fileno(), 65536):
                self._chunks.put(chunk)
        self._chunks.put(None)

    def __iter__(self) -> Iterator:
        while True:
            remaining = None if self._deadline is None else self._deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return  # the real client ends the stream at the exec deadline
            try:
                chunk = self._chunks.get(timeout=remaining)
            except queue.Empty:
                return
            if chunk is None:
                return
            yield chunk.decode(errors="replace") if self._text else chunk

    def read(self):
        parts = list(self)
        return ("" if self._text else b"").join(parts)


class ContainerProcess:
    def __init__(self, popen: subprocess.Popen, text: bool, timeout: int | None) -> None:
        self._popen = popen
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._returncode: int | None = None
        self.stdout = StreamReader(popen.stdout, text, self._deadline)
        self.stderr = StreamReader(popen.stderr, text, self._deadline)

    def _finish(self, code: int | None) -> int | None:
        if code is None and self._deadline is not None and time.monotonic() >= self._deadline:
            try:
                os.killpg(self._popen.pid, signal.SIGKILL)  # the exec's deadline
            except ProcessLookupError:
                pass
            code = -1
        elif code is not None and code < 0:
            code = 128 - code
        if code is not None:
            self._returncode = code
        return code

    def poll(self) -> int | None:
        return self._returncode if self._returncode is not None else self._finish(self._popen.poll())

    def wait(self) -> int:
        if self._returncode is None:
            remaining = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            try:
                self._finish(self._popen.wait(timeout=remaining))
            except subprocess.TimeoutExpired:
                self._finish(None)
        assert self._returncode is not None
        return self._returncode

    @property
    def returncode(self) -> int:
        if self._returncode is None:
            raise InvalidError("You must call wait() before accessing the returncode.")
        return self._returncode


class SandboxFilesystem:
    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def _run(self, script: str, path: str, data: bytes | None = None) -> bytes:
        if not path.startswith("/"):
            raise InvalidError(f"remote path must be absolute: {path!r}")
        done = self._sandbox._run(["/bin/sh", "-c", script, "sh", path], data)
        if done.returncode == 2:
            raise SandboxFilesystemNotFoundError(f"{path}: no such file or directory")
        if done.returncode == 3:
            raise SandboxFilesystemIsADirectoryError(f"{path}: is a directory")
        if done.returncode != 0:
            raise SandboxFilesystemError(f"{path}: {done.stderr.decode(errors='replace').strip()}")
        return done.stdout

    def read_bytes(self, remote_path: str) -> bytes:
        return self._run(_READ, remote_path)

    def write_bytes(self, data: bytes | bytearray | memoryview, remote_path: str) -> None:
        self._run(_WRITE, remote_path, bytes(data))


class Sandbox:
    def __init__(self, record: dict) -> None:
        self._record = record

    @property
    def object_id(self) -> str:
        return self._record["id"]

    @staticmethod
    def create(*args: str, app=None, tags: dict[str, str] | None = None, image=None, timeout: int | None = 300,
               workdir: str | None = None, cpu: float | tuple[float, float] | None = None,
               memory: int | tuple[int, int] | None = None, block_network: bool = False) -> "Sandbox":
        _cloud.connect()
        if app is None:
            raise InvalidError("Sandboxes require an App when created outside of a Modal container.")
        if image is None or image._rootfs() is None:
            raise NotFoundError(f"image {getattr(image, 'tag', None)!r}: not found (the fake maps test images only)")
        limits = {}
        for name, value in (("cpu", cpu), ("memory", memory)):
            if isinstance(value, tuple):
                if value[1] < value[0]:
                    raise InvalidError(f"Cannot specify a {name} limit lower than request: {value[1]} < {value[0]}")
                limits[name] = value[1]
        if workdir is not None and not workdir.startswith("/"):
            raise InvalidError(f"workdir must be an absolute path, got: {workdir}")
        record = _cloud.new_record(
            app_id=app.app_id, tags=dict(tags or {}), rootfs=str(image._rootfs()), command=list(args) or
            ["sleep", "infinity"], timeout=timeout or 300, workdir=workdir or "/", block_network=block_network,
            cpu_limit=limits.get("cpu"), memory_limit_mb=limits.get("memory"))
        return Sandbox(_cloud.start_supervisor(record))

    @staticmethod
    def from_id(sandbox_id: str) -> "Sandbox":
        _cloud.connect()
        record = _cloud.load(sandbox_id)
        if record is None:
            raise NotFoundError(f"Sandbox {sandbox_id} not found")
        return Sandbox(record)

    @staticmethod
    def list(*, app_id: str | None = None, tags: dict[str, str] | None = None) -> Iterator["Sandbox"]:
        _cloud.connect()
        for record in _cloud.all_records():
            if _cloud.alive(record) and app_id in (None, record["app_id"]) and \
                    all(record["tags"].get(key) == value for key, value in (tags or {}).items()):
                yield Sandbox(record)

    def _popen(self, args: list[str], workdir: str | None, env: dict[str, str] | None) -> subprocess.Popen:
        if not _cloud.alive(self._record):
            raise SandboxTerminatedError(f"Sandbox {self.object_id} has terminated")
        return subprocess.Popen(_cloud.enter_argv(self._record, args, workdir, env), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})

    def _run(self, args: list[str], data: bytes | None = None) -> subprocess.CompletedProcess:
        popen = self._popen(args, None, None)
        stdout, stderr = popen.communicate(data)
        return subprocess.CompletedProcess(args, popen.returncode, stdout, stderr)

    def exec(self, *args: str, timeout: int | None = None, workdir: str | None = None,
             env: dict[str, str] | None = None, text: bool = True) -> ContainerProcess:
        if timeout is not None and (not isinstance(timeout, int) or timeout <= 0):
            raise InvalidError(f"timeout must be a positive integer number of seconds, got {timeout!r}")
        popen = self._popen(list(args), workdir, env)
        assert popen.stdin is not None
        popen.stdin.close()
        return ContainerProcess(popen, text, timeout)

    @property
    def filesystem(self) -> SandboxFilesystem:
        return SandboxFilesystem(self)

    def set_tags(self, tags: dict[str, str]) -> None:
        record = _cloud.load(self.object_id) or self._record
        record["tags"] = dict(tags)
        _cloud.save(record)
        self._record = record

    def get_tags(self) -> dict[str, str]:
        return dict((_cloud.load(self.object_id) or self._record)["tags"])

    def poll(self) -> int | None:
        return None if _cloud.alive(self._record) else 0

    def wait(self, raise_on_termination: bool = True) -> None:
        while _cloud.alive(self._record):
            time.sleep(0.05)

    def terminate(self, *, wait: bool = False) -> int | None:
        if _cloud.alive(self._record):
            try:
                os.kill(self._record["supervisor_pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
        if wait:
            self.wait(raise_on_termination=False)
            return 0
        return None
