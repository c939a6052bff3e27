"""hermes-agent's TERMINAL_* settings work here as aliases of ours (issue 19 item 5)."""

from __future__ import annotations

import sys

import pytest

from hermes_core.sandbox import SandboxSettings, get_backend
from hermes_core.sandbox.terminal_env import ORIGINAL_DEFAULT_IMAGE

ALL = ("HERMES_TERMINAL_BACKEND", "TERMINAL_ENV", "TERMINAL_TIMEOUT", "TERMINAL_CONTAINER_CPU",
       "TERMINAL_CONTAINER_MEMORY", "TERMINAL_DOCKER_NETWORK", "TERMINAL_DOCKER_IMAGE", "TERMINAL_MODAL_IMAGE",
       "TERMINAL_SINGULARITY_IMAGE", "HERMES_SANDBOX_COMMAND_TIMEOUT_S", "HERMES_SANDBOX_DEFAULT_IMAGE")


@pytest.fixture()
def clean_env(monkeypatch, tmp_path):
    for name in ALL:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HERMES_SANDBOX_STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # nothing here may need an engine
    monkeypatch.setitem(sys.modules, "modal", None)
    return monkeypatch


def test_terminal_env_picks_the_backend_and_its_limits_apply(clean_env):
    clean_env.setenv("TERMINAL_ENV", "local")
    clean_env.setenv("TERMINAL_TIMEOUT", "1")
    backend = get_backend()
    assert backend.name == "local" and backend.isolated  # the original's local runs on the host; ours is bubblewrap
    with backend.open("terminal-env") as box:
        assert box.exec("echo hi").output.strip() == "hi"
        assert box.exec("sleep 30").timed_out  # TERMINAL_TIMEOUT=1
    clean_env.setenv("HERMES_TERMINAL_BACKEND", "plain")  # ours wins over the original's name
    assert get_backend().name == "plain"


def test_terminal_settings_are_read_and_ours_win(clean_env):
    clean_env.setenv("TERMINAL_TIMEOUT", "180")
    clean_env.setenv("TERMINAL_CONTAINER_CPU", "2")
    clean_env.setenv("TERMINAL_CONTAINER_MEMORY", "5120")
    clean_env.setenv("TERMINAL_DOCKER_NETWORK", "true")
    settings = SandboxSettings.from_env()
    assert (settings.command_timeout_s, settings.cpus, settings.memory_mb, settings.network) == (180, 2, 5120, True)
    clean_env.setenv("HERMES_SANDBOX_COMMAND_TIMEOUT_S", "30")
    assert SandboxSettings.from_env().command_timeout_s == 30
    clean_env.setenv("TERMINAL_CONTAINER_MEMORY", "lots")
    with pytest.raises(ValueError, match="TERMINAL_CONTAINER_MEMORY='lots'"):
        SandboxSettings.from_env()


def test_rows_without_an_image_get_the_originals_default_image(clean_env):
    assert get_backend("docker").settings.default_image == ORIGINAL_DEFAULT_IMAGE
    assert get_backend("modal").settings.default_image == ORIGINAL_DEFAULT_IMAGE
    assert get_backend("singularity").settings.default_image == f"docker://{ORIGINAL_DEFAULT_IMAGE}"
    assert get_backend("plain").settings.default_image is None  # runs no images
    clean_env.setenv("TERMINAL_DOCKER_IMAGE", "python:3.12-slim")
    clean_env.setenv("TERMINAL_SINGULARITY_IMAGE", "docker://python:3.12-slim")
    assert get_backend("docker").settings.default_image == "python:3.12-slim"
    assert get_backend("singularity").settings.default_image == "docker://python:3.12-slim"
    clean_env.setenv("HERMES_SANDBOX_DEFAULT_IMAGE", "ubuntu:24.04")  # ours wins
    assert get_backend("docker").settings.default_image == "ubuntu:24.04"
    # The modal backend without its SDK: the error is about the SDK, no longer "needs an image".
    from hermes_core.sandbox import SandboxError

    with pytest.raises(SandboxError, match="pip install modal"):
        get_backend("modal").open("s", None)


def test_a_batch_run_preflights_the_default_image_of_rows_without_one(clean_env, isolated_homes, sim_server, capsys):
    from batch_runs import prompts, run, write_dataset

    clean_env.setenv("TERMINAL_ENV", "singularity")
    clean_env.setenv("HERMES_APPTAINER", "/nonexistent/apptainer")
    dataset = write_dataset(isolated_homes / "d.jsonl", prompts(2, "default-image"))
    before = sim_server.log.requests
    assert run(dataset, sim_server.base_url) != 0
    err = capsys.readouterr().err
    assert f"image 'docker://{ORIGINAL_DEFAULT_IMAGE}' (dataset lines 1, 2)" in err and "Traceback" not in err
    assert sim_server.log.requests == before  # refused before any sample was sent


def test_backends_without_images_take_no_default(clean_env):
    clean_env.setenv("HERMES_SANDBOX_DEFAULT_IMAGE", "ubuntu:24.04")
    assert get_backend("local").settings.default_image is None
    assert get_backend("plain").settings.default_image is None
