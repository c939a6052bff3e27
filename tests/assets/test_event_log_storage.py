"""The instance's event log (hermes_assets/storage.py): Dagster's SQLite files, made and written by
a cheaper path, read back the same by Dagster's own class and watched the same by the UI."""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy
from dagster._core.events import (AssetCheckEvaluationPlanned, AssetMaterializationPlannedData, AssetObservationData, DagsterEvent,
                                  DagsterEventBatchMetadata, DagsterEventType, StepMaterializationData,
                                  generate_event_batch_id)
from dagster._core.storage.event_log import SqliteEventLogStorage as DagsterSqliteEventLogStorage
from dagster._core.storage.event_log.schema import SqlEventLogStorageMetadata

from hermes_assets import storage
from hermes_assets.instance import get_instance


def planned(run_id: str, partition: str) -> dg.EventLogEntry:
    event = DagsterEvent.build_asset_materialization_planned_event(
        "job", "step", AssetMaterializationPlannedData(dg.AssetKey(["r", "raw"]), partition=partition))
    return dg.EventLogEntry(error_info=None, level="DEBUG", user_message="", run_id=run_id, timestamp=1.0,
                            dagster_event=event)


def check_planned(run_id: str) -> dg.EventLogEntry:
    event = DagsterEvent(event_type_value=DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED.value, job_name="job",
                         step_key="step", event_specific_data=AssetCheckEvaluationPlanned(asset_key=dg.AssetKey(["r", "raw"]),
                                                                                          check_name="rows"))
    return dg.EventLogEntry(error_info=None, level="DEBUG", user_message="", run_id=run_id, timestamp=1.0,
                            dagster_event=event)


def schema(path: Path) -> tuple[set[tuple[str, str]], list[tuple[str]], str]:
    with sqlite3.connect(path) as conn:
        objects = set(conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall())
        return objects, conn.execute("SELECT * FROM alembic_version").fetchall(), \
            conn.execute("PRAGMA journal_mode").fetchone()[0]


def test_the_default_instance_keeps_dagsters_files_where_dagster_puts_them(isolated_homes):
    instance = get_instance()
    assert type(instance.event_log_storage) is storage.SqliteEventLogStorage
    run_id = str(uuid.uuid4())
    instance.event_log_storage.store_event(planned(run_id, "b0"))
    assert (isolated_homes / "dagster_home" / "history" / "runs" / f"{run_id}.db").is_file()
    assert (isolated_homes / "dagster_home" / "history" / "runs" / "index.db").is_file()


def test_a_new_run_database_is_the_one_dagster_makes_and_dagster_reads_it(tmp_path):
    ours = storage.SqliteEventLogStorage(str(tmp_path / "ours"))
    theirs = DagsterSqliteEventLogStorage(str(tmp_path / "theirs" / "history" / "runs"))
    run_id = str(uuid.uuid4())
    for events in (ours, theirs):
        events.store_event(planned(run_id, "b0"))
    made = schema(tmp_path / "ours" / "history" / "runs" / f"{run_id}.db")
    assert made == schema(tmp_path / "theirs" / "history" / "runs" / f"{run_id}.db")
    assert made[1] and made[2] == "wal"
    # Dagster's own class on our files: its check finds them current, and reads what was written.
    again = DagsterSqliteEventLogStorage(str(tmp_path / "ours" / "history" / "runs"))
    records = again.get_records_for_run(run_id).records
    assert [r.event_log_entry.dagster_event.event_specific_data.partition for r in records] == ["b0"]


def test_a_half_made_run_database_is_finished_by_dagsters_code(tmp_path):
    events = storage.SqliteEventLogStorage(str(tmp_path))
    run_id = str(uuid.uuid4())
    path = tmp_path / "history" / "runs" / f"{run_id}.db"
    # Dagster's own creation commits table by table: e.g. a crash after the tables, before the stamp
    SqlEventLogStorageMetadata.create_all(sqlalchemy.create_engine(f"sqlite:///{path}"))
    events.store_event(planned(run_id, "b0"))  # Dagster's _initdb stamps it
    assert schema(path)[1]
    assert len(events.get_records_for_run(run_id).records) == 1


