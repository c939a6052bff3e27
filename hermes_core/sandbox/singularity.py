"""The `singularity` backend: every command is one `apptainer exec --containall` (or `singularity
exec`) of the sample's image, isolated from the host (own pid/ipc namespaces, clean environment, no
home, network off unless settings.network) and limited by apptainer's cgroup flags (these need
root, or cgroups v2 with systemd delegation for unprivileged users).

A session persists through host folders bound into each container: its working directory (at
`cwd`) and a scratch folder (`--workdir`: /tmp and /var/tmp). The image itself is read-only, so
files are read and written through the bound working directory; paths elsewhere are read with an
exec and refused for writing. State: `state_root/<session>-o<owner pid>.<owner start>-<random>/` with the
background logs, `work/`, `scratch/` and `groups` (process groups to kill if the owner dies).

Images come from dataset rows (untrusted): a SIF file, sandbox folder or `docker-archive:`/
`oci-archive:` file must resolve, links included, beneath `settings.image_root` (no image root: no
paths at all); a `docker://`, `library://`, `oras://` or `shub://` image must be a reference in
Docker's grammar and is pulled only when pulls are allowed.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import subprocess
import tempfile
from pathlib import Path

from hermes_core.sandbox.base import (MAX_READ_BYTES, READ_SCRIPT, ExecResult, Sandbox, SandboxBackend, SandboxError,
                                      SandboxSettings, read_host_file, script_read)
from hermes_core.sandbox.cwd import checked_cwd
from hermes_core.sandbox.images import Images, confine, image_label, image_problems, reference_problem
from hermes_core.sandbox.jobs import BackgroundJobs, BackgroundJobsMixin
from hermes_core.sandbox.processes import group_alive, kill_process_group, orphaned, owned_folder, sanitized_env
from hermes_core.sandbox.trees import remove_tree

EXECUTABLE_ENV = "HERMES_APPTAINER"  # path or name of the apptainer/singularity executable
REMOTE_SCHEMES = ("docker://", "library://", "oras://", "shub://")  # + a reference: pulled by apptainer
ARCHIVE_SCHEMES = ("docker-archive:", "oci-archive:")  # + a path: a local file, confined like any other path
FILE_TIMEOUT_S = 60.0
_PASS_THROUGH = ("APPTAINER_CACHEDIR", "APPTAINER_TMPDIR", "SINGULARITY_CACHEDIR", "SINGULARITY_TMPDIR",
                 "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")  # cache, and systemd cgroup delegation
_INSTALL_HINT = ("install Apptainer (https://apptainer.org/docs/admin/main/installation.html) or point "
                 f"${EXECUTABLE_ENV} at the executable")


def find_executable() -> str | None:
    """$HERMES_APPTAINER, else `apptainer`, else `singularity` on PATH."""
    configured = os.environ.get(EXECUTABLE_ENV, "").strip()
    if configured:
        return shutil.which(configured)
    return shutil.which("apptainer") or shutil.which("singularity")


def is_remote(image: str) -> bool:
    return image.startswith(REMOTE_SCHEMES)


def apptainer_argv(executable: str, image: str, cwd: str, workdir: Path, scratch: Path,
                   settings: SandboxSettings, command: str) -> list[str]:
    """The command line of one command of a session (the exact flags are covered by tests)."""
    argv = [executable, "exec", "--containall", "--cleanenv", "--no-home", "--pwd", cwd,
            "--bind", f"{workdir}:{cwd}", "--workdir", str(scratch)]
    if not settings.network:
        argv += ["--net", "--network", "none"]  # loopback only
    argv += ["--memory", str(settings.memory_mb * 1024 * 1024), "--pids-limit", str(settings.pids),
             "--cpus", f"{settings.cpus:g}"]
    return argv + [image, "bash", "-c", command]


def _host_env(executable: str) -> dict[str, str]:
    """The apptainer process's own environment: sanitized (no host secrets), with the variables
    the container should see passed the documented way (--cleanenv keeps APPTAINERENV_*)."""
    prefix = "SINGULARITYENV_" if Path(executable).name.startswith("singularity") else "APPTAINERENV_"
    kept = {name: os.environ[name] for name in _PASS_THROUGH if name in os.environ}
    inside = {"TERM": "dumb", "PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8"}
    return sanitized_env(os.environ.get("HOME") or "/root", {**kept, **{prefix + k: v for k, v in inside.items()}})


class SingularitySandbox(BackgroundJobsMixin, Sandbox):
    """One session; `cwd` and every path are as seen inside the container."""

    def __init__(self, session_id: str, state_dir: Path, settings: SandboxSettings, executable: str,
                 image: str, cwd: str) -> None:
        self.session_id, self.state_dir, self.cwd, self.image = session_id, state_dir, cwd, image
        self.settings, self.executable = settings, executable
        self.workdir, self.scratch = state_dir / "work", state_dir / "scratch"
        for folder in (self.workdir, self.scratch, state_dir / "logs"):
            folder.mkdir()
        self.env = _host_env(executable)
        self.jobs = BackgroundJobs(lambda: state_dir / "logs", settings.output_cap_bytes, settings.disk_mb << 20)
        self._closed = False

    def _argv(self, command: str) -> list[str]:
        if self._closed:
            raise SandboxError(f"sandbox {self.session_id!r} is closed")
        self.workdir.mkdir(exist_ok=True)  # apptainer refuses to bind a missing folder
        return apptainer_argv(self.executable, self.image, self.cwd, self.workdir, self.scratch, self.settings,
                              command)

    def _remember_group(self, pgid: int) -> None:
        with open(self.state_dir / "groups", "a") as groups:  # for the reaper, should this process die
            groups.write(f"{pgid}\n")

    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        timeout = self.settings.command_timeout_s if timeout is None else float(timeout)
        if timeout <= 0:
            raise SandboxError("timeout must be positive")
        result, pgid = self.jobs.run(self._argv(command), str(self.state_dir), self.env, timeout,
                                     self.settings.output_cap_bytes)
        if pgid in self.jobs.exec_groups:  # left processes running: the reaper must know them too
            self._remember_group(pgid)
        return result

    def spawn(self, command: str) -> int:
        process_id = self.jobs.start(command, self._argv(command), str(self.state_dir), self.env)
        self._remember_group(self.jobs.jobs[process_id].proc.pid)
        return process_id

    def _inside(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, path))

    def _host_path(self, inside: str) -> Path | None:
        """Where a path under the bound working directory lives on the host; None elsewhere, and for
        links leading out of it (they are only safe to follow inside the container)."""
        if inside != self.cwd and not inside.startswith(self.cwd.rstrip("/") + "/"):
            return None
        root = self.workdir.resolve()
        host = (root / posixpath.relpath(inside, self.cwd)).resolve()  # follows links made by commands
        if not host.is_relative_to(root):
            return None
        if host.is_dir():
            raise SandboxError(f"{inside!r} is a directory")
        return host

    def read_file(self, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        inside = self._inside(path)
        host = self._host_path(inside)
        if host is not None:
            return read_host_file(host, inside, limit)
        # bash -c SCRIPT $0 $1 $2: the path, never parsed by a shell. The image is read-only: its
        # `head` is the image's own, so the cap holds.
        argv = self._argv(READ_SCRIPT) + ["sh", inside, str(limit + 1)]
        try:
            done = subprocess.run(argv, capture_output=True, env=self.env, cwd=self.state_dir, timeout=FILE_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise SandboxError(f"reading {inside!r} timed out after {FILE_TIMEOUT_S:.0f} s") from exc
        return script_read(inside, done.returncode, done.stdout, limit, done.stderr.decode(errors="replace").strip())

    def write_file(self, path: str, data: bytes) -> str:
        self._argv("true")  # refuses closed sandboxes
        inside = self._inside(path)
        host = self._host_path(inside)
        if host is None:
            raise SandboxError(f"cannot write {inside!r}: the image is read-only; only files under the working "
                               f"directory {self.cwd} persist (not through links leading elsewhere)")
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_bytes(data)
        return inside

    def _release(self) -> None:
        remove_tree(self.state_dir)


def _kill_recorded_groups(state_dir: Path) -> None:
    try:
        recorded = {int(line) for line in (state_dir / "groups").read_text().split()}
    except (OSError, ValueError):
        return
    for pgid in recorded:
        # A live group still holds its pgid, so no unrelated process can have taken that number.
        if group_alive(pgid):
            kill_process_group(pgid)


class SingularityBackend(SandboxBackend):
    name = "singularity"

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self.state_root = Path(self.settings.state_root or Path(tempfile.gettempdir()) / "hermes-singularity")

    def _resolve(self, image: str) -> tuple[str | None, str | None]:
        """(what apptainer is given for `image`, None), or (None, why `image` is refused). A remote image
        is a scheme and a reference in Docker's grammar; anything else is a SIF file, a sandbox folder
        or an archive, resolved beneath the image root (never elsewhere on the host)."""
        if is_remote(image):
            scheme, _, reference = image.partition("://")
            if problem := reference_problem(reference):
                return None, f"after {scheme}://: {problem}"
            if not self.settings.allow_pull:
                return None, (f"not a local file and pulling is not allowed; pull it first (`apptainer pull "
                              f"image.sif {image}`) into the image root, or allow pulls (HERMES_SANDBOX_ALLOW_PULL=1)")
            return image, None  # apptainer pulls it into its cache on first use
        if "://" in image:
            return None, f"unsupported scheme (use a path inside the image root or one of {', '.join(REMOTE_SCHEMES)})"
        if self.settings.image_root is None:
            return None, ("image paths (SIF files, sandbox folders, archives) are accepted only inside an image root; "
                          "set HERMES_SANDBOX_IMAGE_ROOT to the folder holding them, or use a registry reference "
                          "(docker://...) with pulls allowed")
        scheme = next((prefix for prefix in ARCHIVE_SCHEMES if image.startswith(prefix)), "")
        name = image[len(scheme):]
        path, problem = confine(self.settings.image_root, name)
        if path is None:
            return None, problem
        if not path.exists():
            return None, f"no such file or folder in the image root ({Path(self.settings.image_root) / name})"
        return scheme + str(path), None

    def image_problem(self, image: str) -> str | None:
        return self._resolve(image)[1]

    def preflight(self, images: Images) -> list[str]:
        problems = []
        executable = find_executable()
        if executable is None:
            configured = os.environ.get(EXECUTABLE_ENV, "").strip()
            where = f"${EXECUTABLE_ENV}={configured!r} was not found" if configured else \
                "no `apptainer` or `singularity` on PATH"
            problems.append(f"singularity backend: {where}; {_INSTALL_HINT}")
        else:
            try:
                done = subprocess.run([executable, "--version"], capture_output=True, timeout=30,
                                      env=sanitized_env(os.environ.get("HOME") or "/root"))
                if done.returncode != 0:
                    problems.append(f"singularity backend: `{executable} --version` failed: "
                                    f"{done.stderr.decode(errors='replace').strip()}")
            except (OSError, subprocess.TimeoutExpired) as exc:
                problems.append(f"singularity backend: `{executable} --version` failed: {exc}")
        return problems + image_problems(images, self.image_problem)

    def open(self, session_id: str, image: str | None = None, cwd: str | None = None) -> SingularitySandbox:
        image = image or self.settings.default_image  # a row without one: TERMINAL_*_IMAGE or the original's
        if not image:
            raise SandboxError("the singularity backend needs an image for every sample (a SIF file or sandbox "
                               "folder in the image root, or a docker:// reference)")
        resolved, problem = self._resolve(image)
        if resolved is None:
            raise SandboxError(f"{image_label(image)}: {problem}")
        executable = find_executable()
        if executable is None:
            raise SandboxError(f"singularity backend: no apptainer/singularity executable; {_INSTALL_HINT}")
        inside = checked_cwd(cwd)
        if any(char in inside for char in ":,"):
            raise SandboxError(f"cwd {cwd!r} cannot be a working directory of the singularity backend (no ':' or "
                               "',': bind syntax)")
        self.state_root.mkdir(parents=True, exist_ok=True)
        state_dir = owned_folder(self.state_root, session_id)
        try:
            if any(char in str(state_dir) for char in ":,"):
                raise SandboxError(f"the state folder {state_dir} must not contain ':' or ',' (bind syntax)")
            return SingularitySandbox(session_id, state_dir, self.settings, executable, resolved, inside)
        except BaseException:
            remove_tree(state_dir)
            raise

    def reap(self) -> int:
        """Remove state folders of sessions whose owner died, after killing their containers."""
        removed = 0
        for state_dir in self.state_root.glob("*") if self.state_root.is_dir() else ():
            if state_dir.is_dir() and orphaned(state_dir):
                _kill_recorded_groups(state_dir)
                removed += not remove_tree(state_dir)
        return removed
