"""The "cloud" side of the fake Modal: sandbox records on disk and one supervisor process per
sandbox that owns its container (a long-lived bubblewrap, like a Modal container it outlives the
client that created it) until it is terminated or its `timeout` ends.

What the fake models of a Modal container: its own user namespace whose root is an unprivileged
per-sandbox host uid (as root in gVisor is not the host's root: RLIMIT_NPROC applies to it), no
network with `block_network`, memory and CPU limits only for the (request, limit) forms, the image
read-only except the workdir, /tmp, /var/tmp and /root (real Modal images are writable throughout).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from modal.exception import AuthError, ConnectionError

FAKES = Path(__file__).resolve().parents[1]
UID_BASE = 2_000_000  # sandbox roots map to host uids from here on, one per sandbox
NSENTER = shutil.which("nsenter") or "nsenter"


class Config:
    """Knobs for tests (environment variables so that subprocesses see the same cloud)."""

    def __init__(self) -> None:
        self.root = Path(os.environ.get("FAKE_MODAL_ROOT") or Path(tempfile.gettempdir()) / "hermes-fake-modal")
        self.authenticated = os.environ.get("FAKE_MODAL_AUTHENTICATED", "1") != "0"
        self.offline = os.environ.get("FAKE_MODAL_OFFLINE", "0") == "1"
        self.offline_delay_s = 58.0  # what the real client takes to give up when offline


config = Config()


def configure(**values: object) -> None:
    for name, value in values.items():
        if not hasattr(config, name):
            raise AttributeError(f"fake modal has no setting {name!r}")
        setattr(config, name, Path(value) if name == "root" else value)


def connect() -> None:
    """What every call needing the Modal server goes through."""
    if not config.authenticated:
        raise AuthError("Token missing. Could not authenticate client. If you have token credentials, see "
                        "modal.com/docs/reference/modal.config for setup help.")
    if config.offline:
        time.sleep(config.offline_delay_s)
        raise ConnectionError("Could not connect to the Modal server.")


def records_dir() -> Path:
    path = config.root / "sandboxes"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load(sandbox_id: str) -> dict | None:
    try:
        return json.loads((records_dir() / f"{sandbox_id}.json").read_text())
    except (OSError, ValueError):
        return None


def save(record: dict) -> None:
    path = records_dir() / f"{record['id']}.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(record))
    temporary.replace(path)  # readers never see half a record


def alive(record: dict) -> bool:
    if "supervisor_pid" not in record:
        return False  # still starting
    try:
        with open(f"/proc/{record['supervisor_pid']}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return False
    # A finished supervisor started by this process stays a zombie until reaped: that is dead too.
    return fields[0] not in (b"Z", b"X") and fields[19].decode() == record.get("supervisor_start")


def all_records() -> list[dict]:
    return [record for path in sorted(records_dir().glob("sb-*.json")) if (record := load(path.stem))]


def _hosts_root() -> Path:
    """Host folders of containers, outside `config.root` (e.g. pytest's private tmp_path): the
    unprivileged sandbox uid must be able to reach them. Named after the root, for `leftovers`."""
    path = Path(tempfile.gettempdir()) / "hermes-fake-modal-hosts"
    path.mkdir(mode=0o711, exist_ok=True)
    return path


def _root_tag() -> str:
    return hashlib.sha1(str(config.root.resolve()).encode()).hexdigest()[:8]


def new_record(**fields: object) -> dict:
    used = {record.get("uid") for record in all_records()}
    uid = UID_BASE + secrets.randbelow(1_000_000)
    while uid in used:
        uid = UID_BASE + secrets.randbelow(1_000_000)
    record = {"id": "sb-" + secrets.token_hex(11), "uid": uid, "status": "starting", **fields}
    host = _hosts_root() / f"{_root_tag()}-{record['id']}"
    for name in ("work", "tmp", "var_tmp", "home"):
        (host / name).mkdir(parents=True)
        os.chown(host / name, uid, uid)
    record["host_dir"] = str(host)
    return record


def enter_argv(record: dict, args: list[str], workdir: str | None = None,
               env: dict[str, str] | None = None) -> list[str]:
    """A host command line running `args` inside the container: in its cgroups and namespaces, as its
    root, with the container's environment, from `workdir` (default: the sandbox's workdir)."""
    import fakebox

    inner = ["env", "-i", *[f"{k}={v}" for k, v in fakebox.container_env(extra=env).items()],
             "/bin/sh", "-c", 'cd "$0" && exec "$@"', workdir or record["workdir"], *args]
    enter = [NSENTER, "--target", str(record["container_pid"]), "--user", "--mount", "--uts", "--ipc", "--net",
             "--pid", "--root", *inner]
    return fakebox.join_cgroups_argv(record["cgroup_procs"], enter)


def start_supervisor(record: dict) -> dict:
    """Start the sandbox's supervisor; returns the record once its container runs."""
    save(record)
    log_path = records_dir() / f"{record['id']}.log"
    code = (f"import sys; sys.path.insert(0, {str(FAKES)!r}); "
            f"from modal._cloud import supervise; supervise({record['id']!r})")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, env={**os.environ, "FAKE_MODAL_ROOT": str(config.root)})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        current = load(record["id"]) or {}
        if current.get("status") == "running":
            return current
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    detail = log_path.read_text(errors="replace")
    log_path.unlink(missing_ok=True)
    raise RuntimeError(f"fake modal: sandbox {record['id']} did not start: {detail}")


