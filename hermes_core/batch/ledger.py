"""The per-sample ledger and the batch plan: what makes resume exact.

- Batch plan (`batches.json`): partition key → member sample keys. A sample keeps its batch for
  the life of the run; samples without a batch (new rows) are grouped into new batches whose key is
  derived from their members' keys, never from line positions.
- Ledger (`raw/<partition_key>.jsonl`): one record appended (fsync) the moment a sample finishes,
  so a crash loses at most the samples in flight. The latest record of a sample is its state.
  On object storage (`HERMES_LEDGER_URL`, `object_ledger.py`) each record is one object instead.
  In memory a ledger keeps a summary of each sample's latest record (~1 KB, without the
  trajectory) and where the record lies; whole records are read back from disk one at a time.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from hermes_core.fileio import append_records, atomic_write_text, json_bytes, json_loads, jsonl_records
from hermes_core.formats.filters import Disposition


@dataclass(frozen=True)
class Batch:
    key: str
    number: int
    members: tuple[str, ...]


def batch_key(number: int, members: Iterable[str]) -> str:
    digest = hashlib.sha256("\n".join(sorted(members)).encode()).hexdigest()[:10]
    return f"b{number:05d}-{digest}"


class BatchPlan:
    def __init__(self, path: Path):
        self.path = path
        data = json_loads(path.read_bytes()) if path.is_file() else {"batches": []}
        self.batches = [Batch(b["key"], b["number"], tuple(b["members"])) for b in data["batches"]]

    def batch_of(self) -> dict[str, Batch]:
        return {member: batch for batch in self.batches for member in batch.members}

    def propose(self, sample_keys: list[str], batch_size: int) -> list[Batch]:
        """The new batches `assign` would create for these samples (in the given order); saves nothing,
        so a sensor can register the partitions of rows not planned yet."""
        assigned = self.batch_of()
        fresh = [key for key in sample_keys if key not in assigned]
        return [Batch(batch_key(number, members), number, members)
                for number, members in enumerate(
                    (tuple(fresh[start : start + batch_size]) for start in range(0, len(fresh), batch_size)),
                    start=len(self.batches) + 1)]

    def assign(self, sample_keys: list[str], batch_size: int) -> list[Batch]:
        """Put samples that have no batch yet into new batches (in the given order); save."""
        created = self.propose(sample_keys, batch_size)
        self.batches.extend(created)
        if created or not self.path.is_file():  # compact: 10k batches of 10 take 0.05 s instead of 1 s indented
            atomic_write_text(self.path, json_bytes(
                {"batches": [{"key": b.key, "number": b.number, "members": list(b.members)} for b in self.batches]}))
        return created

    def get(self, key: str) -> Batch:
        for batch in self.batches:
            if batch.key == key:
                return batch
        raise KeyError(f"no batch {key!r} in {self.path}")


RECORD_KEYS = ("sample_key", "partition_key", "disposition")  # a line without them is damaged, not a record
HEAVY_FIELDS = ("row", "messages")  # the trajectory: 90% of a record, only the final file needs it


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """A record without its trajectory: what statistics, checks and planning read."""
    summary = {key: value for key, value in record.items() if key not in HEAVY_FIELDS}
    row = record.get("row")
    summary["has_row"] = row is not None
    summary["tool_stats"] = row["tool_stats"] if row is not None else {}
    return summary


def empty_spend() -> dict[str, float]:
    return {"api_calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
            "sandboxes_created": 0, "sandboxes_failed": 0, "cost_usd": 0.0}


def add_spend(spend: dict[str, float], record: dict[str, Any]) -> None:
    """Add what one attempt (a record or its summary) cost to `spend`."""
    spend["api_calls"] += record.get("api_calls", 0)
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        spend[key] += (record.get("usage") or {}).get(key, 0)
    spend["sandboxes_created"] += bool(record.get("sandbox_created"))
    spend["sandboxes_failed"] += bool(record.get("sandbox_failed"))
    spend["cost_usd"] += record.get("cost_usd") or 0.0


class Ledger:
    """Records of one run's samples, across all partitions and all past invocations.

    `latest` maps each sample key to the summary of its latest record (`summarize`); `record(key)`
    and `records(keys)` read whole records from disk, so memory does not grow with trajectory size
    (a 100k-sample run holds ~100 MB of summaries, not ~1 GB of trajectories).

    The raw files only ever grow, so a ledger reads each byte once: `refresh()` parses what was
    appended since, and `ledgers.open_ledger()` hands out one refreshed ledger per folder to every
    step of a process (a CLI run used to parse the same files nine times)."""

    def __init__(self, raw_dir: Path):
        self.raw_dir = raw_dir
        self._lock = threading.RLock()
        self._reset()
        self.refresh()

    def _reset(self) -> None:
        self.latest: dict[str, dict[str, Any]] = {}
        self._where: dict[str, tuple[Path, int, int]] = {}  # sample key -> (file, offset, length) of its latest record
        self.failures: dict[str, int] = {}
        self.records_per_partition: dict[str, int] = {}  # attempts recorded in each raw/<partition>.jsonl
        # Spend counts every attempt ever made, superseded or not: it is what was paid for.
        self.spent = empty_spend()
        # A sample's spend is its latest summary's plus, for the few tried more than once, this.
        self._superseded: dict[str, dict[str, float]] = {}
        self._read: dict[Path, tuple[int, int, int]] = {}  # file -> (inode, bytes and lines of whole lines parsed)

    def refresh(self) -> "Ledger":
        """Parse the lines appended since the last read. A torn last line (a crash mid-write) is
        reported and waits: its sample counts as unrecorded, and the next append cuts it off. A damaged
        line is reported and skipped. A file replaced, truncated or removed behind our back means a
        full re-read."""
        with self._lock:
            files = sorted(self.raw_dir.glob("*.jsonl")) if self.raw_dir.is_dir() else []
            if not set(self._read) <= set(files) or not all(self._read_new(path) for path in files):
                self._reset()
                for path in files:
                    self._read_new(path)
            return self

    def _read_new(self, path: Path) -> bool:
        """Parse what was appended to `path`; False (nothing parsed) if it is not the file read before."""
        stat = path.stat()
        inode, done, lines = self._read.get(path, (stat.st_ino, 0, 0))
        if inode != stat.st_ino or stat.st_size < done:
            return False
        if stat.st_size > done:
            with open(path, "rb") as handle:
                handle.seek(done)
                data = handle.read(stat.st_size - done)
            for line in jsonl_records(data, path, done, lines + 1, RECORD_KEYS):
                self._note(line.record, (path, line.offset, len(line.raw)))
            whole = data.rfind(b"\n") + 1
            self._read[path] = (stat.st_ino, done + whole, lines + data.count(b"\n", 0, whole))
        return True

    def _note(self, record: dict[str, Any], where: tuple[Any, int, int]) -> None:
        known = self.latest.get(record["sample_key"])
        # A later attempt supersedes, wherever it was filed (after a rebuilt plan a retry can sit in
        # a file read first); within one attempt, and in ledgers from before attempts were
        # recorded, the record read later does.
        if known is None or record.get("attempt", 0) >= known.get("attempt", 0):
            self._set_latest(record, where)
            superseded = known
        else:
            superseded = record
        if superseded is not None:
            add_spend(self._superseded.setdefault(record["sample_key"], empty_spend()), superseded)
        self._count(record)

    def _set_latest(self, record: dict[str, Any], where: tuple[Any, int, int]) -> None:
        self.latest[record["sample_key"]] = summarize(record)
        self._where[record["sample_key"]] = where

    def _count(self, record: dict[str, Any]) -> None:
        """Count an attempt: its partition, its spend, its failure."""
        partition = record["partition_key"]
        self.records_per_partition[partition] = self.records_per_partition.get(partition, 0) + 1
        add_spend(self.spent, record)
        if record["disposition"] in (Disposition.FAILED_RETRYABLE, Disposition.FAILED_TERMINAL):
            self.failures[record["sample_key"]] = self.failures.get(record["sample_key"], 0) + 1

    def spent_on(self, sample_keys: Iterable[str]) -> dict[str, float]:
        """What every attempt of these samples cost (keys without a record cost nothing)."""
        total = empty_spend()
        for key in sample_keys:
            if (latest := self.latest.get(key)) is not None:
                add_spend(total, latest)
                for name, value in self._superseded.get(key, {}).items():
                    total[name] += value
        return total

    def is_done(self, sample_key: str) -> bool:
        record = self.latest.get(sample_key)
        return record is not None and record["disposition"] in Disposition.FINAL

    def attempts(self, sample_key: str) -> int:
        return self.failures.get(sample_key, 0)

    def records(self, sample_keys: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
        """(key, whole latest record) for each key that has one, read from disk in the given order."""
        handles: dict[Path, int] = {}
        try:
            for key in sample_keys:
                with self._lock:
                    where = self._where.get(key)
                if where is None:
                    continue
                path, offset, length = where
                if path not in handles:
                    handles[path] = os.open(path, os.O_RDONLY)
                record = json_loads(os.pread(handles[path], length, offset))
                if record.get("sample_key") != key:  # only if a raw file was replaced under us
                    raise RuntimeError(f"{path} changed while it was being read; run the step again")
                yield key, record
        finally:
            for fd in handles.values():
                os.close(fd)

    def record(self, sample_key: str) -> dict[str, Any] | None:
        """The whole latest record of one sample, or None."""
        return next((record for _, record in self.records([sample_key])), None)

    @classmethod
    def has_records(cls, raw_dir: Path) -> bool:
        return raw_dir.is_dir() and any(path.stat().st_size for path in raw_dir.glob("*.jsonl"))

    def compact(self, partition_key: str) -> int:
        """Nothing to fold here: a partition's records already share one file (see ObjectLedger)."""
        return 0

    def append(self, partition_key: str, record: dict[str, Any]) -> None:
        """Write the record durably and note it (`append_many` of one)."""
        self.append_many([(partition_key, record)])

    def append_many(self, records: list[tuple[str, dict[str, Any]]]) -> None:
        """Write (partition key, record) pairs durably, in order, then note them: one write and one
        fsync per partition file, however many records it gets (a burst of 900 records that finished
        together costs a few fsyncs, not 900 of ~2 ms each). When a file held exactly what this
        ledger had read, its records are noted as written; otherwise (another process appended in
        between) the file is read on like any other appended lines, so no record is skipped or
        counted twice."""
        by_path: dict[Path, list[dict[str, Any]]] = {}
        for partition_key, record in records:
            by_path.setdefault(self.raw_dir / f"{partition_key}.jsonl", []).append(record)
        for path, appended in by_path.items():
            inode, offset, lengths = append_records(path, appended)
            with self._lock:
                read_inode, read_bytes, read_lines = self._read.get(path, (inode, 0, 0))
                if (read_inode, read_bytes) == (inode, offset):
                    for record, length in zip(appended, lengths):
                        self._note(record, (path, offset, length))
                        offset += length
                    self._read[path] = (inode, offset, read_lines + len(appended))
                elif not self._read_new(path):
                    self.refresh()
