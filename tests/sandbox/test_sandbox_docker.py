"""What only the docker backend promises (the shared contract is in test_sandbox_contract.py):
container options, pre-flight, a clear error without an engine, and the reaper."""

from __future__ import annotations

import subprocess
import sys
import time

import docker
import pytest
from docker.errors import NotFound

from contract_backends.docker import IMAGE, REPO, make_backend
from host_knobs import knob_writes
from hermes_core.sandbox import SandboxError, SandboxSettings
from hermes_core.sandbox.docker import LABEL_OWNER, LABEL_RUN, LABEL_SESSION, SANDBOX_USER, DockerBackend, owner_label


@pytest.fixture()
def opened():
    sandboxes = []
    yield sandboxes
    for sandbox in sandboxes:
        sandbox.close()


def test_container_options(tmp_path, opened):
    backend = make_backend(tmp_path, memory_mb=256, pids=64, cpus=0.5)
    sandbox = backend.open("options-1", IMAGE)
    opened.append(sandbox)
    info = backend.client().api.inspect_container(sandbox.container_id)
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["Memory"] == 256 * 2**20 and host["MemorySwap"] == 256 * 2**20
    assert host["PidsLimit"] == 64 and host["NanoCpus"] == 500_000_000
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"] and not host["Privileged"]
    assert host["SecurityOpt"] == ["no-new-privileges"] and host["Init"] is True
    labels = info["Config"]["Labels"]
    assert labels[LABEL_RUN] == backend.settings.run_name and labels[LABEL_SESSION] == "options-1"
    assert labels[LABEL_OWNER] == owner_label()
    assert info["Config"]["User"] == SANDBOX_USER
    # Inside: unprivileged user, no capabilities, loopback only, a writable default working directory.
    result = sandbox.exec("id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; ls /sys/class/net; "
                          "pwd; touch made-here && echo writable")
    assert result.exit_code == 0, result.output
    lines = result.output.split()
    assert lines[0] == "65534" and "0000000000000000" in lines and lines[lines.index("NoNewPrivs:") + 1] == "1"
    assert "lo" in lines and "eth0" not in lines
    assert "/workspace" in lines and "writable" in lines


def test_tool_files_belong_to_the_sandbox_user(tmp_path, opened):
    sandbox = make_backend(tmp_path).open("files-1", IMAGE, "/app")
    opened.append(sandbox)
    assert sandbox.write_file("deep/er/f.txt", b"one\n") == "/app/deep/er/f.txt"
    result = sandbox.exec("echo two >> deep/er/f.txt && touch deep/er/g && stat -c %u deep deep/er/f.txt")
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["65534", "65534"]
    assert sandbox.read_file("deep/er/f.txt") == b"one\ntwo\n"
    with pytest.raises(SandboxError, match="directory"):
        sandbox.write_file("deep", b"would replace a folder")
    assert sandbox.exec("test -d deep/er").exit_code == 0


def test_host_kernel_settings_are_not_writable(tmp_path, opened):
    """Commands run as 65534 with no capability, /proc/sys read-only (the engine's default)."""
    writes, knobs = knob_writes()
    sandbox = make_backend(tmp_path).open("knobs", IMAGE)
    opened.append(sandbox)
    out = sandbox.exec(f"{writes}; id -u").output
    assert "WROTE" not in out and out.endswith("65534\n") and out.count("Read-only file system") == knobs


def test_output_is_capped(tmp_path, opened):
    sandbox = make_backend(tmp_path, output_cap_bytes=1000).open("cap-1", IMAGE)
    opened.append(sandbox)
    result = sandbox.exec("head -c 50000 /dev/zero | tr '\\0' x; echo; echo END")
    assert result.truncated and "output truncated" in result.output and result.output.rstrip().endswith("END")
    assert len(result.output.encode()) < 1200


def test_preflight_reports_every_missing_image_at_once(tmp_path):
    backend = make_backend(tmp_path)
    assert backend.preflight({IMAGE}) == []
    problems = backend.preflight({IMAGE, "hermes-missing/one:1", "hermes-missing/two:2"})
    assert len(problems) == 2
    assert "hermes-missing/one:1" in problems[0] and "hermes-missing/two:2" in problems[1]
    assert all("pulling is disabled" in problem for problem in problems)
    with pytest.raises(SandboxError, match="hermes-missing/one:1"):
        backend.open("missing-image", "hermes-missing/one:1")


def test_network_needs_an_engine_with_a_bridge(tmp_path, opened):
    backend = make_backend(tmp_path, network=True)
    if any(network.name == "bridge" for network in backend.client().networks.list()):
        pytest.skip("this engine has a bridge network")
    with pytest.raises(SandboxError, match="bridge"):
        opened.append(backend.open("network-1", IMAGE))


def test_no_engine_is_one_clear_error_naming_docker_host(tmp_path, monkeypatch):
    host = f"unix://{tmp_path}/no-engine.sock"
    monkeypatch.setenv("DOCKER_HOST", host)
    backend = DockerBackend(SandboxSettings())
    problems = backend.preflight({IMAGE, "another/image:1"})
    assert len(problems) == 1 and f"DOCKER_HOST={host}" in problems[0] and "Traceback" not in problems[0]
    with pytest.raises(SandboxError, match="DOCKER_HOST"):
        backend.open("no-engine", IMAGE)
    with pytest.raises(SandboxError, match="DOCKER_HOST"):
        backend.reap()


def test_no_engine_with_an_explicit_api_version(tmp_path, monkeypatch):
    """A client built with `version=` connects lazily and fails with a requests ConnectionError."""
    host = f"unix://{tmp_path}/no-engine.sock"
    monkeypatch.setenv("DOCKER_HOST", host)
    monkeypatch.setattr(docker, "from_env", lambda **kwargs: docker.DockerClient(base_url=host, version="1.41"))
    with pytest.raises(SandboxError, match=f"DOCKER_HOST={host}"):
        DockerBackend(SandboxSettings()).open("no-engine", IMAGE)


CHILD = """
import sys, time
from hermes_core.sandbox import SandboxSettings
from hermes_core.sandbox.docker import DockerBackend
sandbox = DockerBackend(SandboxSettings(run_name=sys.argv[1])).open("reaper-child", sys.argv[2])
print(sandbox.container_id, flush=True)
time.sleep(600)
"""


def test_reaper_removes_containers_of_dead_owners_only(tmp_path, opened):
    backend = make_backend(tmp_path)
    alive = backend.open("reaper-alive", IMAGE)  # owned by this (live) test process
    opened.append(alive)
    child = subprocess.Popen([sys.executable, "-c", CHILD, backend.settings.run_name, IMAGE], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        orphan_id = child.stdout.readline().strip()
        assert orphan_id, child.stderr.read()
    finally:
        child.kill()  # SIGKILL: no finally, no close() in the child
        child.wait()
    api = backend.client().api
    assert api.inspect_container(orphan_id)["State"]["Running"]  # containers outlive their orchestrator

    started = time.monotonic()
    assert DockerBackend(SandboxSettings()).reap() >= 1
    assert time.monotonic() - started < 30
    with pytest.raises(NotFound):
        api.inspect_container(orphan_id)
    assert api.inspect_container(alive.container_id)["State"]["Running"]
    assert alive.exec("echo kept").output.strip() == "kept"
