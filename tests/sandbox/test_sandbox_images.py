"""A dataset row names its sample's `image`: untrusted input that must never select a host folder.

Issue 17, item 2: `image: ".."` made the local backend run a sample on the parent of the image root
(the host's `/` when the root is a top-level folder), and the sample printed the host's files into
the training data. Every backend refuses `..`, `../..`, `/`, `a/../../..`, absolute paths and
names leading through a symlink out of the image root, at pre-flight and again when opening.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from contract_backends import modal as modal_contract
from contract_backends import singularity as singularity_contract
from hermes_core.sandbox import SandboxError, SandboxSettings
from hermes_core.sandbox.bubblewrap import BubblewrapBackend
from hermes_core.sandbox.docker import DockerBackend
from hermes_core.sandbox.images import confine, image_label, reference_problem
from hermes_core.sandbox.local import PlainBackend
from hermes_core.sandbox.singularity import SingularityBackend
from rootfs import tiny_rootfs

ESCAPES = ["..", "../..", "/", "a/../../..", ".", "/etc", "/var/cache/hermes-foundry/rootfs/bookworm", "~root",
           "images/../..", "a/./b", "a\x00b"]
VALID = ["python", "python:3.12-slim", "hermes-test/bookworm:latest", "localhost:5000/team/app:v1.2",
         "registry.example.com/a/b/c", "ghcr.io/org/img@sha256:" + "a" * 64, "img:tag@sha256:" + "0f" * 32,
         "a__b", "a-----b", "a.b_c", "[::1]:5000/x", "Example.COM/lower"]
INVALID = ["", "Python", "a:", ":tag", "a//b", "a/", "-a", "a-", "a..b", "a:-tag", "a@sha256:abc", "a b", "a\n",
           "a:" + "t" * 129, "a/" * 200 + "a", "a@sha256:" + "g" * 64]


@pytest.fixture
def canary() -> str:
    return f"CANARY-{uuid.uuid4().hex}"


@pytest.fixture
def outer(tmp_path: Path, canary: str) -> Path:
    """A root filesystem holding the canary, with the image root inside it: `..` from the image root
    is this rootfs, as `..` from a top-level image root is the host's `/`."""
    rootfs = tiny_rootfs(tmp_path, "outer")
    (rootfs / "canary.txt").write_text(canary + "\n")
    images = rootfs / "images"
    images.mkdir()
    tiny_rootfs(images, "tiny_v1")
    (images / "alias_1").symlink_to("tiny_v1")  # a link that stays inside the root: fine
    (images / "escape_1").symlink_to(rootfs)  # a link leading out of the root: refused
    (images / "up_1").symlink_to("..")
    (images / "self_1").symlink_to(".")
    return rootfs


# --- the shared validator ----------------------------------------------------------------------


@pytest.mark.parametrize("image", VALID)
def test_image_references_follow_dockers_grammar(image: str) -> None:
    assert reference_problem(image) is None


@pytest.mark.parametrize("image", ESCAPES + INVALID)
def test_paths_and_malformed_references_are_not_references(image: str) -> None:
    problem = reference_problem(image)
    assert problem is not None and "reference" in problem


def test_confine_resolves_links_and_refuses_what_lands_outside(outer: Path) -> None:
    images = outer / "images"
    assert confine(images, "tiny_v1") == ((images / "tiny_v1").resolve(), None)
    assert confine(images, "alias_1") == ((images / "tiny_v1").resolve(), None)
    assert confine(images, str(images / "tiny_v1"))[0] == (images / "tiny_v1").resolve()  # absolute, inside
    for name in ["..", "../..", "/", "a/../../..", ".", "/etc", "escape_1", "up_1", "self_1", "escape_1/images",
                 "a\x00b", ""]:
        path, problem = confine(images, name)
        assert path is None and "image root" in problem, name


def test_problems_name_the_dataset_lines_when_given() -> None:
    assert image_label("..") == "image '..'"
    assert image_label("..", {"..": [7, 3]}) == "image '..' (dataset lines 3, 7)"
    assert image_label("x", {"x": [2]}) == "image 'x' (dataset line 2)"
    assert image_label("x", {"x": range(1, 20)}).endswith("(dataset lines 1, 2, 3, 4, 5 and 14 more)")
    assert image_label("x", {"x"}) == "image 'x'"


# --- local (bubblewrap): the reproduction -----------------------------------------------------


def test_local_never_runs_a_sample_outside_the_image_root(tmp_path: Path, outer: Path, canary: str) -> None:
    settings = SandboxSettings(state_root=tmp_path / "state", image_root=outer / "images")
    with BubblewrapBackend(settings) as backend:
        bad = ESCAPES + ["escape:1", "up:1", "self:1"]
        problems = backend.preflight(set(bad))
        assert len(problems) == len(bad), problems
        for image in bad:
            assert any(problem.startswith(f"image {image!r}:") for problem in problems), image
        for image in bad:
            try:
                sandbox = backend.open("escape", image=image)
            except SandboxError as exc:
                assert repr(image) in str(exc)
                continue
            with sandbox:  # the bug: the sample runs on the host's folders
                leaked = sandbox.exec("cat /canary.txt").output
            pytest.fail(f"image {image!r} was opened; it printed {leaked!r}")
        assert backend.preflight({"tiny:v1", "alias:1"}) == []
        for image in ("tiny:v1", "alias:1"):
            with backend.open("ok", image=image) as sandbox:
                out = sandbox.exec("cat /etc/marker; cat /canary.txt").output
                assert out.startswith("tiny\n") and canary not in out


