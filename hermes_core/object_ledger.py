"""The ledger on object storage (S3, GCS, Azure, … through fsspec): one object per record.

Object stores cannot append, so each finished sample's record is written as its own object,
`<url>/<partition_key>/<time_ns>-<writer>-<seq>.json`. A PUT is atomic and durable when it returns,
which keeps the local ledger's promise: a crash loses at most the samples in flight, and no reader
ever sees half a record. Object names start with the time they were written, so a sample's latest
record is the one written last, whichever reader saw it first and in what order. Writers never
share an object, so concurrent runs on other machines need no lock.

A reader lists the prefix and fetches only the objects it has not seen (`refresh`), concurrently
in chunks; whole records are fetched again on demand, like the local ledger's reads by offset.
Credentials and endpoints are fsspec's: the backend's usual environment (AWS_ACCESS_KEY_ID, …)
or `FSSPEC_<PROTOCOL>_<OPTION>` variables, e.g. FSSPEC_S3_ENDPOINT_URL for MinIO or Ceph.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from typing import Any, Iterable, Iterator

from fsspec.core import url_to_fs

from hermes_core.fileio import json_bytes, json_loads
from hermes_core.ledger import Ledger

FETCH_CHUNK = 256  # objects fetched per concurrent round trip


def written_at(name: str) -> str:
    """The object's `<time_ns>-<writer>-<seq>` part: it orders records, whatever partition holds them
    (a sample lands in another batch when its run folder, hence its plan, was rebuilt)."""
    return name.rsplit("/", 1)[-1]


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
    def has_records(cls, url: str) -> bool:
        fs, root = url_to_fs(url.rstrip("/"))
        fs.invalidate_cache()
        return any(name.endswith(".json") for name in fs.find(root))

    def _reset(self) -> None:
        super()._reset()
        self._seen: set[str] = set()

    def refresh(self) -> "ObjectLedger":
        """Fetch and count the records written since the last look, by this process or any other."""
        with self._lock:
            self.fs.invalidate_cache()  # listings are cached, per folder: other writers may have added
            fresh = sorted((name for name in self.fs.find(self.root) if name.endswith(".json") and name not in self._seen),
                           key=written_at)
            for name, data in self._fetch(fresh):
                self._seen.add(name)
                self._note(json_loads(data), (name, 0, len(data)))
            return self

    def _fetch(self, names: list[str]) -> Iterator[tuple[str, bytes]]:
        for start in range(0, len(names), FETCH_CHUNK):
            chunk = names[start : start + FETCH_CHUNK]
            fetched = self.fs.cat(chunk, on_error="raise")
            yield from ((name, fetched[name]) for name in chunk)

    def _note(self, record: dict[str, Any], where: tuple[Any, int, int]) -> None:
        known = self._where.get(record["sample_key"])
        if known is None or written_at(where[0]) > written_at(known[0]):
            super()._note(record, where)
        else:  # an older attempt seen late (a slow PUT, a skewed clock): paid for, not the state
            self._count(record)

    def records(self, sample_keys: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
        """(key, whole latest record) for each key that has one, fetched in chunks, in the given order."""
        keys = iter(sample_keys)
        while chunk := list(itertools.islice(keys, FETCH_CHUNK)):
            with self._lock:
                named = [(key, self._where[key][0]) for key in chunk if key in self._where]
            fetched = dict(self._fetch([name for _, name in named]))
            yield from ((key, json_loads(fetched[name])) for key, name in named)

    def append(self, partition_key: str, record: dict[str, Any]) -> None:
        """Write the record as a new object; it is durable once this returns."""
        name = f"{self.root}/{partition_key}/{time.time_ns():020d}-{self._writer}-{next(self._sequence):06d}.json"
        data = json_bytes(record) + b"\n"
        self.fs.pipe_file(name, data)
        with self._lock:
            self._seen.add(name)
            self._note(record, (name, 0, len(data)))
