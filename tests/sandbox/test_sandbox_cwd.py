"""A row's `cwd` is untrusted: every backend normalises it the one way (hermes_core/sandbox/cwd.py),
so `//proc` is /proc before any check (issue 28: posixpath.normpath keeps two leading slashes, and
`//proc`, `//etc` passed the reserved-folder checks)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from contract_backends import BACKENDS
from hermes_core.sandbox import SandboxBackend, SandboxError, SandboxSettings
from hermes_core.sandbox.local import PlainBackend

# The root and the kernel's folders, spelled as rows may spell them.
NEVER = ["//proc", "/./proc/..//proc", "//dev/shm", "///sys/kernel", "//", "src/../../"]


def _backend(name: str, tmp_path: Path) -> tuple[SandboxBackend, str | None, object]:
    """(backend, the image it runs, its contract module or None)."""
    if name == "plain":
        return PlainBackend(SandboxSettings(state_root=tmp_path / "state")), None, None
    contract = importlib.import_module(f"contract_backends.{name}")
    return contract.make_backend(tmp_path), contract.IMAGE, contract


@pytest.mark.parametrize("name", [*BACKENDS, "plain"])
def test_every_backend_refuses_the_root_and_kernel_folders_however_spelled(name: str, tmp_path: Path) -> None:
    backend, image, contract = _backend(name, tmp_path)
    try:
        for cwd in NEVER:
            with pytest.raises(SandboxError) as refused:
                backend.open("cwd", image, cwd).close()
            assert str(refused.value).startswith(f"cwd {cwd!r} is ")
            assert "the kernel's own folder" in str(refused.value) or "is the root folder (that is /)" in str(refused.value)
    finally:
        backend.close()
    assert getattr(contract, "leftovers", lambda path: [])(tmp_path) == []


def test_the_local_backend_without_an_image_refuses_host_system_folders_however_spelled(tmp_path: Path) -> None:
    backend, _, contract = _backend("local", tmp_path)
    try:
        for cwd, top in [("//etc", "/etc"), ("///usr", "/usr"), ("//usr/src/app", "/usr"), ("/opt/../etc//x", "/etc")]:
            with pytest.raises(SandboxError, match=f"^cwd '{cwd}' is inside the host's read-only {top} "):
                backend.open("cwd", None, cwd).close()
    finally:
        backend.close()
    assert contract.leftovers(tmp_path) == []


@pytest.mark.parametrize("name", ["local", "docker"])
def test_a_cwd_spelled_with_extra_slashes_is_the_folder_it_names(name: str, tmp_path: Path) -> None:
    backend, image, _ = _backend(name, tmp_path)
    image = image if name == "docker" else None  # local: the host's own folders, checked against //etc above
    try:
        with backend.open("cwd", image, "//srv//app/.") as box:
            assert box.cwd == "/srv/app" and box.exec("pwd").output.strip() == "/srv/app"
    finally:
        backend.close()
