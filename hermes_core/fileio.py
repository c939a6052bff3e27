"""Crash-safe file writing: final files appear whole or not at all; appended records are durable."""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import logging
import os
import tempfile
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, NamedTuple, TypeVar

import orjson

T = TypeVar("T")


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON. orjson is 5-10x faster than json, which is what the hot paths (model
    calls, ledger records, 100k-line tables) need; json covers what orjson refuses (ints beyond 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def json_loads(text: str | bytes) -> Any:
    """Parse JSON fast; json's parser (and its error messages) for what orjson refuses."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


@contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """A handle on a temp file in the same folder; on success it is fsync'd and renamed over `path`,
    so readers never see half a file; on error it is removed and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would make every output private to this user
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in FULL and exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from None  # say which file did not fit
        raise
    fsync_path(path.parent)


FULL = (errno.ENOSPC, errno.EDQUOT)  # a write that did not fit: the disk, or the user's quota


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`. A file's write comes back short when the disk or a quota fills
    up, and the write after it says which (ENOSPC, EDQUOT): that error is what this raises."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if not written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def _umask() -> int:
    """This process's umask, read without setting it (os.umask would change it for every thread)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def atomic_write_text(path: str | Path, text: str | bytes) -> Path:
    with atomic_file(path) as handle:
        handle.write(text.encode("utf-8") if isinstance(text, str) else text)
    return Path(path)


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def atomic_write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Stream `rows` into `path` atomically (they may come from a generator); returns how many."""
    count = 0
    with atomic_file(path) as handle:
        for row in rows:
            handle.write(json_bytes(row) + b"\n")
            count += 1
    return count


def append_record(path: str | Path, record: dict[str, Any]) -> tuple[int, int, int]:
    """Append one record durably (`append_records`); returns the file's inode, the record's offset
    and its length."""
    inode, offset, (length,) = append_records(path, [record])
    return inode, offset, length


def append_records(path: str | Path, records: list[dict[str, Any]]) -> tuple[int, int, list[int]]:
    """Append records in one write and fsync them (once this returns, a crash cannot lose them), after
    cutting off a torn last line (a crash mid-write) that they would otherwise be glued to, making both
    unreadable. Appenders of a file take turns (an flock), so a last line without its newline is a dead
    writer's, never a write in progress. Returns the file's inode, the first record's offset and each
    record's length."""
    lines = [json_bytes(record) + b"\n" for record in records]
    data = b"".join(lines)
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except FileNotFoundError:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for the length of one append
        info = os.fstat(fd)
        size = info.st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            keep = _end_of_last_line(fd, size)
            os.ftruncate(fd, keep)
            os.fsync(fd)
            report_damage(f"{path}: cut off a torn last line ({size - keep} bytes at byte {keep}, a crash "
                          "mid-write) before appending")
            size = keep
        try:
            write_all(fd, data)
            os.fsync(fd)
        except OSError as exc:  # a full disk, a quota: take back what part of the records got in
            os.ftruncate(fd, size)
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        return info.st_ino, size, [len(line) for line in lines]
    finally:
        os.close(fd)


def _end_of_last_line(fd: int, size: int, chunk: int = 1 << 16) -> int:
    """The offset just past the last newline of the first `size` bytes of `fd` (0 if there is none)."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        found = os.pread(fd, end - start, start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0


log = logging.getLogger(__name__)
_reported: set[str] = set()


def report_damage(message: str) -> None:
    """Say once per process that a file holds a damaged record (readers meet it on every refresh)."""
    if message not in _reported:
        _reported.add(message)
        log.warning("warning: %s", message)


class Line(NamedTuple):
    """A record of a JSONL file: its line number, where it starts, its bytes (no newline), the object."""

    number: int
    offset: int
    raw: bytes
    record: dict[str, Any]


def jsonl_records(data: bytes, source: str | Path, offset: int = 0, first_line: int = 1,
                  required: tuple[str, ...] = ()) -> Iterator[Line]:
    """Each record in `data`, the bytes of `source` from byte `offset` on (line `first_line`).

    A record ends with a newline: bytes after the last one are a torn last line (a crash mid-write),
    reported with its offset and skipped. A line that is not a JSON object with the `required` keys
    (say a record appended onto such a fragment) is reported with its line number and skipped: a
    damaged record costs that record, never the run. Blank lines are skipped."""
    lines = data.split(b"\n")
    if torn := lines.pop():  # what follows the last newline
        report_damage(f"{source}: torn last line at byte {offset + len(data) - len(torn)} ({len(torn)} bytes, "
                      "a crash mid-write?), skipped")
    start = offset
    for number, raw in enumerate(lines, start=first_line):
        if raw.strip():
            try:
                value = json_loads(raw)
            except ValueError as exc:
                value = exc
            missing = [key for key in required if key not in value] if isinstance(value, dict) else None
            if missing == []:
                yield Line(number, start, raw, value)
            else:
                reason = (str(value)[:120] if isinstance(value, ValueError) else
                          f"no {missing[0]!r}" if missing else f"a JSON {type(value).__name__}")
                report_damage(f"{source}: line {number} (byte {start}) is not a record, skipped ({reason})")
        start += len(raw) + 1


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of an append-only file; a torn last line (crash mid-write) or a damaged line is
    reported and skipped (`jsonl_records`)."""
    with open(path, "rb") as handle:
        data = handle.read()
    for line in jsonl_records(data, path):
        yield line.record


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes a rename in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused while a big table is parsed. Parsing makes no cycles, but
    its 100k+ new dicts trigger collections that walk every object the process holds (Dagster's are
    many): a 100k-row table parsed in half the time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class FileTableCache:
    """What was parsed from a file, kept while the file is unchanged (same inode, size, mtime and
    change time: an edit that sets the mtime back still moves the change time):
    the CLI runs every step of a run in one process, and each would otherwise parse the same
    100k-line tables again. Holds the `size` most recently used files."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[Path, Any], tuple[tuple[int, ...], Any]] = OrderedDict()

    @staticmethod
    def _version(path: Path) -> tuple[int, ...]:
        stat = path.stat()
        return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns

    def get(self, path: Path, load: Callable[[], T], variant: Any = None) -> T:
        """What `load()` made of `path`; `variant` tells apart different readings of one file."""
        version = self._version(path)
        entry = self._entries.get((path, variant))
        if entry is not None and entry[0] == version:
            self._entries.move_to_end((path, variant))
            return entry[1]
        with paused_gc():
            value = load()
        self.put(path, value, variant, version)
        return value

    def put(self, path: Path, value: Any, variant: Any = None, version: tuple[int, ...] | None = None) -> None:
        """Remember `value` as what `path` holds now (just after writing it)."""
        self._entries[(path, variant)] = (version or self._version(path), value)
        self._entries.move_to_end((path, variant))
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
