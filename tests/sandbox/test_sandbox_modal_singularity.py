"""The modal and singularity backends beyond the contract: exact apptainer flags, pre-flight, reaping,
and the fake Modal SDK checked against the real one (pinned in the dev extras)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from contract_backends import modal as modal_contract
from contract_backends import singularity as singularity_contract
from hermes_core.sandbox import SandboxError, SandboxSettings
from hermes_core.sandbox.singularity import SingularityBackend, apptainer_argv, find_executable
from procs import processes_with

FAKE_APPTAINER = str(singularity_contract.FAKE_APPTAINER)
ROOT = Path(__file__).resolve().parents[2]


def _stub(folder: Path, name: str) -> str:
    path = folder / name
    path.write_text("#!/bin/sh\necho stub\n")
    path.chmod(0o755)
    return str(path)


# --- singularity ------------------------------------------------------------------------------


def test_apptainer_flags_follow_the_settings(tmp_path):
    work, scratch = tmp_path / "work", tmp_path / "scratch"
    head = ["apptainer", "exec", "--containall", "--cleanenv", "--no-home", "--pwd", "/app",
            "--bind", f"{work}:/app", "--workdir", str(scratch)]
    default = apptainer_argv("apptainer", "/img.sif", "/app", work, scratch, SandboxSettings(), "echo hi")
    assert default == head + ["--net", "--network", "none", "--memory", str(2048 * 1024 * 1024),
                              "--pids-limit", "512", "--cpus", "1", "/img.sif", "bash", "-c", "echo hi"]
    custom = SandboxSettings(network=True, memory_mb=256, pids=64, cpus=0.5)
    assert apptainer_argv("apptainer", "/img.sif", "/app", work, scratch, custom, "ls") == head + [
        "--memory", str(256 * 1024 * 1024), "--pids-limit", "64", "--cpus", "0.5", "/img.sif", "bash", "-c", "ls"]


def test_a_session_runs_its_commands_with_those_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_APPTAINER", FAKE_APPTAINER)
    monkeypatch.setenv("HERMES_TEST_SECRET", "s3cr3t")
    image = tmp_path / "image.sif"
    image.write_bytes(b"SIF")
    backend = SingularityBackend(SandboxSettings(state_root=tmp_path / "state", image_root=tmp_path, pids=99))
    with backend.open("s1", "image.sif", "/srv/app") as sandbox:  # resolved in the image root
        argv = sandbox._argv("true")
        assert argv[:2] == [FAKE_APPTAINER, "exec"] and argv[-4:] == [str(image), "bash", "-c", "true"]
        assert f"{sandbox.workdir}:/srv/app" in argv and argv[argv.index("--pids-limit") + 1] == "99"
        assert sandbox.cwd == "/srv/app" and sandbox.workdir.is_relative_to(tmp_path / "state")
        assert "s3cr3t" not in sandbox.env.values()  # the host's environment stays out
        assert sandbox.env["APPTAINERENV_TERM"] == "dumb"
    assert list((tmp_path / "state").iterdir()) == []


def test_the_executable_is_configurable_and_found_on_path(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("HERMES_APPTAINER", raising=False)
    assert find_executable() is None
    singularity = _stub(bin_dir, "singularity")
    assert find_executable() == singularity
    apptainer = _stub(bin_dir, "apptainer")
    assert find_executable() == apptainer  # apptainer is preferred
    monkeypatch.setenv("HERMES_APPTAINER", str(tmp_path / "missing"))
    assert find_executable() is None


def test_singularity_preflight_reports_every_problem_together(tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_APPTAINER", str(tmp_path / "no-such-apptainer"))
    present = tmp_path / "present.sif"
    present.write_bytes(b"SIF")
    images = {str(present), str(tmp_path / "missing.sif"), "docker://python:3.12-slim", "ftp://x/y"}
    problems = SingularityBackend(SandboxSettings(state_root=tmp_path, image_root=tmp_path)).preflight(images)
    assert len(problems) == 4, problems
    text = "\n".join(problems)
    assert "no-such-apptainer" in text and "missing.sif" in text and "unsupported scheme" in text
    assert "pulling is not allowed" in text and "present.sif" not in text

    monkeypatch.setenv("HERMES_APPTAINER", FAKE_APPTAINER)
    allowed = SingularityBackend(SandboxSettings(state_root=tmp_path, image_root=tmp_path, allow_pull=True))
    assert allowed.preflight({str(present), "present.sif", "docker://python:3.12-slim"}) == []
    with pytest.raises(SandboxError, match="needs an image"):
        allowed.open("s", None)
    with pytest.raises(SandboxError, match="missing.sif"):
        allowed.open("s", str(tmp_path / "missing.sif"))


def test_the_fake_apptainer_refuses_what_it_does_not_model():
    done = subprocess.run([FAKE_APPTAINER, "exec", "--containall", "--fakeroot", "/image", "true"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 255 and "unknown flag '--fakeroot'" in done.stderr


def _needs_fakes(contract, tmp_path, **settings):
    return contract.make_backend(tmp_path, **settings)  # skips where bwrap/root/the test image are missing


def _orphan(code: str, env: dict[str, str]) -> str:
    """Run `code` in a process that then dies without closing anything; returns its output."""
    script = f"import os, sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n{textwrap.dedent(code)}\nos._exit(0)\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env}, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_singularity_reaps_sessions_of_dead_owners_and_their_processes(tmp_path):
    backend = _needs_fakes(singularity_contract, tmp_path)
    tag = f"{4000 + uuid.uuid4().int % 5000}.{uuid.uuid4().int % 1000:03d}"
    _orphan(f"""
        from contract_backends import singularity
        from pathlib import Path
        sandbox = singularity.make_backend(Path({str(tmp_path)!r})).open("orphan", singularity.IMAGE)
        sandbox.spawn("sleep {tag}")
        import time; time.sleep(0.5)
    """, {"HERMES_APPTAINER": FAKE_APPTAINER})
    assert processes_with(f"sleep {tag}")
    with backend.open("mine", singularity_contract.IMAGE) as mine:
        assert backend.reap() == 1
        assert mine.state_dir.is_dir() and mine.exec("echo alive").output.strip() == "alive"
        time.sleep(0.3)
        assert not processes_with(f"sleep {tag}")
    assert singularity_contract.leftovers(tmp_path) == []


def test_singularity_files_outside_the_workdir(tmp_path):
    backend = _needs_fakes(singularity_contract, tmp_path)
    with backend.open("files", singularity_contract.IMAGE, "/app") as sandbox:
        assert b"bookworm" in sandbox.read_file("/etc/os-release")  # read through the container
        with pytest.raises(FileNotFoundError):
            sandbox.read_file("/etc/no-such-file")
        with pytest.raises(SandboxError, match="read-only"):
            sandbox.write_file("/etc/motd", b"x")
        assert sandbox.write_file("sub/a.txt", b"hi") == "/app/sub/a.txt"
        secret = tmp_path / "host-secret.txt"
        secret.write_text("TOP-SECRET")
        sandbox.exec(f"ln -s {secret} link && ln -s /etc/os-release release")
        with pytest.raises(FileNotFoundError):
            sandbox.read_file("link")  # followed inside the container, where the host's files do not exist
        with pytest.raises(SandboxError, match="read-only"):
            sandbox.write_file("link", b"overwritten")
        assert secret.read_text() == "TOP-SECRET"
        assert b"bookworm" in sandbox.read_file("release")




# --- modal ------------------------------------------------------------------------------------


@pytest.fixture()
def fake_modal(tmp_path):
    modal = modal_contract.fake_modal()
    modal._cloud.configure(root=tmp_path / "cloud", authenticated=True, offline=False)
    yield modal
    modal._cloud.configure(authenticated=True, offline=False)
    modal._cloud.config.offline_delay_s = 58.0


def test_modal_preflight_reports_missing_credentials(fake_modal, tmp_path):
    from hermes_core.sandbox.modal import ModalBackend

    fake_modal._cloud.configure(authenticated=False)
    started = time.monotonic()
    problems = ModalBackend(SandboxSettings(state_root=tmp_path)).preflight({"python:3.12-slim"})
    assert len(problems) == 1 and "not authenticated" in problems[0] and "modal token new" in problems[0]
    assert time.monotonic() - started < 5


def test_modal_preflight_has_its_own_deadline(fake_modal, tmp_path):
    from hermes_core.sandbox.modal import ModalBackend

    fake_modal._cloud.configure(offline=True, offline_delay_s=30.0)  # like a token without network
    backend = ModalBackend(SandboxSettings(state_root=tmp_path), preflight_timeout_s=1.0)
    started = time.monotonic()
    assert backend.reap() == 0  # nothing reachable to reap; remembered for the pre-flight
    problems = backend.preflight({"python:3.12-slim"})
    assert time.monotonic() - started < 3
    assert len(problems) == 1 and "no answer from Modal within 1 s" in problems[0]


def test_modal_without_the_sdk_or_an_image(monkeypatch, tmp_path):
    from hermes_core.sandbox.modal import ModalBackend

    monkeypatch.setitem(sys.modules, "modal", None)  # `import modal` now fails like a missing package
    backend = ModalBackend(SandboxSettings(state_root=tmp_path))
    assert backend.preflight({"python:3.12-slim"}) == ["the modal backend needs the Modal SDK: pip install modal"]
    with pytest.raises(SandboxError, match="pip install modal"):
        backend.open("s", "python:3.12-slim")
    with pytest.raises(SandboxError, match="needs an image"):
        backend.open("s", None)


def test_modal_sandboxes_get_the_settings_and_tags(tmp_path):
    backend = _needs_fakes(modal_contract, tmp_path, memory_mb=300, cpus=0.5, run_name="run-7")
    from modal import _cloud

    with backend.open("sess-1", modal_contract.IMAGE, "/app") as sandbox:
        record = _cloud.load(sandbox.sandbox.object_id)
        assert (record["memory_limit_mb"], record["cpu_limit"], record["block_network"]) == (300, 0.5, True)
        assert record["workdir"] == "/app" and record["timeout"] == backend.lifetime_s
        tags = record["tags"]
        assert tags["hermes-foundry.run"] == "run-7" and tags["hermes-foundry.session"] == "sess-1"
        assert tags["hermes-foundry.owner"].startswith(f"{os.getpid()}:")
    assert modal_contract.leftovers(tmp_path) == []


def test_modal_reaps_sandboxes_of_dead_owners(tmp_path):
    backend = _needs_fakes(modal_contract, tmp_path)
    from modal import _cloud

    orphan_id = _orphan(f"""
        from contract_backends import modal
        from pathlib import Path
        sandbox = modal.make_backend(Path({str(tmp_path)!r})).open("orphan", modal.IMAGE)
        print(sandbox.sandbox.object_id)
    """, {}).strip()
    assert _cloud.alive(_cloud.load(orphan_id))
    with backend.open("mine", modal_contract.IMAGE) as mine:
        assert backend.reap() == 1
        deadline = time.monotonic() + 10
        while _cloud.load(orphan_id) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _cloud.load(orphan_id) is None
        assert mine.exec("echo alive").output.strip() == "alive"
    assert modal_contract.leftovers(tmp_path) == []


REAL_SDK_PROBE = """
import inspect, json, sys
import modal, modal.exception
from modal.container_process import ContainerProcess
from modal.sandbox.sandbox import SandboxFilesystem
assert "site-packages" in modal.__file__, modal.__file__
calls = {
    "Sandbox.create": modal.Sandbox.create, "Sandbox.exec": modal.Sandbox.exec, "Sandbox.list": modal.Sandbox.list,
    "Sandbox.set_tags": modal.Sandbox.set_tags, "Sandbox.get_tags": modal.Sandbox.get_tags,
    "Sandbox.terminate": modal.Sandbox.terminate, "Sandbox.wait": modal.Sandbox.wait,
    "Sandbox.poll": modal.Sandbox.poll,
    "Sandbox.from_id": modal.Sandbox.from_id, "Image.from_registry": modal.Image.from_registry,
    "App.lookup": modal.App.lookup, "SandboxFilesystem.read_bytes": SandboxFilesystem.read_bytes,
    "SandboxFilesystem.write_bytes": SandboxFilesystem.write_bytes, "ContainerProcess.poll": ContainerProcess.poll,
    "ContainerProcess.wait": ContainerProcess.wait,
}
out = {"version": modal.__version__, "calls": {}, "exceptions": {}}
for name, call in calls.items():
    out["calls"][name] = {p.name: p.kind.name for p in inspect.signature(call).parameters.values()}
