"""The `modal` backend: one `modal.Sandbox` per session, created from the sample's registry image.

Limits go through the SDK: network blocked (`block_network`), CPU and memory as (request, limit)
pairs, so they are hard limits rather than burstable requests, and a session lifetime (`timeout`).
Modal has no process-count limit, so every command runs under `ulimit -u <pids>` (RLIMIT_NPROC
applies to root in Modal's gVisor containers). Commands are tagged like docker execs
(`hermes_core.sandbox.tagged`), so a timed-out command's whole tree can be killed from a second
exec, setsid'd children included. Sandboxes are tagged with run, session, owner and host, so a
reaper on the same host can terminate those of dead owners.

The `modal` SDK is imported only when this backend is used (`pip install modal`).
"""

from __future__ import annotations

import importlib
import math
import os
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from hermes_core.sandbox.base import (MAX_READ_BYTES, READ_SCRIPT, ExecResult, ProcessStatus, SandboxBackend,
                                      SandboxError, SandboxSettings, script_read, too_large)
from hermes_core.sandbox.cwd import checked_cwd
from hermes_core.sandbox.images import Images, image_label, image_problems, reference_problem
from hermes_core.sandbox.output import STRAGGLER_NOTE, CappedBuffer, log_text
from hermes_core.sandbox.processes import DRAIN_GRACE_S, owner_alive, process_start_time
from hermes_core.sandbox.tagged import TaggedSandbox, kill_argv, tagged_env

APP_NAME = "hermes-foundry"
TAG_RUN, TAG_SESSION, TAG_OWNER, TAG_HOST = (f"{APP_NAME}.{key}" for key in ("run", "session", "owner", "host"))
PREFLIGHT_TIMEOUT_ENV, DEFAULT_PREFLIGHT_TIMEOUT_S = "HERMES_MODAL_PREFLIGHT_TIMEOUT_S", 15.0
LIFETIME_ENV, DEFAULT_LIFETIME_S = "HERMES_MODAL_SANDBOX_TIMEOUT_S", 3600
POLL_EVERY_S = 0.2  # each poll is a request to Modal
KILL_TIMEOUT_S = 30
FILE_TIMEOUT_S = 60
LOG_DIR = "/tmp/.hermes-jobs"
INSTALL_HINT = "the modal backend needs the Modal SDK: pip install modal"
# Prints the log's size, then the log itself or its head and tail.
LOG_SCRIPT = r"""[ -e "$1" ] || { echo 0; exit 0; }; size=$(wc -c < "$1"); echo "$size"
if [ "$size" -le "$2" ]; then cat -- "$1"; else head -c "$3" -- "$1"; tail -c "$4" -- "$1"; fi"""


def load_sdk() -> Any:
    try:
        return importlib.import_module("modal")
    except ImportError as exc:
        raise SandboxError(INSTALL_HINT) from exc


