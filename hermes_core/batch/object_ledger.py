"""The ledger on object storage (S3, GCS, Azure, … through fsspec): one object per record, folded
into one segment object per batch when the batch's run ends.

Object stores cannot append, so each finished sample's record is first written as its own object,
`<url>/<partition_key>/<time_ns>-<writer>-<seq>.json`. A PUT is atomic and durable when it returns,
which keeps the local ledger's promise: a crash loses at most the samples in flight, and no reader
ever sees half a record. Object names start with the time they were written, so a sample's latest
record is the one written last, whichever reader saw it first and in what order. Writers never
share an object, so writing records needs no lock (one writer per run is `writer_lock.py`'s lease).

A fresh process would otherwise fetch every record object, one request each, so `compact` folds a
batch's loose objects into `<partition_key>/segment-<…>.jsonl`: a first line naming the objects it
holds, then their records, one per line. The segment is written before the objects are deleted, and
every reader counts each object name once, so a reader that saw the loose objects, the segment, or
both counts each record exactly once; one that lost a race (an object deleted between its listing
and its fetch) looks again and finds the segment.

Credentials and endpoints are fsspec's: the backend's usual environment (AWS_ACCESS_KEY_ID, …)
or `FSSPEC_<PROTOCOL>_<OPTION>` variables, e.g. FSSPEC_S3_ENDPOINT_URL for MinIO or Ceph.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator

from fsspec.core import url_to_fs

from hermes_core.fileio import json_bytes, json_loads, jsonl_records, report_damage
from hermes_core.batch.ledger import RECORD_KEYS, Ledger

FETCH_CHUNK = 256  # objects fetched per concurrent round trip
SEGMENT = "segment-"


def object_id(name: str) -> str:
    """A record object's `<time_ns>-<writer>-<seq>`: unique, and it orders records by when they were
    written, whatever batch holds them (a sample lands in another batch when its plan was rebuilt)."""
    return name.rsplit("/", 1)[-1].removesuffix(".json")


def is_segment(name: str) -> bool:
    return name.rsplit("/", 1)[-1].startswith(SEGMENT)


class ObjectLedger(Ledger):
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, self.root = url_to_fs(self.url)
        self._writer = uuid.uuid4().hex[:12]
        self._sequence = itertools.count()
        self._lock = threading.RLock()
        self._reset()
        self.refresh()

    @classmethod
    def has_records(cls, url: str) -> bool:  # type: ignore[override]  (a URL where the base takes a folder)
        fs, root = url_to_fs(url.rstrip("/"))
        fs.invalidate_cache()
        return any(name.endswith((".json", ".jsonl")) for name in fs.find(root))

    def _reset(self) -> None:
        super()._reset()
        self._seen: set[str] = set()  # ids of the record objects counted, loose or in a segment
        self._segments: set[str] = set()  # segments read
        self._latest_id: dict[str, str] = {}  # sample key -> id of its latest record

    def _list(self, prefix: str) -> list[str]:
        self.fs.invalidate_cache()  # listings are cached, per folder: other writers may have added
        return self.fs.find(prefix)

    def refresh(self) -> "ObjectLedger":
        """Count the records written since the last look, by this process or any other."""
        with self._lock:
            for _ in range(3):
                names = self._list(self.root)
                for segment, data in self._fetch([n for n in names if is_segment(n) and n not in self._segments]):
                    self._read_segment(segment, data)
                loose = [n for n in names if n.endswith(".json") and object_id(n) not in self._seen]
                fetched = dict(self._fetch(loose, missing_ok=True))
                for name in loose:
                    if name in fetched:
                        self._seen.add(object_id(name))  # a damaged one is reported once, never fetched again
                        # A PUT is whole: an object without a final newline is complete, not torn.
                        for line in jsonl_records(fetched[name].rstrip(b"\n") + b"\n", name, required=RECORD_KEYS):
                            self._note_object(object_id(name), line.record, (name, 0, len(line.raw)))
                missing = [name for name in loose if name not in fetched]
                if not missing:
                    return self
                # Folded into a segment after the listing (the next listing shows it), or unreadable.
            raise RuntimeError(f"{self.url}: cannot read {len(missing)} record object(s), e.g. {missing[0]}")

    def _read_segment(self, segment: str, data: bytes) -> None:
        self._segments.add(segment)
        header, _, body = data.partition(b"\n")
        try:
            names = json_loads(header)["objects"]
        except (ValueError, KeyError, TypeError):
            report_damage(f"{segment}: line 1 does not list the segment's record objects; segment skipped")
            return
        # Line n + 2 holds object n; a damaged line is reported and skipped, the others keep their names.
        for line in jsonl_records(body, segment, len(header) + 1, 2, RECORD_KEYS):
            if line.number - 2 >= len(names):
                break
            name, where = names[line.number - 2], (segment, line.offset, len(line.raw))
            if name not in self._seen:
                self._note_object(name, line.record, where)
            elif self._latest_id.get(line.record["sample_key"]) == name:
                self._where[line.record["sample_key"]] = where  # its loose object is about to be deleted: read it here

    def _note_object(self, name: str, record: dict[str, Any], where: tuple[str, int, int]) -> None:
        self._seen.add(name)
        key = record["sample_key"]
        if name > self._latest_id.get(key, ""):  # else an older attempt seen late: paid for, not the state
            self._latest_id[key] = name
            self._set_latest(record, where)
        self._count(record)

    def _fetch(self, names: list[str], missing_ok: bool = False) -> Iterator[tuple[str, bytes]]:
        for start in range(0, len(names), FETCH_CHUNK):
            fetched = self.fs.cat(names[start : start + FETCH_CHUNK], on_error="omit" if missing_ok else "raise")
            yield from fetched.items()

    def records(self, sample_keys: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
        """(key, whole latest record) for each key that has one, fetched in chunks, in the given order."""
        keys = iter(sample_keys)
        while chunk := list(itertools.islice(keys, FETCH_CHUNK)):
            located, data = self._read_records(chunk)
            if any(isinstance(item, Exception) for item in data):
                self.refresh()  # a loose object was folded into a segment since: read it there
                located, data = self._read_records(chunk)
            for key, item in zip(located, data):
                if isinstance(item, Exception):
                    raise item
                yield key, json_loads(item)

    def _read_records(self, keys: list[str]) -> tuple[list[str], list[bytes | Exception]]:
        """Each key's record, fetching each object once: a segment holds a whole batch's records."""
        with self._lock:
            located = {key: self._where[key] for key in keys if key in self._where}
        objects = self.fs.cat(sorted({path for path, _, _ in located.values()}), on_error="return")
        return list(located), [objects[path] if isinstance(objects[path], Exception) else
                               objects[path][offset : offset + length] for path, offset, length in located.values()]

    def append(self, partition_key: str, record: dict[str, Any]) -> None:
        """Write the record as a new object; it is durable once this returns."""
        name = f"{time.time_ns():020d}-{self._writer}-{next(self._sequence):06d}"
        data = json_bytes(record) + b"\n"
        path = f"{self.root}/{partition_key}/{name}.json"
        self.fs.pipe_file(path, data)
        with self._lock:
            self._note_object(name, record, (path, 0, len(data)))

    def append_many(self, records: list[tuple[str, dict[str, Any]]]) -> None:
        """`append` each (partition key, record) pair, in order: an object each."""
        for partition_key, record in records:
            self.append(partition_key, record)

    def write_segment(self, partition_key: str, ids: list[str], lines: list[bytes]) -> None:
        """One object holding the records `lines` under the object ids `ids` (in the same order)."""
        data = json_bytes({"objects": ids}) + b"\n" + b"".join(line.rstrip(b"\n") + b"\n" for line in lines)
        segment = f"{self.root}/{partition_key}/{SEGMENT}{ids[-1]}-{self._writer}.jsonl"
        self.fs.pipe_file(segment, data)
        with self._lock:
            self._read_segment(segment, data)

    def compact(self, partition_key: str) -> int:
        """Fold the batch's loose record objects into one segment, then delete them. Returns how many."""
        loose = sorted((n for n in self._list(f"{self.root}/{partition_key}") if n.endswith(".json")), key=object_id)
        fetched = dict(self._fetch(loose, missing_ok=True))  # another process may be folding them too
        folded = [name for name in loose if name in fetched]
        if len(folded) < 2:
            return 0
        # The segment is written before the deletes: a record is always somewhere.
        self.write_segment(partition_key, [object_id(name) for name in folded], [fetched[name] for name in folded])
        try:
            self.fs.rm(folded)
        except FileNotFoundError:
            pass  # another process folded and deleted some of them first: its segment holds them
        return len(folded)


