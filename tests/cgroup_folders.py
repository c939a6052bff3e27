"""A cgroup folder of a test's own under each controller the sandboxes use, so that the limits a test
sets on its `hermes-foundry` parent are not the ones every other sandbox of the host shares."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from hermes_core.sandbox import cgroups
from hermes_core.sandbox.cgroups import Hierarchy


@contextmanager
def own_cgroup_folders(host: Hierarchy) -> Iterator[Hierarchy]:
    """`host`'s hierarchy one level down, in new folders; they and all under them are removed after."""
    name = f"hermes-test-{uuid.uuid4().hex[:8]}"
    mounts = {controller: mount / name for controller, mount in host.mounts.items()}
    for folder in mounts.values():
        folder.mkdir()
    if host.version == 2:  # the controllers must be enabled on the mount for the new level to use them
        cgroups._v2_parent(host.mounts[""])
    try:
        yield Hierarchy(host.version, mounts)
    finally:
        for folder in mounts.values():
            for cgroup in sorted((path for path in folder.rglob("*") if path.is_dir()),
                                 key=lambda path: -len(path.parts)):
                cgroup.rmdir()
            folder.rmdir()
