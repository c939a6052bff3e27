"""The `local` backend: each session isolated with bubblewrap, limited by a per-session cgroup.

A session is one `bwrap` whose pid 1 is the exec server (exec_server.py): every command and file
operation is a fork of it, inside the session's mounts, pid/ipc/uts namespaces (closing the session
ends that pid namespace and everything in it, setsid'd daemons included), no capabilities, and one
network namespace per session (loopback only, so a background server is reachable from later
commands) unless `settings.network`. Without the server's binary, each command is a bubblewrap of
its own with the same layout.

As root, commands run as root of a user namespace whose ids are unprivileged on the host
(identity.py), and the writable space is one size-capped tmpfs (the disk quota) in a mount namespace
that only an fd of this process holds: no host mount ever exists, and a crash (even kill -9) frees
it. Without an image the root is the host's system folders read-only (host_root.py), with /tmp and
the working directory on that tmpfs; with an image the root is an overlay of its prepared root
filesystem (mounted idmapped) and an upper layer on it. Files are read and written through the
sandbox itself, so tools see exactly what commands see.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable, Literal

from hermes_core.sandbox.base import (MAX_READ_BYTES, READ_DIRECTORY, READ_SCRIPT, ExecResult, Sandbox,
                                      SandboxBackend, SandboxError, SandboxSettings, script_read, too_large)
from hermes_core.sandbox.bwrap_entry import BWRAP, NAMESPACE_FLAGS, entry_argv, makes_zygotes, slot_zygote
from hermes_core.sandbox.exec_server import KILL_TIMEOUT_S, ExecServer, server_binary
from hermes_core.sandbox.output import CappedBuffer
from hermes_core.sandbox.cgroups import Hierarchy, SessionCgroup, detect, retire, session_names
from hermes_core.sandbox.cwd import checked_cwd
from hermes_core.sandbox.identity import ID_COUNT, LAYER, NO_LAUNCHER, host_ids, layer_mount_point
from hermes_core.sandbox.host_root import host_layout, proc_layout
from hermes_core.sandbox.images import Images, confine, image_label, image_problems, reference_problem
from hermes_core.sandbox.jobs import BackgroundJobs, BackgroundJobsMixin
from hermes_core.sandbox.processes import (DEFAULT_PATH, StateFolder, orphaned, owner_alive, pin_namespace,
                                           sanitized_env, shell_exit_code)
from hermes_core.sandbox.trees import remove_tree
from hermes_core.sandbox.slots import Slot, SlotPool
from hermes_core.sandbox.zygote import joined_argv, session_pidfd

ETC_COPY_PREFIX = ".etc-"  # what earlier versions kept beside the sessions: reaped
FILE_TIMEOUT_S = 60.0
_CGROUP_NAME = re.compile(r"^o(\d+)-(\d+)-([0-9a-f]{8})-(.+)$")
_WRITE = f'[ -d "$1" ] && exit {READ_DIRECTORY}; mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'


def image_dir_name(image: str) -> str:
    """The folder of `image` (a valid reference) in the image root: one plain name, never `.` or `..`."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", image)


def _tag(state_root: Path) -> str:
    return hashlib.sha1(str(state_root.resolve()).encode()).hexdigest()[:8]


