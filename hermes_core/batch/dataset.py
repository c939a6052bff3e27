"""Input datasets (SPEC §1) and their samples keyed by content (SPEC §2)."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from json.encoder import encode_basestring  # type: ignore[attr-defined]  # json.dumps' own, in C
from typing import Any

from hermes_core.fileio import FileTableCache, json_loads
from hermes_core.sandbox.cwd import cwd_problem

MAX_REPORTED_LINES = 20
KNOWN_KEYS = {"prompt", "image", "docker_image", "cwd", "id", "metadata"}
# A \ud800-\udfff escape: only these can make a lone surrogate, which no UTF-8 file can store.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


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

    @classmethod
    def of(cls, **fields: Any) -> Sample:
        """A Sample from every one of its fields, at a fifth of the frozen constructor's cost (which sets
        each field through object.__setattr__): a 100k-row dataset makes 100k of them."""
        sample = object.__new__(cls)
        sample.__dict__.update(fields)
        return sample


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


def numbered_lines(raw: bytes) -> Iterator[tuple[int, str, str | None]]:
    """(line number, text, why its bytes are unusable or None) of each line. Records end at a line
    feed only: str.splitlines() would also break on U+2028, U+0085 ..., which JSON strings may hold
    raw. A trailing carriage return goes. Bytes that are not UTF-8 are reported by line, never
    replaced by U+FFFD."""
    try:
        text, damaged = raw.decode("utf-8"), False
    except UnicodeDecodeError:  # keep each bad byte as a lone surrogate (U+DC80-U+DCFF) to find it again
        text, damaged = raw.decode("utf-8", errors="surrogateescape"), True
    text = text.removeprefix("\ufeff")  # a byte order mark, as some Windows editors save UTF-8
    for number, line in enumerate(text.split("\n"), start=1):
        line = line[:-1] if line.endswith("\r") else line
        yield number, line, _undecodable(line) if damaged else None


def _undecodable(line: str) -> str | None:
    """Why a line decoded with surrogateescape is not UTF-8, or None when it is."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"not valid UTF-8 (byte 0x{ord(line[exc.start]) & 0xFF:02x} at column {exc.start + 1})"
    return None


def _has_lone_surrogate(text: str, row: Any) -> bool:
    """Whether the parsed row holds a string no UTF-8 output can encode (a high or low surrogate
    escape without its pair); only rows whose text has such an escape are re-encoded to find out."""
    if not _SURROGATE_ESCAPE.search(text):
        return False
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_row(text: str) -> tuple[dict[str, Any] | None, str | None]:
    try:
        row = json_loads(text)
    except ValueError as exc:
        return None, f"not valid JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(row, dict):
        return None, f"not a JSON object (got {type(row).__name__})"
    if _has_lone_surrogate(text, row):
        return None, "holds a lone surrogate (a \\ud800-\\udfff escape without its pair): not valid Unicode"
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
    # Without an image, the default backend's system folders are the host's, read-only.
    cwd, imageless = row.get("cwd"), not (row.get("image") or row.get("docker_image"))
    if cwd is not None and (problem := cwd_problem(cwd, host_system=imageless)):
        return None, f"field 'cwd' {cwd!r} {problem}"
    return row, None


_loaded = FileTableCache(2)  # the CLI validates, then its plan step loads the same file again


def _unreadable(path: Path, exc: OSError) -> DatasetError:
    return DatasetError(f"{path}: cannot read the dataset file: {exc.strerror or exc}")


def dataset_path(path: str | Path) -> Path:
    """`path` resolved, once it names a regular file; else a DatasetError naming it and why (a FIFO
    would block the read forever; a directory, device or broken link is no dataset)."""
    path = Path(path)
    try:
        if not path.exists():  # False for a looping link too (ELOOP), so resolve() below cannot raise
            why = "a broken or looping symbolic link" if path.is_symlink() else "no such file"
            raise DatasetError(f"{path}: dataset file not found ({why})")
        if path.is_dir():
            raise DatasetError(f"{path}: is a directory, not a dataset file")
        if not path.is_file():
            raise DatasetError(f"{path}: not a regular file (a FIFO, socket or device is no dataset file)")
        return path.resolve()
    except OSError as exc:  # e.g. a folder on the way that this user may not search
        raise _unreadable(path, exc) from exc


def load_dataset(
    path: str | Path, fingerprint: str, *, skip_invalid: bool = False, max_samples: int | None = None
) -> Dataset:
    """Validate every line, then key the valid rows. Strict mode refuses any invalid line.
    The last result is reused while the file is unchanged (same inode, size and mtime)."""
    path = Path(path)
    resolved = dataset_path(path)
    try:
        return _loaded.get(resolved, lambda: _load(path, fingerprint, skip_invalid, max_samples),
                           variant=(fingerprint, skip_invalid, max_samples))
    except OSError as exc:
        raise _unreadable(path, exc) from exc


def _load(path: Path, fingerprint: str, skip_invalid: bool, max_samples: int | None) -> Dataset:
    raw = path.read_bytes()
    rows: list[tuple[int, dict[str, Any]]] = []
    invalid: list[InvalidLine] = []
    for number, text, undecodable in numbered_lines(raw):
        if undecodable:
            invalid.append(InvalidLine(number, undecodable))
            continue
        if not text.strip():
            continue
        row, reason = check_row(text)
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
            Sample.of(
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