def call_within(seconds: float, call: Callable[[], Any]) -> Any:
    """`call()` in a thread, given up after `seconds` (TimeoutError): an offline client with a token
    takes about a minute to fail on its own. A given-up call finishes in the background."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="modal-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer from Modal within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def describe(sdk: Any, exc: BaseException) -> str:
    if isinstance(exc, sdk.exception.AuthError):
        return f"not authenticated with Modal ({exc}); run `modal token new` or set MODAL_TOKEN_ID/MODAL_TOKEN_SECRET"
    if isinstance(exc, sdk.exception.ConnectionError):
        return f"cannot reach Modal ({exc}); check the network"
    return f"{type(exc).__name__}: {exc}"


def run_script(pids: int, log: str | None = None) -> str:
    """The wrapper of every command ($1): stderr joins stdout (or both go to `log`), process cap."""
    output = f"mkdir -p {LOG_DIR} && exec > {shlex.quote(log)} 2>&1" if log else "exec 2>&1"
    return f'{output}; ulimit -u {int(pids)} 2>/dev/null; exec bash -c "$1"'


@dataclass
class _Job:
    command: str
    tag: str  # of its processes
    log: str  # inside the sandbox
    process: Any


class ModalSandbox(TaggedSandbox):
    def __init__(self, sdk: Any, sandbox: Any, session_id: str, cwd: str, settings: SandboxSettings) -> None:
        self.sdk, self.sandbox, self.session_id, self.cwd, self.settings = sdk, sandbox, session_id, cwd, settings
        self.jobs: dict[int, _Job] = {}
        self.running: set[str] = set()
        self._tags = 0
        self._closed = False

    def _tag(self) -> str:
        self._tags += 1
        return f"{self.sandbox.object_id}-{self._tags}"

    def _start(self, command: str, tag: str, timeout: int | None = None, log: str | None = None) -> Any:
        self._check_open()
        try:
            return self.sandbox.exec("bash", "-c", run_script(self.settings.pids, log), "bash", command,
                                     timeout=timeout, env=tagged_env(tag), text=False)
        except Exception as exc:  # noqa: BLE001 - any SDK failure becomes a tool-visible error
            raise SandboxError(f"modal exec failed: {describe(self.sdk, exc)}") from exc

    def _kill_tagged(self, tag: str) -> None:
        try:
            self.sandbox.exec(*kill_argv(tag), timeout=KILL_TIMEOUT_S).wait()
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"could not stop the command's processes: {describe(self.sdk, exc)}") from exc

    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        timeout = self.settings.command_timeout_s if timeout is None else float(timeout)
        if timeout <= 0:
            raise SandboxError("timeout must be positive")
        tag = self._tag()
        with self._foreground(tag):
            return self._run_tagged(command, tag, timeout)

    def _run_tagged(self, command: str, tag: str, timeout: float) -> ExecResult:
        deadline = time.monotonic() + timeout
        process = self._start(command, tag, timeout=math.ceil(timeout))  # Modal's own deadline: a safety net
        buffer, lock = CappedBuffer(self.settings.output_cap_bytes), threading.Lock()

        def pump(stream: Any) -> None:
            try:
                for chunk in stream:
                    with lock:
                        buffer.add(chunk if isinstance(chunk, bytes) else chunk.encode())
            except Exception:  # noqa: BLE001 - a broken stream ends like a closed one
                pass

        readers = [threading.Thread(target=pump, args=(stream,), daemon=True)
                   for stream in (process.stdout, process.stderr)]
        for reader in readers:
            reader.start()
        code, drain_until = None, None
        # Until the command has exited and its output is closed; at most until the deadline, and only
        # briefly after the exit while background children still hold the output open.
        while (code := process.poll()) in (None, -1) or any(reader.is_alive() for reader in readers):
            now = time.monotonic()
            if code is not None and drain_until is None:
                drain_until = now + DRAIN_GRACE_S
            limit = deadline if drain_until is None else min(deadline, drain_until)
            if code == -1 or now >= limit:  # -1: Modal's own deadline has passed
                break
            open_readers = [reader for reader in readers if reader.is_alive()]
            if open_readers:
                open_readers[0].join(min(POLL_EVERY_S, limit - now))
            else:  # the command closed its output but runs on
                time.sleep(min(POLL_EVERY_S, limit - now))
        timed_out = code in (None, -1)
        stragglers = not timed_out and any(reader.is_alive() for reader in readers)
        if timed_out or stragglers:
            self._kill_tagged(tag)
        with lock:
            output, truncated = buffer.render()
        return ExecResult(output=output + (STRAGGLER_NOTE if stragglers else ""), truncated=truncated,
                          exit_code=None if timed_out else code, timed_out=timed_out)

    def spawn(self, command: str) -> int:
        process_id = len(self.jobs) + 1
        tag, log = self._tag(), f"{LOG_DIR}/process-{process_id}.log"
        self.jobs[process_id] = _Job(command, tag, log, self._start(command, tag, log=log))
        return process_id

    def _read_log(self, log: str) -> tuple[str, bool]:
        cap = self.settings.output_cap_bytes
        process = self.sandbox.exec("bash", "-c", LOG_SCRIPT, "bash", log, str(cap), str(cap // 2),
                                    str(cap - cap // 2), timeout=KILL_TIMEOUT_S, text=False)
        size, _, payload = process.stdout.read().partition(b"\n")
        process.wait()
        return log_text(payload, int(size or 0), cap)

    def poll(self, process_id: int) -> ProcessStatus:
        job = self._job(process_id)
        try:
            exit_code = job.process.poll()
            output, truncated = self._read_log(job.log)
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"could not read process {process_id}: {describe(self.sdk, exc)}") from exc
        return ProcessStatus(process_id=process_id, command=job.command, running=exit_code is None,
                             exit_code=exit_code, output=output, truncated=truncated)

    def kill(self, process_id: int) -> ProcessStatus:
        job = self._job(process_id)
        self._kill_tagged(job.tag)
        deadline = time.monotonic() + 5
        while job.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.poll(process_id)

    def read_file(self, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        # Through a shell rather than the SDK's filesystem, which would open a FIFO or device too.
        inside = self._inside(path)
        try:
            process = self.sandbox.exec("sh", "-c", READ_SCRIPT, "sh", inside, str(limit + 1),
                                        timeout=FILE_TIMEOUT_S, text=False)
            data = bytearray()
            for chunk in process.stdout:  # capped here too: the image's `head` may be anything
                data += chunk
                if len(data) > limit:
                    raise too_large(inside, limit)  # what still streams ends at the exec's timeout
            code, message = process.wait(), process.stderr.read()
        except SandboxError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"could not read {inside!r}: {describe(self.sdk, exc)}") from exc
        return script_read(inside, None if code == -1 else code, bytes(data), limit, message.decode(errors="replace"))

    def write_file(self, path: str, data: bytes) -> str:
        inside = self._inside(path)
        try:
            self.sandbox.filesystem.write_bytes(data, inside)  # creates parent folders
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"could not write {inside!r}: {describe(self.sdk, exc)}") from exc
        return inside

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.sandbox.terminate(wait=True)
        except Exception:  # noqa: BLE001 - it ends at its timeout anyway, and the reaper finds it
            pass


class ModalBackend(SandboxBackend):
    name = "modal"

    def __init__(self, settings: SandboxSettings | None = None, preflight_timeout_s: float | None = None,
                 lifetime_s: int | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self.preflight_timeout_s = float(preflight_timeout_s or os.environ.get(PREFLIGHT_TIMEOUT_ENV)
                                         or DEFAULT_PREFLIGHT_TIMEOUT_S)
        self.lifetime_s = int(lifetime_s or os.environ.get(LIFETIME_ENV) or DEFAULT_LIFETIME_S)
        self._app: Any = None
        self._problem: str | None = None

    def _lookup_app(self, sdk: Any) -> Any:
        if self._app is None:
            self._app = sdk.App.lookup(APP_NAME, create_if_missing=True)
        return self._app

    def _connect(self) -> str | None:
        """Find the app within the deadline; the problem if that fails. The answer is kept, so the
        reap and the pre-flight before a run wait for an unreachable Modal once, not twice."""
        if self._app is None and self._problem is None:
            try:
                sdk = load_sdk()
                call_within(self.preflight_timeout_s, lambda: self._lookup_app(sdk))
            except SandboxError as exc:
                self._problem = str(exc)
            except TimeoutError:
                self._problem = (f"modal: no answer from Modal within {self.preflight_timeout_s:g} s (offline, or "
                                 f"api.modal.com unreachable); check the network, or raise ${PREFLIGHT_TIMEOUT_ENV}")
            except Exception as exc:  # noqa: BLE001
                self._problem = f"modal: {describe(sdk, exc)}"
        return self._problem

    def image_problem(self, image: str) -> str | None:
        """Modal builds images from registry references (`Image.from_registry`): Docker's grammar."""
        return reference_problem(image)

    def open(self, session_id: str, image: str | None = None, cwd: str | None = None) -> ModalSandbox:
        image = image or self.settings.default_image  # a row without one: TERMINAL_*_IMAGE or the original's
        if not image:
            raise SandboxError("the modal backend needs an image (a registry reference, e.g. python:3.12-slim)")
        if problem := self.image_problem(image):
            raise SandboxError(f"{image_label(image)}: {problem}")
        sdk, s, pid = load_sdk(), self.settings, os.getpid()
        inside = checked_cwd(cwd)
        tags = {TAG_RUN: s.run_name, TAG_SESSION: session_id, TAG_HOST: socket.gethostname(),
                TAG_OWNER: f"{pid}:{process_start_time(pid) or ''}"}  # for the reaper
        try:
            sandbox = sdk.Sandbox.create(
                app=self._lookup_app(sdk), image=sdk.Image.from_registry(image), timeout=self.lifetime_s,
                workdir=inside, cpu=(s.cpus, s.cpus), memory=(s.memory_mb, s.memory_mb),
                block_network=not s.network, tags=tags)
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"could not create a modal sandbox for image {image!r}: {describe(sdk, exc)}") from exc
        return ModalSandbox(sdk, sandbox, session_id, inside, s)

    def preflight(self, images: Images) -> list[str]:
        problems = ["the modal backend needs an image for every sample"] if any(not image for image in images) else []
        problems += image_problems(images, lambda image: self.image_problem(image) if image else None)
        problem = self._connect()
        return problems + ([problem] if problem else [])

    def reap(self) -> int:
        """Terminate sandboxes started on this host by processes that have died (any run). Without a
        reachable Modal there is nothing to reap here: the pre-flight reports why."""
        if self._connect() is not None:
            return 0
        sdk = load_sdk()

        def sweep() -> int:
            reaped = 0
            for sandbox in sdk.Sandbox.list(app_id=self._app.app_id, tags={TAG_HOST: socket.gethostname()}):
                pid, _, start = sandbox.get_tags().get(TAG_OWNER, "").partition(":")
                if pid.isdigit() and not owner_alive(pid, start):
                    sandbox.terminate()
                    reaped += 1
            return reaped

        try:
            return call_within(self.preflight_timeout_s, sweep)
        except Exception:  # noqa: BLE001 - leftovers also end at their own timeout
            return 0