class BubblewrapSandbox(BackgroundJobsMixin, Sandbox):
    """One session: `cwd` and every path are as seen inside the sandbox."""

    def __init__(self, session_id: str, state: StateFolder, settings: SandboxSettings, cwd: str,
                 rootfs: Path | None, slot: "Slot", give_back: Callable[["Slot", bool], None],
                 launcher: Path | None = None) -> None:
        self.session_id, self._state, self.cwd, self.cgroup = session_id, state, cwd, slot.cgroup
        self.command_timeout, self.output_cap = settings.command_timeout_s, settings.output_cap_bytes
        self.env = sanitized_env(cwd, {"PATH": DEFAULT_PATH})  # HOME = cwd
        # Through `state`, not `self`: no reference cycle to wait for the collector.
        self.jobs = BackgroundJobs(lambda: state.path / "logs", self.output_cap, settings.disk_mb << 20)
        self._slot, self._give_back = slot, give_back
        self._fds: dict[str, int] = {} if slot.net_fd is None else {"net": slot.net_fd}
        self._closed = False
        # Commands and file operations go through one exec server per session (exec_server.py),
        # started at the first of them; without its binary, each is a bubblewrap of its own.
        self._launcher = launcher
        self._server_binary, self._server = (launcher if settings.exec_server else None), None
        self._server_lock = threading.RLock()  # also guards the writable layer's pinning
        self._layer: list[str] | None = None  # the launcher's arguments making it, once there is one
        self._rootfs: Path | None = None
        self._ids = host_ids(settings)
        if self._ids is not None and launcher is None:
            raise SandboxError(NO_LAUNCHER)
        self._disk = str(settings.disk_mb << 20)
        # As root without an image, the slot's zygote makes the session (zygote.py): no bubblewrap of its own.
        self._zygote = rootfs is None and makes_zygotes(settings, launcher, self._ids)
        self._session_pid: int | None = None  # the host pid of the session's pid 1 (its server)
        self._session_pidfd: int | None = None
        if self._zygote:
            self._layout: list[str] = []
        else:
            self._layout = self._image_layout(rootfs) if rootfs else self._host_layout()  # the last step that may fail
        shell = (rootfs or Path("/")) / "bin" / "bash"
        self.shell = "/bin/bash" if os.path.lexists(shell) else "/bin/sh"

    @property
    def state_dir(self) -> Path:
        """The session's host folder (background logs; without root, /tmp and cwd too), made at its
        first use: a session of a zygote that starts no background command has none."""
        return self._state.path

    def _host_layout(self) -> list[str]:
        if self._ids is None:  # not root: plain folders of the invoking user (a tmpfs here needs root)
            rw = self.state_dir
            (rw / "tmp").mkdir()
            (rw / "tmp").chmod(0o1777)  # like any /tmp (mkdir's mode is cut by the umask)
            (rw / "cwd").mkdir()
        else:
            rw = self._writable_layer()
        return [*host_layout(), *proc_layout(), "--dev", "/dev", "--bind", str(rw / "tmp"), "/tmp",
                "--bind", str(rw / "cwd"), self.cwd, "--remount-ro", "/"]  # no writes that vanish

    def _image_layout(self, rootfs: Path) -> list[str]:
        if self._ids is None:
            raise SandboxError("the local backend runs images only as root (it mounts them); run as root or choose "
                               "the docker backend")
        # The cwd lives in the overlay (not a bind), so an image's own files there stay visible.
        return ["--bind", str(self._writable_layer(rootfs) / "root"), "/", *proc_layout(), "--dev", "/dev",
                "--dir", self.cwd]

    def _writable_layer(self, rootfs: Path | None = None) -> Path:
        """Where the session's writable space will be: a size-capped tmpfs (the disk quota, also
        counted against the session's memory limit) on LAYER in a mount namespace only an fd holds,
        never a host folder, so no host path shows in the sandbox's mountinfo. With an image, it holds
        the overlay `root` of `rootfs` (its files shifted to the sandbox's ids by an idmapped mount).
        Made by the exec server's launcher as it starts (no process of its own), else by _pin_layer."""
        layer_mount_point()
        self._layer, self._rootfs = ["--layer", str(LAYER), self._disk, *(["--image", str(rootfs)] if rootfs else [])], rootfs
        return LAYER

    def _pin_layer(self) -> None:
        """The writable layer made and pinned by a process of its own, for a bubblewrap started before
        (or without) the exec server."""
        with self._server_lock:
            if self._layer is not None and "mnt" not in self._fds:
                self._fds["mnt"] = pin_namespace([str(self._launcher), "--layer", str(LAYER), str(self._ids),
                                                  str(ID_COUNT), self._disk, *([str(self._rootfs)] if self._rootfs else [])],
                                                 "mnt")

    def _argv(self, inner: list[str], pid1: bool = False, make_layer: bool = False) -> list[str]:
        if self._closed:
            raise SandboxError(f"sandbox {self.session_id!r} is closed")
        if not make_layer:
            self._pin_layer()
        flags = [*NAMESPACE_FLAGS, "--as-pid-1"] if pid1 else NAMESPACE_FLAGS
        return [*self._enter(make_layer), BWRAP or "bwrap", *flags, *self._layout, "--chdir", self.cwd, "--", *inner]

    def _enter(self, make_layer: bool = False) -> list[str]:
        return entry_argv(self._launcher, self.cgroup, self._fds, self._ids, self._layer if make_layer else None)

    def _exec_server(self) -> ExecServer | None:
        """The session's exec server, started now if need be; None when commands run one bubblewrap each."""
        if self._server_binary is None:
            return None
        with self._server_lock:
            if self._closed:
                raise SandboxError(f"sandbox {self.session_id!r} is closed")
            if self._server is None and self._zygote:
                ctl, pid = slot_zygote(self._slot, self._launcher, self._ids).open(self.cwd, int(self._disk), ID_COUNT)
                self._server = ExecServer.attached(ctl)
                self._session_pid, self._session_pidfd = pid, session_pidfd(pid)
            if self._server is None:
                # The server is pid 1 of the sandbox, started from an fd: nothing is added to its files.
                # Its launcher makes the writable layer unless a bubblewrap before it did.
                make_layer = self._layer is not None and "mnt" not in self._fds
                server = ExecServer(lambda ctl, exe: self._argv([f"/proc/self/fd/{exe}", str(ctl), str(exe)],
                                                                pid1=True, make_layer=make_layer),
                                    self._server_binary, self.state_dir, self.env, tuple(self._fds.values()))
                if make_layer:  # the launcher waits for bubblewrap in the layer's mount namespace: pin it
                    try:
                        self._fds["mnt"] = os.open(f"/proc/{server.proc.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
                    except OSError as exc:
                        server.stop()
                        raise SandboxError(f"could not start the sandbox: its launcher is gone ({exc})") from exc
                self._server = server
            return self._server

    def start(self) -> None:
        self._exec_server()

    def interrupt(self) -> bool:
        with self._server_lock:
            server = self._server
        if server is not None:
            server.interrupt()
        return super().interrupt()  # commands of one bubblewrap each

    def _run(self, inner: list[str], data: bytes | None = None, limit: int = MAX_READ_BYTES,
             path: str = "") -> subprocess.CompletedProcess:
        """A file operation: its output, of which no more than `limit` bytes are taken (the file `path`
        is larger: `too_large`), whatever runs in the sandbox (an image's `head` may be anything)."""
        server = self._exec_server()
        if server is not None:
            out, err = bytearray(), bytearray()

            def take(chunk: bytes) -> None:
                out.extend(chunk)
                if len(out) > limit:
                    raise too_large(path, limit)

            status = server.call(inner, self.cwd, self.env, FILE_TIMEOUT_S, data, take, err.extend)
            if status is None:
                raise SandboxError(f"file operation timed out after {FILE_TIMEOUT_S:.0f} s")
            return subprocess.CompletedProcess(inner, _exit_code(status), bytes(out), bytes(err[:65536]))
        try:
            return subprocess.run(self._argv(inner), input=data, capture_output=True, env=self.env,
                                  cwd=self.state_dir, timeout=FILE_TIMEOUT_S, start_new_session=True,
                                  pass_fds=tuple(self._fds.values()))
        except subprocess.TimeoutExpired as exc:  # killing bwrap ends its pid namespace
            raise SandboxError(f"file operation timed out after {FILE_TIMEOUT_S:.0f} s") from exc
        except OSError as exc:
            raise SandboxError(f"could not start bubblewrap: {exc}") from exc

    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        timeout = self.command_timeout if timeout is None else float(timeout)
        if timeout <= 0:
            raise SandboxError("timeout must be positive")
        server = self._exec_server()
        if server is None:
            argv = self._argv([self.shell, "-c", command])
            return self.jobs.run(argv, str(self.state_dir), self.env, timeout, self.output_cap,
                                 tuple(self._fds.values()))[0]
        buffer = CappedBuffer(self.output_cap)
        status = server.call([self.shell, "-c", command], self.cwd, self.env, timeout, None, buffer.add, None)
        output, truncated = buffer.render()
        return ExecResult(output=output, exit_code=None if status is None else _exit_code(status),
                          timed_out=status is None, truncated=truncated)

    def spawn(self, command: str, pty: bool = False) -> int:
        if self._zygote:  # into the session the zygote made, with a pid namespace of its own
            self._exec_server()
            assert self._session_pidfd is not None and self._launcher is not None
            procs = self.cgroup.procs_files if self.cgroup else []
            argv = joined_argv(self._launcher, procs, self._session_pidfd, self.cwd, [self.shell, "-c", command])
            return self.jobs.start(command, argv, str(self.state_dir), self.env, (self._session_pidfd,), pty)
        argv = self._argv([self.shell, "-c", command])
        return self.jobs.start(command, argv, str(self.state_dir), self.env, tuple(self._fds.values()), pty)

    def spawn_pty(self, command: str) -> int:
        return self.spawn(command, pty=True)

    def _checked(self, path: str, done: subprocess.CompletedProcess) -> None:
        message = done.stderr.decode(errors="replace").strip()
        if done.returncode == READ_DIRECTORY:
            raise SandboxError(f"{path!r} is a directory")
        if done.returncode != 0:
            raise SandboxError(_quota_hint(message, self._disk) or f"{path!r}: failed with exit code {done.returncode}")

    def read_file(self, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        done = self._run(["/bin/sh", "-c", READ_SCRIPT, "sh", path, str(limit + 1)], limit=limit, path=path)
        return script_read(path, done.returncode, done.stdout, limit, done.stderr.decode(errors="replace").strip())

    def write_file(self, path: str, data: bytes) -> str:
        self._checked(path, self._run(["/bin/sh", "-c", _WRITE, "sh", path], data))
        return posixpath.normpath(posixpath.join(self.cwd, path))

    def _release(self) -> None:
        with self._server_lock:
            server, self._server = self._server, None
        if server is not None:
            server.stop()  # its pid namespace ends, and every command with it
        if self._session_pidfd is not None:
            os.close(self._session_pidfd)
            self._session_pidfd = None
        zygote = self._slot.zygote
        if zygote is not None and zygote.wait_ended(KILL_TIMEOUT_S):
            emptied = True  # the zygote saw the session's pid 1 reaped: the kernel ended all of it
        else:
            # Anything else still in the session, however it detached; an empty cgroup is proof that
            # nothing of this session can reach the next one, so only then is the slot reused.
            self._slot.stop_zygote()
            emptied = self.cgroup.kill_all() if self.cgroup is not None else False
        if "mnt" in self._fds:
            os.close(self._fds.pop("mnt"))  # frees the overlay mount
        self._fds.clear()
        self._give_back(self._slot, emptied)
        state_dir = self._state.take()
        if state_dir is not None and self._zygote:  # only this process wrote in it (logs): no mount to mind
            shutil.rmtree(state_dir, ignore_errors=True)
        elif state_dir is not None:
            remove_tree(state_dir)


def _quota_hint(message: str, disk: str) -> str:
    """`message`, saying which limit a full disk is (the sandbox's own tmpfs, not the host's disk)."""
    if "No space left on device" not in message:
        return message
    return (f"{message} (the sandbox's writable space is full: {int(disk) >> 20} MiB each for the working "
            "directory and /tmp, HERMES_SANDBOX_DISK_MB)")


def _exit_code(status: int) -> int:
    """The shell's exit code for a wait status the sandbox reported (untrusted: checked)."""
    try:
        return shell_exit_code(os.waitstatus_to_exitcode(status))
    except ValueError as exc:
        raise SandboxError(f"the sandbox reported an impossible exit status {status}") from exc


class BubblewrapBackend(SandboxBackend):
    """Sessions in `state_root/<session_id>-o<owner pid>.<owner start>-<random>/` (background logs;
    without root, /tmp and cwd too);
    their slots' cgroups are `hermes-foundry/o<owner pid>-<owner start>-<state root tag>-slot<random>`.
    `close()` frees the idle slots once the sessions are done."""

    name = "local"

    def __init__(self, settings: SandboxSettings | None = None,
                 hierarchy: Hierarchy | None | Literal["detect"] = "detect") -> None:
        self.settings = settings or SandboxSettings()
        # Absolute: bwrap and nsenter run with other working directories.
        self.state_root = Path(self.settings.state_root or Path(tempfile.gettempdir()) / "hermes-bwrap").absolute()
        self.hierarchy = detect() if hierarchy == "detect" else hierarchy
        self._slots = SlotPool(self.hierarchy, self.settings, self.state_root, _tag(self.state_root), BWRAP or "bwrap")

    def _rootfs(self, image: str) -> tuple[Path | None, str | None]:
        """The prepared root filesystem of `image`, resolved beneath the image root; or why not."""
        if problem := reference_problem(image):
            return None, problem  # its folder is named after it: only a reference keeps that a plain name
        if self.settings.image_root is None:
            return None, (f"the local backend runs images from prepared root filesystems, but no image root is "
                          f"configured; set HERMES_SANDBOX_IMAGE_ROOT to a folder holding one root filesystem per "
                          f"image, named like {image_dir_name(image)!r}")
        expected = Path(self.settings.image_root) / image_dir_name(image)
        rootfs, problem = confine(self.settings.image_root, image_dir_name(image))  # refuses links leading out
        if rootfs is None:
            return None, problem
        if not (rootfs / "bin" / "sh").exists() and not (rootfs / "usr" / "bin" / "sh").exists():
            return None, (f"no root filesystem at {expected}; prepare one, e.g. with "
                          f"`debootstrap --variant=minbase --include=python3 bookworm {expected}`")
        if "," in str(rootfs) or ":" in str(rootfs):
            return None, f"the root filesystem path {rootfs} must not contain ',' or ':' (overlayfs)"
        return rootfs, None

    def image_problem(self, image: str) -> str | None:
        """A reference whose folder in the image root (links resolved, never leading out) holds a root filesystem."""
        return self._rootfs(image)[1]

    def preflight(self, images: Images) -> list[str]:
        problems = [] if BWRAP else ["bubblewrap (bwrap) is not installed; install it or choose another backend"]
        if os.geteuid() == 0 and server_binary() is None:
            problems.append(NO_LAUNCHER)
        return problems + image_problems(images, self.image_problem)

    def open(self, session_id: str, image: str | None = None, cwd: str | None = None) -> BubblewrapSandbox:
        if BWRAP is None:
            raise SandboxError("bubblewrap (bwrap) is not installed; install it or choose another backend")
        rootfs, problem = self._rootfs(image) if image else (None, None)
        if image and problem:
            raise SandboxError(f"{image_label(image)}: {problem}")
        inside = checked_cwd(cwd, host_system=image is None)  # without one, the host's system folders
        self.state_root.mkdir(parents=True, exist_ok=True)
        state = StateFolder(self.state_root, session_id)
        slot = None
        try:
            slot = self._slots.take()
            sandbox = BubblewrapSandbox(session_id, state, self.settings, inside, rootfs, slot,
                                        self._slots.give_back, server_binary())
        except BaseException:
            if slot is not None:
                slot.destroy()
            if (state_dir := state.take()) is not None:
                remove_tree(state_dir)
            raise
        return sandbox

    def prepare(self, sessions: int) -> None:
        """Make `sessions` slots ahead, in the background, each with its zygote when sessions without
        an image will use one (as root, with the exec server)."""
        if BWRAP is None:
            return  # open() says why
        launcher, ids = server_binary(), host_ids(self.settings)
        self.state_root.mkdir(parents=True, exist_ok=True)  # where zygotes log their start
        self._slots.warm(sessions, (lambda slot: slot_zygote(slot, launcher, ids))  # type: ignore[arg-type]
                         if makes_zygotes(self.settings, launcher, ids) else None)

    def close(self) -> None:
        """Destroy the idle slots (cgroups and network namespaces)."""
        self._slots.close()

    def reap(self) -> int:
        """Empty the slot cgroups of dead owners (killing what runs in them; they become spares) and
        remove their sessions' state folders; returns how many sandboxes were left (a slot and its
        session count once)."""
        folders, dead = 0, []
        for name in session_names(self.hierarchy) if self.hierarchy else ():
            match = _CGROUP_NAME.match(name)
            if match and not owner_alive(match[1], match[2]):
                cgroup = SessionCgroup(self.hierarchy, name)  # type: ignore[arg-type]
                cgroup.kill_all()  # first: nothing may still write into the state folder
                dead.append(cgroup)
        retire(dead)  # emptied: spares for later slots rather than dying memory cgroups (one listing)
        for path in self.state_root.glob("*") if self.state_root.is_dir() else ():
            if path.is_dir() and orphaned(path) and not remove_tree(path):  # a leftover is reported, and skipped
                folders += not path.name.startswith(ETC_COPY_PREFIX)
        return max(len(dead), folders)


def session_leftovers(state_root: Path, hierarchy: Hierarchy | None | Literal["detect"] = "detect") -> list[str]:
    """What sessions of `state_root` left behind: state folders, cgroups and mounts."""
    hierarchy = detect() if hierarchy == "detect" else hierarchy
    found = [str(path) for path in sorted(state_root.glob("*"))] if state_root.is_dir() else []
    tag = _tag(state_root)
    found += [f"cgroup {name}" for name in sorted(session_names(hierarchy) if hierarchy else ())
              if (match := _CGROUP_NAME.match(name)) and match[3] == tag]
    with open("/proc/self/mounts") as mounts:
        root = str(state_root.resolve())
        found += [f"mount {line.split()[1]}" for line in mounts if line.split()[1].startswith(root)]
    return found
