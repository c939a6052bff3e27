"""The bubblewrap `local` backend beyond the contract: mount layout, images as overlays, slots, network,
reaper, kill -9, and close() racing a starting exec. Cgroup limits and spares: test_sandbox_cgroups.py."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from hermes_core.sandbox import SandboxError, SandboxSettings, get_backend
from hermes_core.sandbox.bubblewrap import BubblewrapBackend, session_leftovers
from hermes_core.sandbox.processes import loopback_namespace
from procs import free_port, host_uid_of, marker, processes_with, wait_until
from host_knobs import knob_writes
from rootfs import tiny_rootfs

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="process checks read /proc")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bwrap_settings(tmp_path: Path) -> SandboxSettings:
    return SandboxSettings(state_root=tmp_path / "state", image_root=tmp_path / "images")


@pytest.fixture
def local(bwrap_settings: SandboxSettings) -> Iterator[BubblewrapBackend]:
    with BubblewrapBackend(bwrap_settings) as backend:
        yield backend


def test_layout_isolation_and_capabilities(local: BubblewrapBackend, tmp_path: Path) -> None:
    (tmp_path / "host-secret").write_text("SECRET")
    with local.open("layout", cwd="src") as box:
        assert box.cwd == "/workspace/src" and box.exec("pwd; echo $HOME").output == "/workspace/src\n" * 2
        out = box.exec(f"cat {tmp_path}/host-secret; ls /root /work /home; grep CapEff /proc/self/status; "
                       "touch /newfile /usr/newfile; mount -o remount,rw /usr; echo x > /tmp/t").output
        assert "SECRET" not in out and "CapEff:\t0000000000000000" in out and out.count("Read-only file system") == 2
        shadow = box.exec("cat /etc/shadow").output  # the sandbox's root is not the host's
        assert "root:" not in shadow and "Permission denied" in shadow
        # Own pid namespace: the session's exec server (pid 1) and its command supervisor, nothing of the host.
        assert set(box.exec("ps -eo comm").output.split()) == {"COMMAND", "exec-server", "ps"}
        assert not Path("/newfile").exists() and box.read_file("/tmp/t") == b"x\n"
        assert box.write_file("notes/../notes/a.txt", b"hi") == "/workspace/src/notes/a.txt"
        assert box.read_file("/etc/hostname") == Path("/etc/hostname").read_bytes()  # what commands see
        for outside in ("/usr/evil", "../evil"):  # only the cwd and /tmp are writable
            with pytest.raises(SandboxError, match="Read-only"):
                box.write_file(outside, b"x")
        with pytest.raises(SandboxError, match="directory"):
            box.read_file("/tmp")
    for cwd in ("/", "/proc/x", "/usr/src/app"):
        with pytest.raises(SandboxError):
            local.open("bad", cwd=cwd)
    local.close()
    assert session_leftovers(local.state_root) == []


@pytest.mark.parametrize("image", [None, "tiny:v1"])
def test_root_in_the_sandbox_has_no_power_over_the_host(local: BubblewrapBackend, bwrap_settings: SandboxSettings,
                                                        image: str | None) -> None:
    """A command runs as root, but the root of its own user namespace, an unprivileged host uid: it
    wrote host kernel settings through /proc/sys (a `|program` core pattern is a root escape) and read
    its workspace's host path in mountinfo."""
    if image:
        tiny_rootfs(bwrap_settings.image_root)
    writes, knobs = knob_writes()
    irq = Path("/proc/irq/default_smp_affinity")  # not read-only inside: the host's root owns it
    if irq.exists():
        writes += f"; printf '%s' '{irq.read_text().strip()}' > {irq} && echo WROTE {irq}"
    with local.open("knobs", image=image) as box:
        out = box.exec(f"{writes}; cat /proc/self/uid_map /proc/self/mountinfo").output
        assert "WROTE" not in out and out.count("Read-only file system") == knobs
        assert out.count("Permission denied") == irq.exists()
        tag = marker()
        box.spawn(f"exec sleep {tag}")
        assert wait_until(lambda: host_uid_of(f"sleep {tag}") is not None, timeout=5)
        assert host_uid_of(f"sleep {tag}") == bwrap_settings.host_uid  # its root is the host's 100000
        assert str(bwrap_settings.state_root) not in out and "/tmp/pytest" not in out  # no host path of its own
    local.close()
    assert session_leftovers(local.state_root) == []