# --- plain, docker, modal, singularity ---------------------------------------------------------


def test_plain_refuses_every_image(tmp_path: Path) -> None:
    backend = PlainBackend(SandboxSettings(state_root=tmp_path))
    assert len(backend.preflight(set(ESCAPES))) == len(ESCAPES)
    for image in ("..", "/"):
        with pytest.raises(SandboxError, match="has no images"):
            backend.open("s", image=image)


def test_docker_checks_references_before_any_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # no engine: nothing may need one
    backend = DockerBackend(SandboxSettings())
    for image in ESCAPES + INVALID:
        assert backend.image_problem(image) is not None, image
        with pytest.raises(SandboxError, match="not an image reference" if image else "needs an image"):
            backend.open("s", image=image)
    for image in VALID:
        assert backend.image_problem(image) is None, image
    problems = backend.preflight({"..", "/etc", "python:3.12"})
    assert [p for p in problems if "not an image reference" in p] == [
        "image '..': " + reference_problem(".."), "image '/etc': " + reference_problem("/etc")]
    assert len(problems) == 3 and "nonexistent" in problems[2]  # the engine's problem, once
    assert backend.preflight({"..": [4]})[0].startswith("image '..' (dataset line 4): not an image reference")


def test_modal_checks_references(tmp_path: Path) -> None:
    from hermes_core.sandbox.modal import ModalBackend

    unconnected = ModalBackend(SandboxSettings(state_root=tmp_path))
    for image in ESCAPES + INVALID:
        assert unconnected.image_problem(image) is not None, image
    assert all(unconnected.image_problem(image) is None for image in VALID)
    backend = modal_contract.make_backend(tmp_path)  # the fake SDK: real sandboxes in bubblewrap
    problems = backend.preflight(set(ESCAPES) | {modal_contract.IMAGE})
    assert len(problems) == len(ESCAPES) and all("not an image reference" in p for p in problems), problems
    for image in ("..", "/var/cache/hermes-foundry/rootfs/bookworm"):
        with pytest.raises(SandboxError, match="not an image reference"):
            backend.open("s", image=image)


def test_singularity_confines_image_paths_to_the_image_root(tmp_path: Path, outer: Path, canary: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_APPTAINER", singularity_contract.FAKE_APPTAINER.as_posix())
    images = outer / "images"
    (images / "app.sif").write_bytes(b"SIF")
    (images / "escape.sif").symlink_to(tmp_path / "host.sif")
    (tmp_path / "host.sif").write_bytes(b"SIF")
    backend = SingularityBackend(SandboxSettings(state_root=tmp_path / "state", image_root=images))
    bad = ESCAPES + ["escape_1", "up_1", "self_1", "escape.sif", str(tmp_path / "host.sif"), str(outer),
                     "docker-archive:../x.tar", "oci-archive:/etc/passwd", "docker://..", "docker:///etc",
                     "library://../x", "oras://Up/per"]
    for image in bad:
        assert backend.image_problem(image) is not None, image
        with pytest.raises(SandboxError):
            backend.open("s", image=image)
    for image in ("tiny_v1", "alias_1", "app.sif", str(images / "tiny_v1"), "sub/../tiny_v1"):
        assert backend.image_problem(image) is None, image
    problems = backend.preflight({"..": [2], "tiny_v1": [3], "escape_1": [5]})
    assert problems == [f"image '..' (dataset line 2): {backend.image_problem('..')}",
                        f"image 'escape_1' (dataset line 5): {backend.image_problem('escape_1')}"]
    assert "outside the image root" in problems[0] and "outside the image root" in problems[1]

    # Without an image root, no host path is accepted at all: only registry references (when pulls are allowed).
    unrooted = SingularityBackend(SandboxSettings(state_root=tmp_path / "state", allow_pull=True))
    for image in ("tiny_v1", str(images / "tiny_v1"), "..", "/", "docker-archive:x.tar"):
        assert "HERMES_SANDBOX_IMAGE_ROOT" in unrooted.image_problem(image), image
    assert unrooted.image_problem("docker://python:3.12-slim") is None

    if os.geteuid() != 0 or shutil.which("bwrap") is None:
        pytest.skip("the fake apptainer needs root (cgroups) and bubblewrap")
    cached = Path(singularity_contract.IMAGE)  # the debootstrapped rootfs: the fake runs `bash -c`
    if not (cached / "usr" / "bin" / "python3").exists():
        pytest.skip(f"test image missing: {cached} (scripts/test_images.sh builds it)")
    runs = SingularityBackend(SandboxSettings(state_root=tmp_path / "state", image_root=cached.parent))
    assert runs.image_problem(str(outer)) is not None and runs.image_problem("../..") is not None
    with runs.open("ok", image=cached.name) as sandbox:  # the resolved path is what apptainer runs
        assert sandbox.image == str(cached.resolve())
        assert "bookworm" in sandbox.exec("cat /etc/os-release").output
