"""`modal.Image` of the fake SDK: registry images are lazy references, mapped to test root filesystems
(tests/fakes/fakebox.py) when a sandbox starts."""

from __future__ import annotations

from pathlib import Path


class Image:
    def __init__(self, tag: str) -> None:
        self.tag = tag

    @staticmethod
    def from_registry(tag: str, secret: object = None, *, add_python: str | None = None) -> "Image":
        return Image(tag)  # like the real SDK: nothing is checked until the image is built

    def _rootfs(self) -> Path | None:
        import fakebox

        return fakebox.rootfs_for(self.tag)
