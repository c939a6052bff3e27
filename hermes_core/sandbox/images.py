"""Image names from dataset rows: untrusted input, checked by every backend before it uses one.

A row chooses its sample's `image`, so the name must never select anything the operator did not
offer. Two shapes are accepted, depending on the backend:

- an image reference in Docker's grammar (`reference_problem`), which names an image on an engine
  or a registry and can never denote a host path (`..`, `/`, `a/../..` are not references);
- a host path (the singularity backend's SIF files and folders), accepted only when it resolves,
  with every symlink followed, strictly beneath the configured image root (`confine`).

Backends report refusals through `image_problems`, one line per image naming the dataset lines
that use it when the caller knows them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, Collection, Mapping, Union

# Docker's reference grammar (github.com/distribution/reference, regexp.go): lowercase path
# components, an optional registry host (which may have upper case and a port), tag and digest.
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_HOST_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*"
_TAG = r"\w[\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?", re.ASCII)  # \w: ASCII, as in Go
NAME_MAX = 255  # Docker's limit on the name (registry and path)
_INPUT_MAX = 1024  # longer strings are refused before the regex sees them
REFERENCE_FORM = "[registry[:port]/]name[/name...][:tag][@sha256:digest]"
LINES_SHOWN = 5

# An image -> the dataset lines that name it, or just the images.
Images = Union[Mapping[str, Collection[int]], Collection[str]]


def reference_problem(image: str) -> str | None:
    """Why `image` is not an image reference in Docker's grammar (None when it is one)."""
    match = REFERENCE.fullmatch(image) if len(image) <= _INPUT_MAX else None
    if match is None:
        return (f"not an image reference; expected {REFERENCE_FORM} with lowercase name components "
                "(letters, digits and '.', '_', '__' or '-' between them), never a host path")
    if len(match["name"]) > NAME_MAX:
        return f"not an image reference: the name is longer than {NAME_MAX} characters"
    return None


def confine(root: Path, name: str) -> tuple[Path | None, str | None]:
    """(`name` resolved beneath `root`, None), or (None, why not). `name` is relative to the root or
    absolute; every symlink is followed (realpath), the root's own included, and the result must lie
    strictly beneath the resolved root: `..`, `/`, a link inside the root leading out of it, and the
    root itself are refused."""
    if not name or "\0" in name:
        return None, "not a path inside the image root"
    base = Path(os.path.realpath(root))
    target = Path(os.path.realpath(base / name))
    if target == base or not target.is_relative_to(base):
        # The resolved target stays out of the message: it may describe the host's layout.
        return None, f"resolves outside the image root {base} (images must lie inside it, links included)"
    return target, None


def image_label(image: str, images: Images | None = None) -> str:
    """"image 'x'", followed by the dataset lines naming it when `images` maps images to lines."""
    lines = sorted(images.get(image, ())) if isinstance(images, Mapping) else []
    if not lines:
        return f"image {image!r}"
    shown = ", ".join(map(str, lines[:LINES_SHOWN]))
    more = f" and {len(lines) - LINES_SHOWN} more" if len(lines) > LINES_SHOWN else ""
    return f"image {image!r} (dataset line{'s' if len(lines) > 1 else ''} {shown}{more})"


def image_problems(images: Images, problem: Callable[[str], str | None]) -> list[str]:
    """"image 'x' (dataset line N): why" for every image `problem` refuses, in a stable order."""
    return [f"{image_label(image, images)}: {why}" for image in sorted(images, key=str) if (why := problem(image))]