@pytest.mark.parametrize("image", [None, "tiny:v1"])
def test_the_writable_space_has_a_quota_off_the_host_disk(bwrap_settings: SandboxSettings, image: str | None) -> None:
    """A command wrote 300 MB to the host's disk: the working directory, /tmp and an image's writable
    layer are now a tmpfs of HERMES_SANDBOX_DISK_MB, and a full one is a clear tool error."""
    if image:
        tiny_rootfs(bwrap_settings.image_root)
    settings = dataclasses.replace(bwrap_settings, disk_mb=4)
    with BubblewrapBackend(settings) as local, local.open("quota", image=image) as box:
        out = box.exec("cat /dev/zero > big; ls -l big").output
        assert "No space left on device" in out and " 4194304 " in out  # 4 MiB written, no more
        with pytest.raises(SandboxError, match=r"writable space is full: 4 MiB .*HERMES_SANDBOX_DISK_MB"):
            box.write_file("more.txt", b"x" * 10000)
        assert box.exec("rm big; echo fine > more.txt; cat more.txt").output == "fine\n"  # freed, usable again
        used = sum(path.stat().st_size for path in box.state_dir.rglob("*") if path.is_file())
        assert used < 100_000  # the 4 MiB were never on the host's disk


def test_a_reused_slot_carries_nothing_from_the_previous_session(local: BubblewrapBackend) -> None:
    """Sessions reuse an emptied cgroup and loopback network namespace: files, processes and
    listening sockets of the previous session must all be gone."""
    if local.hierarchy is None:
        pytest.skip("slots are only reused with a cgroup to prove them empty")
    tag = marker()
    first = local.open("first")
    first.exec("echo secret > /tmp/note; echo secret > mine.txt")
    port = free_port()  # any port: the session's loopback is its own
    first.spawn(f"python3 -m http.server --bind 127.0.0.1 {port} # {tag}")
    first.exec(f"(setsid sleep {tag} > /dev/null 2>&1 &)")
    connect = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('UP')\""
    assert wait_until(lambda: first.exec(connect).output == "UP\n")
    cgroup, net_fd = first.cgroup, first._fds["net"]
    first.close()
    second = local.open("second")
    assert second.cgroup is cgroup and second._fds["net"] == net_fd  # the same slot
    assert not processes_with(tag)
    out = second.exec(f"cat /tmp/note mine.txt; {connect}; ls -A").output
    assert "secret" not in out and "UP" not in out and "Connection refused" in out
    second.close()
    local.close()
    assert not cgroup.exists() and session_leftovers(local.state_root) == []


def test_image_root_is_a_private_overlay(local: BubblewrapBackend, bwrap_settings: SandboxSettings) -> None:
    rootfs = tiny_rootfs(bwrap_settings.image_root)
    first = local.open("img-1", image="tiny:v1", cwd="/app")
    second = local.open("img-2", image="tiny:v1")
    assert first.exec("pwd; cat shipped.txt /etc/marker").output == "/app\nfrom the image\ntiny\n"
    assert first.exec("echo changed > /etc/marker; mkdir -p /opt/new; echo x > /bin/tool").exit_code == 0
    assert first.exec("cat /etc/marker; ls /opt").output == "changed\nnew\n"  # persists across commands
    assert first.read_file("/etc/marker") == b"changed\n" and first.read_file("shipped.txt") == b"from the image\n"
    assert first.write_file("/usr/lib/deep/new.txt", b"tool") == "/usr/lib/deep/new.txt"
    assert second.cwd == "/workspace" and second.exec("cat /etc/marker; ls /opt").output.startswith("tiny\n")
    assert (rootfs / "etc" / "marker").read_text() == "tiny\n" and not (rootfs / "opt").exists()
    assert str(first.state_dir) not in Path("/proc/self/mounts").read_text()  # the overlay is not a host mount
    first.close(), second.close()
    local.close()
    assert session_leftovers(local.state_root) == []