def test_engines_are_kept_for_the_last_databases_only_and_hold_no_connection(tmp_path):
    events = storage.SqliteEventLogStorage(str(tmp_path))
    runs = [str(uuid.uuid4()) for _ in range(storage.KEPT_ENGINES + 5)]
    for run_id in runs:
        events.store_event(planned(run_id, "b0"))
    assert len(events._engines) == storage.KEPT_ENGINES
    open_files = [os.readlink(fd) for fd in Path("/proc/self/fd").iterdir() if fd.is_symlink()]
    assert not [name for name in open_files if str(tmp_path) in name]
    for run_id in runs:  # the first runs' engines were dropped: made again on the next read
        assert len(events.get_records_for_run(run_id).records) == 1


def test_the_uis_watch_of_a_run_sees_each_new_event(tmp_path):
    """The webserver follows a live run by watching its database file; writes through kept engines
    must still touch it (every connection is still closed after use)."""
    events = storage.SqliteEventLogStorage(str(tmp_path))
    run_id = str(uuid.uuid4())
    events.store_event(planned(run_id, "b0"))
    seen: list[str] = []
    arrived = threading.Event()

    def callback(entry: dg.EventLogEntry, _cursor: str) -> None:
        seen.append(entry.dagster_event.event_specific_data.partition)
        if len(seen) == 3:
            arrived.set()

    events.watch(run_id, None, callback)
    try:
        for partition in ("b1", "b2"):
            events.store_event(planned(run_id, partition))
        assert arrived.wait(20), seen
    finally:
        events.end_watch(run_id, callback)
        events.dispose()
    assert seen == ["b0", "b1", "b2"]


def test_a_batch_of_planned_events_is_stored_as_one_by_one(tmp_path, monkeypatch):
    """What Dagster hands over when a run is created for many partitions (with its checks' planned
    events among them): the same rows in the same order, the same index and asset records, as
    storing each event alone; and an instance hands it over as one batch."""
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "1000")
    events = storage.SqliteEventLogStorage(str(tmp_path))
    alone, batched = str(uuid.uuid4()), str(uuid.uuid4())

    def run_events(run_id: str) -> list[dg.EventLogEntry]:
        return [planned(run_id, "b0"), check_planned(run_id), planned(run_id, "b1"), planned(run_id, "b2")]

    for event in run_events(alone):
        events.store_event(event)
    batches, store_event, store_batch = [], events.store_event, events.store_event_batch
    monkeypatch.setattr(events, "store_event", lambda event: (batches.append([event]), store_event(event)))
    monkeypatch.setattr(events, "store_event_batch", lambda batch: (batches.append(batch), store_batch(batch)))
    with dg.instance_for_test() as instance:
        monkeypatch.setattr(instance, "_event_storage", events)
        ids = generate_event_batch_id()
        for index, event in enumerate(run_events(batched)):
            instance.report_dagster_event(event.dagster_event, batched,
                                          batch_metadata=DagsterEventBatchMetadata(ids, index == 3))
    # one batch from the instance; within it b0 and the check's event alone, b1 and b2 in one transaction
    assert [len(batch) for batch in batches] == [4, 1, 1]

    def stored(run_id: str) -> list[tuple]:
        return [(r.event_log_entry.dagster_event_type, r.event_log_entry.dagster_event.partition)
                for r in events.get_records_for_run(run_id).records]

    assert stored(batched) == stored(alone) == [("ASSET_MATERIALIZATION_PLANNED", "b0"),
                                                ("ASSET_CHECK_EVALUATION_PLANNED", None),
                                                ("ASSET_MATERIALIZATION_PLANNED", "b1"),
                                                ("ASSET_MATERIALIZATION_PLANNED", "b2")]
    index = events.get_event_records(dg.EventRecordsFilter(DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
                                                           asset_key=dg.AssetKey(["r", "raw"])), ascending=True)
    assert [(r.run_id, r.partition_key) for r in index] == [(run, p) for run in (alone, batched)
                                                            for p in ("b0", "b1", "b2")]
    attempts = events.get_latest_asset_partition_materialization_attempts_without_materializations(
        dg.AssetKey(["r", "raw"]))  # what marks a failed run's partitions failed in the UI
    assert {partition: run for partition, (run, _) in attempts.items()} == dict.fromkeys(("b0", "b1", "b2"), batched)


