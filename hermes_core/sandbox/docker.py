"""The docker backend: one container per session, created from the sample's image (SPEC §6).

Isolation choices (each container):
- `network_mode="none"`; `network=True` uses the engine's default "bridge" network, so it needs an
  engine with networking (scripts/dockerd.sh deliberately runs one without any);
- memory (swap included), pids and CPU limits from the settings;
- `no-new-privileges` and *every* capability dropped, none added back: commands run as
  65534:65534 (nobody; numeric, so it works whatever the image's /etc/passwd says) and the only
  privileged steps, creating the working directory and writing files, are done by the engine
  itself through its archive API (tar entries owned by 65534), which needs no capability inside;
- `init=True` so orphans of commands are reaped, with `sleep infinity` as the long-running main
  process that keeps the container up between commands;
- labels `hermes-foundry.run/.session/.owner` (owner = host:pid:start time) let `reap()` remove the
  containers of orchestrators that died without closing them (containers survive `kill -9`).
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import socket
import uuid
from dataclasses import dataclass

import docker
from docker.errors import ImageNotFound, NotFound

from hermes_core.sandbox.base import (MAX_READ_BYTES, ExecResult, ProcessStatus, SandboxBackend, SandboxError,
                                      SandboxSettings)
from hermes_core.sandbox.docker_engine import (connect, engine_errors, engine_location, put_archive,
                                               path_stat, read_archive_file, tar_of, unix_mode)
from hermes_core.sandbox.docker_exec import (POLL_SCRIPT, SPAWN_SCRIPT, kill_tagged, new_tag, parse_poll, run_exec,
                                             start_detached, user_argv)
from hermes_core.sandbox.cwd import checked_cwd
from hermes_core.sandbox.images import Images, image_label, image_problems, reference_problem
from hermes_core.sandbox.output import STRAGGLER_NOTE
from hermes_core.sandbox.processes import owner_alive, process_start_time
from hermes_core.sandbox.tagged import TaggedSandbox, tag_marker

LABEL_RUN, LABEL_SESSION, LABEL_OWNER = "hermes-foundry.run", "hermes-foundry.session", "hermes-foundry.owner"
SANDBOX_UID = 65534
SANDBOX_USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
JOBS_DIR = "/.hermes-jobs"  # background commands' logs and exit codes, outside the working directory
HELPER_TIMEOUT_S = 30.0  # polls and mkdir helpers

log = logging.getLogger(__name__)

def owner_label() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{process_start_time(pid) or ''}"


@dataclass
class _Job:
    command: str
    tag: str
    killed: bool = False


class DockerSandbox(TaggedSandbox):
    def __init__(self, api: docker.APIClient, container_id: str, session_id: str, cwd: str,
                 settings: SandboxSettings) -> None:
        self.api, self.container_id, self.session_id, self.cwd = api, container_id, session_id, cwd
        self.settings = settings
        self.jobs: dict[int, _Job] = {}
        self.running: set[str] = set()
        self._closed = False

    def _ensure_cwd(self) -> None:
        self._check_open()
        with engine_errors("checking the working directory"):
            missing = path_stat(self.api, self.container_id, self.cwd) is None
        if missing:  # a command deleted it: the engine would refuse to start commands there
            self.prepare()

    def _env(self) -> dict[str, str]:
        return {"HOME": self.cwd, "LANG": "C.UTF-8", "TERM": "dumb", "PYTHONUNBUFFERED": "1"}

    def prepare(self) -> None:
        """The working directory and the jobs folder, owned by the sandbox user (via the engine: no
        capability needed in the container). Parents are created as root, like `mkdir -p` would."""
        entries = [(JOBS_DIR.lstrip("/"), None, 0o700)]
        with engine_errors("preparing the sandbox"):
            if self.cwd != "/":  # an existing folder (e.g. /tmp) keeps its mode, only changes owner
                entries.append((self.cwd.lstrip("/"), None, unix_mode(self.api, self.container_id, self.cwd, 0o755)))
            status, text = put_archive(self.api, self.container_id, "/", tar_of(entries, SANDBOX_UID))
        if status != 200:
            raise SandboxError(f"cannot create the working directory {self.cwd!r} in the container: {text}")

    def _run(self, argv: list[str], timeout: float, cap: int, workdir: str | None = None, user: str = SANDBOX_USER):
        tag = new_tag()
        with engine_errors("running a command in the sandbox"), self._foreground(tag):
            return run_exec(self.api, self.container_id, argv, user=user, workdir=workdir or self.cwd,
                            env=self._env(), tag=tag, timeout=timeout, cap=cap)

    def _kill_tagged(self, tag: str) -> None:
        with engine_errors("stopping a command"):
            kill_tagged(self.api, self.container_id, tag, SANDBOX_USER)

    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        self._ensure_cwd()
        timeout = self.settings.command_timeout_s if timeout is None else float(timeout)
        if timeout <= 0:
            raise SandboxError("timeout must be positive")
        outcome = self._run(user_argv(command), timeout, self.settings.output_cap_bytes)
        output, truncated = outcome.buffer.render()
        return ExecResult(output=output + (STRAGGLER_NOTE if outcome.stragglers else ""), exit_code=outcome.exit_code,
                          timed_out=outcome.timed_out, truncated=truncated)

    def spawn(self, command: str) -> int:
        self._ensure_cwd()
        process_id = len(self.jobs) + 1  # small ids, easy for a model to quote
        job = _Job(command, new_tag())
        argv = ["/bin/sh", "-c", SPAWN_SCRIPT, "sh", JOBS_DIR, str(process_id), *user_argv(command)]
        with engine_errors("starting a background command"):
            start_detached(self.api, self.container_id, argv, user=SANDBOX_USER, workdir=self.cwd,
                           env=self._env(), tag=job.tag)
        self.jobs[process_id] = job
        return process_id

    def poll(self, process_id: int) -> ProcessStatus:
        job, cap = self._job(process_id), self.settings.output_cap_bytes
        argv = ["/bin/sh", "-c", POLL_SCRIPT, "sh", JOBS_DIR, str(process_id), str(cap), tag_marker(job.tag)]
        outcome = self._run(argv, HELPER_TIMEOUT_S, 2 * cap + 4096, workdir="/")
        parsed = parse_poll(bytes(outcome.buffer.head + outcome.buffer.tail), cap)
        if outcome.exit_code != 0 or parsed is None:
            raise SandboxError(f"could not read the state of background process {process_id}: "
                               f"{outcome.buffer.render()[0][:500]}")
        status, output, truncated = parsed
        running = status == b"running"
        exit_code = None
        if status.startswith(b"exit "):
            exit_code = int(status.split()[1])
        elif status == b"gone" and job.killed:
            exit_code = 137  # SIGKILL, shell convention
        return ProcessStatus(process_id=process_id, command=job.command, running=running, exit_code=exit_code,
                             output=output, truncated=truncated)

    def kill(self, process_id: int) -> ProcessStatus:
        job = self._job(process_id)
        self._kill_tagged(job.tag)
        job.killed = True
        return self.poll(process_id)

    def read_file(self, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        with engine_errors(f"reading {path!r}"):
            return read_archive_file(self.api, self.container_id, self._inside(path), limit)

    def write_file(self, path: str, data: bytes) -> str:
        target = self._inside(path)
        parent, name = posixpath.split(target)
        if not name:
            raise SandboxError(f"{path!r} is a directory")
        archive = tar_of([(name, data, 0o644)], SANDBOX_UID)
        with engine_errors(f"writing {path!r}"):
            status, text = put_archive(self.api, self.container_id, parent, archive)
            if status == 404:  # missing parent folders: made by the sandbox user, else by root
                for user in (SANDBOX_USER, "0:0"):
                    if self._run(["mkdir", "-p", "--", parent], HELPER_TIMEOUT_S, 4096, "/", user).exit_code == 0:
                        break
                status, text = put_archive(self.api, self.container_id, parent, archive)
        if "cannot overwrite directory" in text:
            raise SandboxError(f"{path!r} is a directory")
        if status != 200:
            raise SandboxError(f"cannot write {path!r}: {text.strip()}")
        return target

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:  # force: kills every process of the session with the container
            self.api.remove_container(self.container_id, force=True, v=True)
        except NotFound:
            pass
        except Exception as exc:  # noqa: BLE001 - close runs in `finally`; reap() removes it once we are gone
            log.warning("could not remove sandbox container %s: %s", self.container_id[:12], exc)


class DockerBackend(SandboxBackend):
    """Containers on the engine named by DOCKER_HOST (default: the local socket)."""

    name = "docker"

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings.from_env()
        self._client: docker.DockerClient | None = None
        self._has_bridge: bool | None = None

    def client(self) -> docker.DockerClient:
        """The engine's client; SandboxError naming DOCKER_HOST when no engine answers."""
        if self._client is None:
            self._client = connect()
        return self._client

    def close(self) -> None:
        """Close the client's pooled engine connections (up to MAX_POOL_SIZE sockets held otherwise
        until the backend is garbage); sessions still open connect again at their next call."""
        if self._client is not None:
            self._client.close()

    def _create_args(self, image: str, session_id: str, name: str) -> dict:
        s = self.settings
        limits: dict[str, object] = {}
        if s.memory_mb > 0:
            limits.update(mem_limit=f"{s.memory_mb}m", memswap_limit=f"{s.memory_mb}m")  # no swap beyond the limit
        if s.pids > 0:
            limits["pids_limit"] = s.pids
        if s.cpus > 0:
            limits["nano_cpus"] = int(s.cpus * 1e9)
        labels = {LABEL_RUN: s.run_name, LABEL_SESSION: session_id, LABEL_OWNER: owner_label()}
        return dict(image=image, command=["sleep", "infinity"], name=name, init=True, user=SANDBOX_USER,
                    network_mode="bridge" if s.network else "none", security_opt=["no-new-privileges"],
                    cap_drop=["ALL"], labels=labels, **limits)

    def _check_bridge(self, client: docker.DockerClient) -> None:
        # An engine started with --bridge=none silently gives "bridge" containers loopback only.
        if self._has_bridge is None:
            with engine_errors("listing networks"):
                self._has_bridge = any(n.name == "bridge" for n in client.networks.list(names=["bridge"]))
        if not self._has_bridge:
            raise SandboxError(f"network=True needs a Docker engine with a 'bridge' network; the one at "
                               f"{engine_location()} has none (e.g. scripts/dockerd.sh runs with --bridge=none)")

    def image_problem(self, image: str) -> str | None:
        """Only references in Docker's grammar reach the engine (it pulls them when pulls are allowed)."""
        return reference_problem(image)

    def open(self, session_id: str, image: str | None = None, cwd: str | None = None) -> DockerSandbox:
        image = image or self.settings.default_image  # a row without one: TERMINAL_*_IMAGE or the original's
        if not image:
            raise SandboxError("the docker backend needs an image: give the prompt an `image` (or `docker_image`)")
        if problem := self.image_problem(image):
            raise SandboxError(f"{image_label(image)}: {problem}")
        cwd = checked_cwd(cwd)
        client = self.client()
        if self.settings.network:
            self._check_bridge(client)
        name = f"hermes-{re.sub(r'[^A-Za-z0-9_.-]+', '_', session_id)[:40]}-{uuid.uuid4().hex[:8]}"
        args = self._create_args(image, session_id, name)
        with engine_errors(f"creating the sandbox container from {image!r}"):
            try:
                container = client.containers.create(**args)
            except ImageNotFound:
                if not self.settings.allow_pull:
                    raise SandboxError(f"image {image!r} is not present on the Docker engine ({engine_location()}) "
                                       "and pulling is disabled (HERMES_SANDBOX_ALLOW_PULL=1 allows it)") from None
                client.images.pull(image)
                container = client.containers.create(**args)
        try:
            with engine_errors("starting the sandbox container"):
                container.start()
            sandbox = DockerSandbox(client.api, container.id, session_id, cwd, self.settings)
            sandbox.prepare()
            return sandbox
        except BaseException:
            try:
                container.remove(force=True, v=True)
            except Exception:  # noqa: BLE001 - the original error matters more; reap() covers the rest
                pass
            raise

    def preflight(self, images: Images) -> list[str]:
        problems = image_problems(images, self.image_problem)  # before the engine: it needs none
        valid = sorted(image for image in images if self.image_problem(image) is None)
        if not valid:
            return problems
        try:
            client = self.client()
        except SandboxError as exc:
            return problems + [str(exc)]  # one clear problem instead of one per image
        for image in valid:
            try:
                try:
                    client.images.get(image)
                except ImageNotFound:
                    if not self.settings.allow_pull:
                        problems.append(f"{image_label(image, images)}: not present on the Docker engine "
                                        f"({engine_location()}) and pulling is disabled (HERMES_SANDBOX_ALLOW_PULL=1 "
                                        "allows it)")
                    else:
                        client.images.pull(image)
            except Exception as exc:  # noqa: BLE001 - every image's problem is reported, together
                problems.append(f"{image_label(image, images)}: {exc}")
        return problems

    def reap(self) -> int:
        """Remove containers whose owner process (on this host) is dead; returns how many."""
        removed, host = 0, socket.gethostname()
        with engine_errors("listing sandbox containers"):
            containers = self.client().containers.list(all=True, filters={"label": LABEL_OWNER})
        for container in containers:
            owner_host, pid, start = (container.labels.get(LABEL_OWNER, "").rsplit(":", 2) + ["", ""])[:3]
            if owner_host != host or not pid.isdigit():
                continue  # another machine's run: its own reaper decides
            if owner_alive(pid, start):
                continue
            try:
                container.remove(force=True, v=True)
                removed += 1
            except NotFound:
                pass  # removed meanwhile (its owner's close, another reaper)
            except Exception as exc:  # noqa: BLE001 - keep reaping the others
                log.warning("could not remove leftover container %s: %s", container.short_id, exc)
        return removed


__all__ = ["DockerBackend", "DockerSandbox", "LABEL_OWNER", "LABEL_RUN", "LABEL_SESSION",
           "SANDBOX_USER"]
