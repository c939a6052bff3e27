"""The modal backend under the contract, against the fake `modal` SDK (tests/fakes/modal), whose
sandboxes really run in bubblewrap with cgroup limits: Modal itself cannot be reached from here."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from hermes_core.sandbox import SandboxBackend, SandboxSettings

FAKES = Path(__file__).resolve().parents[1] / "fakes"
IMAGE = "hermes-test/bookworm:latest"  # the fake maps it to /var/cache/hermes-foundry/rootfs/bookworm


def fake_modal():
    """The fake SDK, imported as `modal` (it replaces a real one imported earlier in this process)."""
    if str(FAKES) not in sys.path:
        sys.path.insert(0, str(FAKES))
    loaded = sys.modules.get("modal")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(FAKES)):
        for name in [name for name in sys.modules if name == "modal" or name.startswith("modal.")]:
            del sys.modules[name]
    import modal

    return modal


def make_backend(tmp_path: Path, **settings) -> SandboxBackend:
    if os.geteuid() != 0 or shutil.which("bwrap") is None or shutil.which("nsenter") is None:
        pytest.skip("the fake modal needs root (cgroups, per-sandbox uids), bubblewrap and nsenter")
    modal = fake_modal()
    import fakebox

    if fakebox.rootfs_for(IMAGE) is None:
        pytest.skip(f"test image missing for {IMAGE} (scripts/test_images.sh builds it)")
    modal._cloud.configure(root=tmp_path / "modal-cloud", authenticated=True, offline=False)
    fakebox.note_stale_cgroups("modal", tmp_path / "modal-cloud")
    from hermes_core.sandbox.modal import ModalBackend

    # A short lifetime: sandboxes of a test run killed before its teardown do not linger for long.
    return ModalBackend(SandboxSettings(state_root=tmp_path / "state", **settings), lifetime_s=600)


def leftovers(tmp_path: Path) -> list[str]:
    modal = fake_modal()
    modal._cloud.configure(root=tmp_path / "modal-cloud")
    return modal._cloud.leftovers()
