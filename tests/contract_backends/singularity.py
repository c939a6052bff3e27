"""The singularity backend under the contract, running the fake `apptainer` (tests/fakes/bin), which
really isolates with bubblewrap and cgroups: Apptainer itself cannot run on this machine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hermes_core.sandbox import SandboxBackend, SandboxSettings
from procs import process_folders

FAKES = Path(__file__).resolve().parents[1] / "fakes"
FAKE_APPTAINER = FAKES / "bin" / "apptainer"
IMAGE = "/var/cache/hermes-foundry/rootfs/bookworm"  # a root filesystem folder: an Apptainer "sandbox" image


def _fakebox():
    import sys

    if str(FAKES) not in sys.path:
        sys.path.insert(0, str(FAKES))
    import fakebox

    return fakebox


def make_backend(tmp_path: Path, **settings) -> SandboxBackend:
    if os.geteuid() != 0 or shutil.which("bwrap") is None:
        pytest.skip("the fake apptainer needs root (cgroups) and bubblewrap")
    if not Path(IMAGE, "usr", "bin", "python3").exists():
        pytest.skip(f"test image missing: {IMAGE} (scripts/test_images.sh builds it)")
    os.environ["HERMES_APPTAINER"] = str(FAKE_APPTAINER)
    _fakebox().note_stale_cgroups("apptainer", tmp_path)
    from hermes_core.sandbox.singularity import SingularityBackend

    # Image paths are accepted only beneath an image root: the rootfs cache holding IMAGE.
    settings.setdefault("image_root", Path(IMAGE).parent)
    return SingularityBackend(SandboxSettings(state_root=tmp_path / "state", **settings))


def leftovers(tmp_path: Path) -> list[str]:
    state_root = tmp_path / "state"
    found = [str(path) for path in sorted(state_root.glob("*"))] if state_root.is_dir() else []
    found += [f"cgroup {path}" for path in _fakebox().new_stale_cgroups("apptainer", tmp_path)]
    for cmdline in (folder / "cmdline" for folder in process_folders()):
        try:
            if str(state_root).encode() in cmdline.read_bytes():
                found.append(f"process {cmdline.parent.name}")
        except OSError:
            continue
    return found