def test_preflight_reports_every_missing_image(tmp_path: Path, bwrap_settings: SandboxSettings) -> None:
    tiny_rootfs(bwrap_settings.image_root, "ready_1")
    problems = BubblewrapBackend(bwrap_settings).preflight({"ready:1", "hermes-test/bookworm:latest", "py:3.11"})
    assert len(problems) == 2
    assert str(bwrap_settings.image_root / "hermes-test_bookworm_latest") in problems[0] and "debootstrap" in problems[0]
    assert "py:3.11" in problems[1] and "py_3.11" in problems[1]
    unconfigured = BubblewrapBackend(SandboxSettings(state_root=tmp_path))
    assert "no image root is configured" in unconfigured.preflight({"x"})[0] and unconfigured.preflight(set()) == []
    with pytest.raises(SandboxError, match="debootstrap"):
        BubblewrapBackend(bwrap_settings).open("s", image="py:3.11")


def test_network(local: BubblewrapBackend, bwrap_settings: SandboxSettings) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    # A port the host holds bound but not listening: nothing else on the host can answer there.
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    connect = "python3 -c \"import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2); print('UP')\""
    try:
        with BubblewrapBackend(dataclasses.replace(bwrap_settings, network=True)).open("on") as box:
            assert box.exec(f"{connect} {listener.getsockname()[1]}").output == "UP\n"
        with local.open("off") as box:  # no network, but one loopback per session, shared by its commands
            assert "UP" not in box.exec(f"{connect} {listener.getsockname()[1]}").output
            box.spawn(f"python3 -m http.server --bind 127.0.0.1 {port}")
            assert wait_until(lambda: box.exec(f"{connect} {port}").output == "UP\n")
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), 1)
    finally:
        listener.close()
        held.close()


def _namespace_of(fd: int) -> tuple[str, str, str]:
    """A network namespace as a command in it sees it (its interfaces and addresses), the user
    namespace that owns it, and its own id."""
    inside = subprocess.run(["nsenter", f"--net=/proc/self/fd/{fd}", "ip", "-o", "addr"], pass_fds=(fd,),
                            capture_output=True, text=True, check=True).stdout
    addresses = "\n".join(" ".join(line.split()[1:4]) for line in inside.splitlines())
    owner = fcntl.ioctl(fd, 0xB701)  # NS_GET_USERNS: an fd of the owning user namespace
    try:
        return addresses, os.readlink(f"/proc/self/fd/{owner}"), os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(owner)


@pytest.mark.skipif(os.geteuid() != 0, reason="as root a thread makes the namespace (bubblewrap otherwise)")
def test_a_slots_network_namespace_is_what_bubblewrap_makes_as_root(monkeypatch) -> None:
    threads = threading.active_count()
    made = loopback_namespace("bwrap")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # the way taken without root: a bubblewrap makes it
    by_bwrap = loopback_namespace("bwrap")
    try:
        ours, theirs = _namespace_of(made), _namespace_of(by_bwrap)
        assert ours[0] == theirs[0] == "lo inet 127.0.0.1/8\nlo inet6 ::1/128"  # loopback, up, and nothing else
        assert ours[1] == theirs[1] == os.readlink("/proc/self/ns/user")  # owned alike: the host's user namespace
        assert len({ours[2], theirs[2], os.readlink("/proc/self/ns/net")}) == 3
        assert os.readlink("/proc/thread-self/ns/net") == os.readlink("/proc/self/ns/net")  # this thread stayed
        assert threading.active_count() == threads  # the thread that made it is gone; no process holds it
        assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _in_namespace(pid, ours[2])]
    finally:
        os.close(made)
        os.close(by_bwrap)