for name in ("AuthError", "ConnectionError", "SandboxFilesystemNotFoundError", "SandboxFilesystemIsADirectoryError"):
    out["exceptions"][name] = [base.__name__ for base in getattr(modal.exception, name).__mro__]
def properties(owner, names):
    return [name for name in names if isinstance(getattr(owner, name), property)]
out["properties"] = properties(modal.Sandbox, ("filesystem", "object_id"))
out["process_properties"] = properties(ContainerProcess, ("stdout", "stderr", "returncode"))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def real_sdk():
    """Signatures of the REAL modal SDK, read in a separate interpreter (the fake never shadows it there)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-I", "-c", REAL_SDK_PROBE], capture_output=True, text=True, env=env,
                          cwd="/", timeout=120)
    if "No module named 'modal'" in done.stderr:
        pytest.fail("the real modal SDK is not installed: pip install modal (pinned in the dev extras)")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_real_modal_sdk_still_has_what_the_backend_calls(real_sdk):
    calls = real_sdk["calls"]
    create = calls["Sandbox.create"]
    for name in ("app", "image", "timeout", "workdir", "cpu", "memory", "block_network", "tags"):
        assert create.get(name) == "KEYWORD_ONLY", f"Sandbox.create lost {name}: {create}"
    assert calls["Sandbox.exec"]["args"] == "VAR_POSITIONAL"
    assert {"timeout", "env", "text"} <= set(calls["Sandbox.exec"])
    assert {"app_id", "tags"} <= set(calls["Sandbox.list"]) and "tags" in calls["Sandbox.set_tags"]
    assert "wait" in calls["Sandbox.terminate"] and "create_if_missing" in calls["App.lookup"]
    assert list(calls["Image.from_registry"])[0] == "tag"
    assert list(calls["SandboxFilesystem.read_bytes"]) == ["self", "remote_path"]
    assert list(calls["SandboxFilesystem.write_bytes"]) == ["self", "data", "remote_path"]
    assert real_sdk["properties"] == ["filesystem", "object_id"]
    assert real_sdk["process_properties"] == ["stdout", "stderr", "returncode"]
    assert "Error" in real_sdk["exceptions"]["AuthError"] and "Error" in real_sdk["exceptions"]["ConnectionError"]
    assert "SandboxFilesystemError" in real_sdk["exceptions"]["SandboxFilesystemNotFoundError"]


def test_the_fake_modal_sdk_is_a_subset_of_the_real_one(real_sdk):
    """Every parameter the fake accepts exists in the real SDK with the same kind, so tests passing
    against the fake cannot rely on an argument the real SDK would reject."""
    import inspect

    fake = modal_contract.fake_modal()
    from modal.sandbox import ContainerProcess, SandboxFilesystem

    owners = {"Sandbox": fake.Sandbox, "Image": fake.Image, "App": fake.App, "SandboxFilesystem": SandboxFilesystem,
              "ContainerProcess": ContainerProcess}
    for name, real_parameters in real_sdk["calls"].items():
        owner, method = name.split(".")
        fake_parameters = inspect.signature(getattr(owners[owner], method)).parameters.values()
        for parameter in fake_parameters:
            if parameter.name != "self":
                assert real_parameters.get(parameter.name) == parameter.kind.name, f"{name}({parameter.name})"
