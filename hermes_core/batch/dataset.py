"""Input datasets (SPEC §1) and their samples keyed by content (SPEC §2)."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from json.encoder import encode_basestring  # type: ignore[attr-defined]  # json.dumps' own, in C
from typing import Any

from hermes_core.fileio import FileTableCache, json_loads

MAX_REPORTED_LINES = 20
KNOWN_KEYS = {"prompt", "image", "docker_image", "cwd", "id", "metadata"}


class DatasetError(ValueError):
    """The dataset cannot be used as it is; the message names the file and the lines."""


@dataclass(frozen=True)
class InvalidLine:
    line: int
    reason: str


@dataclass(frozen=True)
class Sample:
    sample_key: str
    prompt_index: int  # position among the valid rows of the dataset as loaded now
    line: int
    prompt: str
    image: str | None
    cwd: str | None
    occurrence: int
    id: Any = None
    metadata: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Dataset:
    path: Path
    sha256: str
    samples: list[Sample]
    invalid: list[InvalidLine]
    duplicates: int  # rows that repeat an earlier (prompt, image, cwd)


def _json_string(value: str | None) -> str:
    return "null" if value is None else encode_basestring(value)


def sample_key(prompt: str, image: str | None, cwd: str | None, occurrence: int, fingerprint: str) -> str:
    # json.dumps({"prompt", "image", "cwd", "occurrence"}, sort_keys=True, ensure_ascii=False,
    # separators=(",", ":")) spelled out: the same bytes at a third of the cost (tests compare them).
    identity = (f'{{"cwd":{_json_string(cwd)},"image":{_json_string(image)},"occurrence":{int(occurrence)},'
                f'"prompt":{_json_string(prompt)}}}')
    return hashlib.sha256((identity + fingerprint).encode("utf-8")).hexdigest()


def _check_row(text: str) -> tuple[dict[str, Any] | None, str | None]:
    try:
        row = json_loads(text)
    except ValueError as exc:
        return None, f"not valid JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(row, dict):
        return None, f"not a JSON object (got {type(row).__name__})"
    prompt = row.get("prompt")
    if "prompt" not in row:
        return None, "missing field 'prompt'"
    if not isinstance(prompt, str):
        return None, f"field 'prompt' must be a string (got {type(prompt).__name__})"
    if not prompt.strip():
        return None, "field 'prompt' is empty"
    for key in ("image", "docker_image", "cwd"):
        if row.get(key) is not None and not isinstance(row[key], str):
            return None, f"field '{key}' must be a string"
    if row.get("metadata") is not None and not isinstance(row["metadata"], dict):
        return None, "field 'metadata' must be a JSON object"
    return row, None


_loaded = FileTableCache(2)  # the CLI validates, then its plan step loads the same file again


def load_dataset(
    path: str | Path, fingerprint: str, *, skip_invalid: bool = False, max_samples: int | None = None
) -> Dataset:
    """Validate every line, then key the valid rows. Strict mode refuses any invalid line.
    The last result is reused while the file is unchanged (same inode, size and mtime)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: dataset file not found")
    return _loaded.get(path.resolve(), lambda: _load(path, fingerprint, skip_invalid, max_samples),
                       variant=(fingerprint, skip_invalid, max_samples))


def _load(path: Path, fingerprint: str, skip_invalid: bool, max_samples: int | None) -> Dataset:
    raw = path.read_bytes()
    rows: list[tuple[int, dict[str, Any]]] = []
    invalid: list[InvalidLine] = []
    for number, text in enumerate(raw.decode("utf-8", errors="replace").splitlines(), start=1):
        if not text.strip():
            continue
        row, reason = _check_row(text)
        if reason:
            invalid.append(InvalidLine(number, reason))
        else:
            rows.append((number, row))
    if invalid and not skip_invalid:
        shown = "\n".join(f"  line {bad.line}: {bad.reason}" for bad in invalid[:MAX_REPORTED_LINES])
        more = f"\n  ... and {len(invalid) - MAX_REPORTED_LINES} more" if len(invalid) > MAX_REPORTED_LINES else ""
        raise DatasetError(
            f"{path}: {len(invalid)} invalid line(s); nothing was run "
            f"(fix them or pass --skip-invalid):\n{shown}{more}"
        )
    if max_samples is not None:
        rows = rows[:max_samples]
    if not rows:
        raise DatasetError(f"{path}: the dataset has no valid rows")
    seen: Counter[tuple[str, str | None, str | None]] = Counter()
    samples = []
    for index, (number, row) in enumerate(rows):
        image = row.get("image") or row.get("docker_image")
        identity = (row["prompt"], image, row.get("cwd"))
        occurrence = seen[identity]
        seen[identity] += 1
        samples.append(
            Sample(
                sample_key=sample_key(row["prompt"], image, row.get("cwd"), occurrence, fingerprint),
                prompt_index=index,
                line=number,
                prompt=row["prompt"],
                image=image,
                cwd=row.get("cwd"),
                occurrence=occurrence,
                id=row.get("id"),
                metadata=row.get("metadata"),
                extra={k: v for k, v in row.items() if k not in KNOWN_KEYS},
            )
        )
    duplicates = sum(count - 1 for count in seen.values())
    return Dataset(path, hashlib.sha256(raw).hexdigest(), samples, invalid, duplicates)
