"""Backends under the sandbox contract suite (tests/sandbox/test_sandbox_contract.py).

Each module here is named after a backend and defines:

    IMAGE: str | None
        an image the backend can run in tests (None when the backend runs without one);
    def make_backend(tmp_path: Path, **settings) -> SandboxBackend
        a backend built with `SandboxSettings(state_root=tmp_path / "state", **settings)` (plus what
        it needs, e.g. a fake SDK); calls `pytest.skip(reason)` only where the component genuinely
        cannot exist on this machine;
    def leftovers(tmp_path: Path) -> list[str]   (optional)
        what of the backend's own resources (containers, cgroups, mounts, state folders) is still
        there after every sandbox made with that tmp_path was closed: must be [].
"""

BACKENDS = ["local", "docker", "modal", "singularity"]