def test_a_table_found_once_is_not_looked_up_again(tmp_path, monkeypatch):
    """Dagster asks whether the index has its asset-tags table at every tagged materialization (a batch's)."""
    events = storage.SqliteEventLogStorage(str(tmp_path))
    assert events.has_table("asset_event_tags") and not events.has_table("no_such_table")
    monkeypatch.setattr(events, "_engine", lambda shard: pytest.fail(f"looked up again in {shard}"))
    assert events.has_table("asset_event_tags")


def test_an_assets_row_in_the_index_is_the_one_dagster_writes(tmp_path, monkeypatch):
    """Materializations, observations and planned events of assets seen before (updated in place, no
    insert tried) and new (inserted), with a wipe between: the index's asset rows equal those Dagster's
    class writes, and only an asset's first event goes to Dagster's insert-or-update."""
    ours = storage.SqliteEventLogStorage(str(tmp_path / "ours"))
    theirs = DagsterSqliteEventLogStorage(str(tmp_path / "theirs" / "history" / "runs"))
    first_events: list[str] = []
    upsert = DagsterSqliteEventLogStorage._store_asset_event

    def noted_upsert(self, conn, event, event_id):
        if self is ours:
            first_events.append(event.dagster_event.asset_key.to_user_string())
        return upsert(self, conn, event, event_id)

    monkeypatch.setattr(DagsterSqliteEventLogStorage, "_store_asset_event", noted_upsert)
    run_id, raw, stats = str(uuid.uuid4()), dg.AssetKey(["r", "raw"]), dg.AssetKey(["r", "statistics"])

    def entry(event: DagsterEvent, timestamp: float) -> dg.EventLogEntry:
        return dg.EventLogEntry(error_info=None, level="DEBUG", user_message="", run_id=run_id, timestamp=timestamp,
                                dagster_event=event)

    def events() -> list[dg.EventLogEntry]:
        made = []
        for batch in range(3):
            made.append(planned(run_id, f"b{batch}"))
            made.append(entry(DagsterEvent(DagsterEventType.ASSET_MATERIALIZATION.value, "job", step_key="step",
                                           event_specific_data=StepMaterializationData(dg.AssetMaterialization(
                                               raw, partition=f"b{batch}", tags={"hermes/batch": str(batch)}))),
                              10.0 + batch))
            made.append(entry(DagsterEvent(DagsterEventType.ASSET_OBSERVATION.value, "job", step_key="step",
                                           event_specific_data=AssetObservationData(dg.AssetObservation(raw, partition=f"b{batch}"))),
                              20.0 + batch))
        made.append(entry(DagsterEvent(DagsterEventType.ASSET_MATERIALIZATION.value, "job", step_key="step",
                                       event_specific_data=StepMaterializationData(dg.AssetMaterialization(stats))), 30.0))
        return made

    for events_storage in (ours, theirs):
        for event in events():
            events_storage.store_event(event)
        events_storage.wipe_asset(stats)
        for event in events()[-4:]:
            events_storage.store_event(event)
    assert first_events == ['r/raw', 'r/statistics']  # the rest were updates of their rows

    def rows(storage_root: Path) -> list[tuple]:
        """The asset rows, with when each was made and wiped (the clock's) reduced to whether it was."""
        with sqlite3.connect(storage_root / "history" / "runs" / "index.db") as conn:
            names = [row[1] for row in conn.execute("PRAGMA table_info(asset_keys)")
                     if row[1] not in ("create_timestamp", "wipe_timestamp", "asset_details")]
            return conn.execute(f"SELECT {', '.join(names)}, wipe_timestamp IS NOT NULL FROM asset_keys "
                                "ORDER BY asset_key").fetchall()

    assert rows(tmp_path / "ours") == rows(tmp_path / "theirs")
    assert [row[-1] for row in rows(tmp_path / "ours")] == [0, 1]  # r/raw, and r/statistics wiped