def supervise(sandbox_id: str) -> None:
    """Body of the supervisor process: run the container, clean everything up when it ends."""
    import fakebox

    record = load(sandbox_id)
    assert record is not None
    host = Path(record["host_dir"])
    targets: list[int] = []

    def stop(_signum: int, _frame: object) -> None:
        for pid in targets:  # killing pid 1 of the namespace kills everything in it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    memory = record["memory_limit_mb"]
    cgroup = fakebox.Cgroup("modal", memory_bytes=memory * 1024 * 1024 if memory else None,
                            cpus=record["cpu_limit"] or None)
    try:
        read_end, write_end = os.pipe()
        binds = {record["workdir"]: host / "work", "/tmp": host / "tmp", "/var/tmp": host / "var_tmp",
                 "/root": host / "home"}
        argv = fakebox.bwrap_argv(Path(record["rootfs"]), record["command"], cwd=record["workdir"], binds=binds,
                                  network=not record["block_network"], user_ns=True, drop_caps=False,
                                  extra=["--info-fd", str(write_end)])
        uid = record["uid"]

        def become_sandbox_user() -> None:  # the supervisor is single-threaded: preexec_fn is safe
            cgroup.join()
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

        container = subprocess.Popen(argv, env=fakebox.container_env(), pass_fds=(write_end,),
                                     preexec_fn=become_sandbox_user)
        targets.append(container.pid)
        os.close(write_end)
        info = b""
        while not info.rstrip().endswith(b"}") and (chunk := os.read(read_end, 4096)):
            info += chunk
        targets.insert(0, json.loads(info)["child-pid"])
        record.update(container_pid=targets[0], cgroup_procs=cgroup.procs_files())
        # bwrap reports its pid before the container's root is mounted: wait until a command runs.
        deadline = time.monotonic() + 10
        while (probe := subprocess.run(enter_argv(record, ["true"]), capture_output=True, timeout=20)).returncode:
            if container.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"container not usable: {probe.stderr.decode(errors='replace')}")
            time.sleep(0.02)
        record.update(status="running", supervisor_pid=os.getpid(), supervisor_start=_start_time(os.getpid()))
        save(record)
        try:
            container.wait(timeout=record["timeout"])
        except subprocess.TimeoutExpired:
            stop(0, None)  # the sandbox's lifetime is over
            container.wait()
        (records_dir() / f"{sandbox_id}.log").unlink(missing_ok=True)
    finally:
        stop(0, None)
        cgroup.destroy()
        shutil.rmtree(host, ignore_errors=True)
        (records_dir() / f"{sandbox_id}.json").unlink(missing_ok=True)


def _start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        return handle.read().rsplit(b")", 1)[1].split()[19].decode()


def leftovers() -> list[str]:
    """Everything of the fake cloud under `config.root` still there: sandboxes, folders, cgroups."""
    import fakebox

    found = [f"sandbox {record['id']} ({record.get('status')})" for record in all_records()]
    found += [str(path) for path in _hosts_root().glob(f"{_root_tag()}-*")]
    return found + [f"cgroup {path}" for path in fakebox.new_stale_cgroups("modal", config.root)]
