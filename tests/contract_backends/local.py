"""The `local` backend (bubblewrap) under the sandbox contract, with the debootstrapped test rootfs."""

from __future__ import annotations

from pathlib import Path

from hermes_core.sandbox import SandboxSettings
from hermes_core.sandbox.bubblewrap import BubblewrapBackend, image_dir_name, session_leftovers

IMAGE = "hermes-test/bookworm:latest"
ROOTFS = Path("/var/cache/hermes-foundry/rootfs/bookworm")  # built by scripts/test_images.sh


def image_root(tmp_path: Path) -> Path:
    """A folder of prepared root filesystems holding the test image: the rootfs cache itself, where the
    image's folder is a relative link to the cached rootfs (a link leading out of an image root is refused)."""
    link = ROOTFS.parent / image_dir_name(IMAGE)
    try:
        if ROOTFS.is_dir() and not link.is_symlink():
            link.symlink_to(ROOTFS.name)
    except FileExistsError:
        pass  # made meanwhile by another test process
    except OSError:
        return tmp_path / "images"  # not ours to change: opening then fails with the pre-flight message
    return ROOTFS.parent if ROOTFS.is_dir() else tmp_path / "images"


def make_backend(tmp_path: Path, **settings) -> BubblewrapBackend:
    # No skips: bubblewrap and the rootfs can always be installed here; opening then fails with the
    # pre-flight message that says how.
    return BubblewrapBackend(SandboxSettings(state_root=tmp_path / "state", image_root=image_root(tmp_path), **settings))


def leftovers(tmp_path: Path) -> list[str]:
    return session_leftovers(tmp_path / "state")