def upload_folder_ledger(raw_dir: Path, url: str) -> int:
    """Copy a run folder's ledger (`raw/*.jsonl`) to object storage, one segment per batch, then set
    the folder aside as `raw.uploaded-<time>`. Returns how many records were copied.

    Records get ids below any time-based one, numbered in the order the folder ledger ranks them
    (attempt, then read order), so the state of every sample is the same on both sides."""
    # A torn or damaged line is reported, not copied.
    read_order = [(path.stem, line) for path in sorted(raw_dir.glob("*.jsonl"))
                  for line in jsonl_records(path.read_bytes(), path, required=RECORD_KEYS)]
    ranked = sorted(enumerate(read_order), key=lambda item: (item[1][1].record.get("attempt", 0), item[0]))
    ledger = ObjectLedger(url)
    by_partition: dict[str, tuple[list[str], list[bytes]]] = {}
    for rank, (_, (partition, line)) in enumerate(ranked):
        ids, lines = by_partition.setdefault(partition, ([], []))
        ids.append(f"{rank:020d}-uploaded{ledger._writer}-000000")
        lines.append(line.raw)
    for partition, (ids, lines) in sorted(by_partition.items()):
        ledger.write_segment(partition, ids, lines)
    raw_dir.rename(raw_dir.with_name(f"raw.uploaded-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"))
    return len(ranked)