def test_a_session_cannot_reconfigure_its_slots_network_for_the_next(local: BubblewrapBackend) -> None:
    """The slot's namespace is owned by the host's user namespace: a hostile command can neither add
    an interface, take loopback down nor change the namespace's settings, so the next session of the
    slot gets the same loopback-only network."""
    attack = ("ip link add hostile0 type dummy; echo add=$?; ip link set lo down; echo down=$?; "
              "ip addr add 10.9.9.9/8 dev lo; echo addr=$?; echo 1 > /proc/sys/net/ipv4/ip_forward; echo fwd=$?")
    with local.open("hostile") as box:
        slot = box._slot
        out = box.exec(attack).output
    for step in ("add", "down", "addr", "fwd"):
        assert f"{step}=0" not in out and f"{step}=" in out, out
    with local.open("next") as box:
        assert box._slot is slot  # the same slot, reused
        addresses = box.exec("ip -o addr | awk '{print $2, $3, $4}'").output
        assert addresses.split("\n")[:2] == ["lo inet 127.0.0.1/8", "lo inet6 ::1/128"], addresses
        assert "hostile0" not in box.exec("ip -o link").output


def _in_namespace(pid: str, namespace: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/net") == namespace
    except OSError:
        return False


def test_commands_children_end_with_the_command_but_jobs_survive(local: BubblewrapBackend) -> None:
    tag = marker()
    with local.open("jobs") as box:
        job = box.spawn(f"sleep {tag}")
        spawner = threading.Thread(target=lambda: box.spawn("sleep 1000.5"))  # a short-lived thread
        spawner.start()
        spawner.join()
        assert box.exec(f"sleep {tag}1 > /dev/null 2>&1 & echo ok").output == "ok\n"
        assert box.exec("sleep 100", timeout=0.5).timed_out  # timeouts leave background jobs alone
        time.sleep(0.3)
        assert not processes_with(f"sleep {tag}1") and box.poll(job).running and box.poll(2).running
    assert not processes_with(f"sleep {tag}")


def _orphan(state_root: Path, marker: str) -> subprocess.Popen:
    """A child process that opens a sandbox, starts sleeps in it, and blocks in an exec until killed."""
    script = textwrap.dedent(f"""
        import sys
        from hermes_core.sandbox import SandboxSettings
        from hermes_core.sandbox.bubblewrap import BubblewrapBackend
        box = BubblewrapBackend(SandboxSettings(state_root={str(state_root)!r})).open("orphan")
        box.spawn("sleep {marker}")
        print(box.state_dir, box.cgroup.name if box.cgroup else "", flush=True)
        box.exec("sleep {marker}")
    """)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)


def test_kill_9_of_the_orchestrator_leaves_no_sandbox_process_and_reap_cleans(local: BubblewrapBackend) -> None:
    tag = marker()
    child = _orphan(local.state_root, tag)
    state_dir, cgroup_name = child.stdout.readline().split()
    sleeps = lambda: [p for p in processes_with(f"sleep {tag}") if p.startswith("sleep")]  # noqa: E731
    assert wait_until(lambda: len(sleeps()) == 2)  # the spawned one and the exec'd one
    child.kill()
    child.wait()
    assert wait_until(lambda: not processes_with(f"sleep {tag}"), timeout=3), processes_with(f"sleep {tag}")
    with local.open("alive") as mine:
        mine.spawn("true")  # its folder (made at the first background command) must survive the reap
        assert Path(state_dir).is_dir() and local.reap() >= 1
        assert not Path(state_dir).exists() and mine.state_dir.is_dir()
        assert local.hierarchy is None or cgroup_name not in str(session_leftovers(local.state_root))
        assert local.reap() == 0
    local.close()
    assert session_leftovers(local.state_root) == []


@pytest.mark.parametrize("name", ["local", "plain"])
def test_close_racing_a_starting_exec_leaves_no_process(tmp_path: Path, name: str) -> None:
    """close() from another thread (a cancelled request) while an exec is starting must kill it."""
    backend = get_backend(name, SandboxSettings(state_root=tmp_path / "race"))
    for attempt in range(10):
        tag = f"{6000 + attempt}.{uuid.uuid4().int % 1000:03d}"
        sandbox = backend.open(f"race{attempt}")
        runner = threading.Thread(target=lambda: _swallow(lambda: sandbox.exec(f"sleep {tag}")))
        runner.start()
        time.sleep(0.002 * attempt)
        sandbox.close()
        runner.join(10)
        time.sleep(0.1)
        assert not [p for p in processes_with(f"sleep {tag}") if p.startswith("sleep")], f"attempt {attempt} leaked"


def _swallow(call) -> None:
    try:
        call()
    except Exception:
        pass
