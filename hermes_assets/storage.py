"""The instance's event log: Dagster's own SQLite event log, with its database work made cheaper.

Dagster's `SqliteEventLogStorage` keeps one database per run and an index database. For every
connection it builds a new SQLAlchemy engine, so every statement is compiled again (the compiled
cache lives in the engine); for every new run's database it loads all of Alembic's revision scripts
twice (to check the database, then to stamp it); and it writes a run's "materialization planned"
events, one per partition, one by one. A batch is a partition: with the default 10 samples per
batch this was most of a command's start-up and a sizeable part of its CPU (a planned event cost
~7 ms, two commits; a new run's database 65 ms).

Here the engine of each database is kept (bounded; it holds no connection: every connection is
still opened and closed per use as Dagster does, so other processes, the UI's watch of a run's
file and forked children see exactly the same files); the head revision is read once per process;
a new run database is made in one transaction with the same tables, journal mode and Alembic stamp
as Dagster's (anything else, e.g. an older or half-made database, goes to Dagster's code); a
batch of one run's asset events is written in one transaction per database; and an asset's row in
the index is updated in place rather than after a failed insert. The data on disk is Dagster's
layout: a home can switch between this class and Dagster's freely.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as db
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from dagster._config import StringSource
from dagster._core.events import ASSET_EVENTS
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.schema import AssetKeyTable, SqlEventLogStorageMetadata
from dagster._core.storage.event_log.sqlite import sqlite_event_log
from dagster._core.storage.sql import create_engine, get_alembic_config
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._serdes import ConfigurableClassData
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

KEPT_ENGINES = 16  # the index and the last runs' databases: a webserver reads many runs in turn
# Dagster hands batches of events (a run's planned materializations) to `store_event_batch` only
# when this is set; without it, it writes them one by one. Set where this storage is loaded: the
# CLI, the webserver (runs launched from the UI are created there), the daemon, run workers.
os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", "1000")


@functools.cache
def _scripts() -> ScriptDirectory:
    """Alembic's scripts for Dagster's SQLite storage (loading them is the slow part: once per process)."""
    return ScriptDirectory.from_config(get_alembic_config(sqlite_event_log.__file__))


@functools.cache
def _head() -> str | None:
    return _scripts().as_revision_number("head")


class SqliteEventLogStorage(sqlite_event_log.SqliteEventLogStorage):
    """Dagster's SQLite event log under `<dagster_home>/history/runs/` (where Dagster's default puts
    it), with engines kept and new run databases made in one transaction (see the module)."""

    def __init__(self, dagster_home: str, inst_data: ConfigurableClassData | None = None) -> None:
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._engines_lock = threading.Lock()
        self._tables: set[str] = set()  # index tables known to exist
        self._asset_key_index_cols = False  # the asset keys table's index columns, once found
        super().__init__(os.path.join(dagster_home, "history", "runs", ""), inst_data)

    @classmethod
    def config_type(cls) -> dict:
        return {"dagster_home": StringSource}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: dict) -> SqliteEventLogStorage:
        return cls(inst_data=inst_data, **config_value)

    def _engine(self, shard: str) -> Engine:
        """The shard's engine, made at its first use (NullPool: it keeps no connection open)."""
        with self._engines_lock:
            engine = self._engines.get(shard)
            if engine is None:
                engine = self._engines[shard] = create_engine(
                    self.conn_string_for_shard(shard), poolclass=NullPool,
                    connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS})
                if len(self._engines) > KEPT_ENGINES:
                    self._engines.popitem(last=False)
            else:
                self._engines.move_to_end(shard)
            return engine

    def has_table(self, table_name: str) -> bool:
        """Dagster's check of the index database (asked at every tagged materialization, through a
        new engine and connection: ~4 ms), through the kept engine and remembered once true: tables
        are only ever added (`dagster instance migrate`)."""
        if table_name not in self._tables:
            with self._engine(sqlite_event_log.INDEX_SHARD_NAME).connect() as conn:
                if not conn.dialect.has_table(conn, table_name):
                    return False
            self._tables.add(table_name)
        return True

    def _has_asset_key_index_cols_on_connection(self, conn: Connection) -> bool:
        """Dagster inspects the asset keys table's columns at every asset event (a new inspector
        each time); remembered once true, as columns too are only ever added."""
        if not self._asset_key_index_cols:
            self._asset_key_index_cols = super()._has_asset_key_index_cols_on_connection(conn)
        return self._asset_key_index_cols

    def _store_asset_event(self, conn: Connection, event: EventLogEntry, event_id: int) -> None:
        """Dagster's upsert of the asset's row in the index, tried as an update first. Dagster
        inserts first and updates when the insert fails: every event of an asset seen before (all
        but its first) raised an IntegrityError through SQLAlchemy's error handling, and left its
        traceback's cycles for the garbage collector. A new asset, or one added meanwhile by
        another process, goes to Dagster's insert-or-update."""
        values = (self._get_asset_entry_values(event, event_id, self._has_asset_key_index_cols_on_connection(conn))
                  if event.dagster_event and event.dagster_event.asset_key else None)
        if values:
            key = event.dagster_event.asset_key.to_string()
            updated = conn.execute(AssetKeyTable.update().values(**values).where(AssetKeyTable.c.asset_key == key))
            if updated.rowcount:
                return
        super()._store_asset_event(conn, event, event_id)

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        # Dagster's _connect, with the shard's engine kept instead of made and disposed each time.
        with self._db_lock:
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        """A batch of one run's events (e.g. its "materialization planned" event per partition) as
        `store_event` writes each, in order: each stretch of asset events in one transaction per
        database instead of two per event, any other event alone."""
        if len({event.run_id for event in events}) != 1:
            super().store_event_batch(events)
            return
        for is_asset, stretch in itertools.groupby(events, key=_is_asset_event):
            stretch = list(stretch)
            if is_asset and len(stretch) > 1:
                self._store_asset_events(stretch)
            else:
                for event in stretch:
                    self.store_event(event)

    def _store_asset_events(self, events: list[EventLogEntry]) -> None:
        """`store_event` for asset events of one run, in one transaction per database."""
        inserts = [self.prepare_insert_event(event) for event in events]
        with self.run_connection(events[0].run_id) as conn:
            for insert in inserts:
                conn.execute(insert)
        with self.index_transaction() as conn:  # the index mirrors asset events across runs
            ids = [conn.execute(insert).inserted_primary_key[0] for insert in inserts]
            self._store_asset_event_tags(conn, events, ids)
            for event, event_id in zip(events, ids):
                self._store_asset_event(conn, event, event_id)

    def _initdb(self, engine: Engine, for_index_shard: bool = False) -> None:
        if not for_index_shard:
            with engine.connect() as conn:
                context = MigrationContext.configure(conn)
                if context.get_current_revision() == _head():
                    return  # what Dagster's check would find: nothing to do
                if not db.inspect(conn).get_table_names() and _create(conn, context):
                    return
        super()._initdb(engine, for_index_shard)  # an older or half-made database, or one made meanwhile


def _is_asset_event(event: EventLogEntry) -> bool:
    return event.is_dagster_event and event.dagster_event_type in ASSET_EVENTS


def _create(conn: Connection, context: MigrationContext) -> bool:
    """Make a new, empty run database as Dagster's _initdb does (its tables, WAL, stamped at head),
    in one transaction: one commit instead of one per table and index. False if that failed (e.g.
    another process made it meanwhile): Dagster's own code then takes over, with its retries."""
    try:
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        conn.exec_driver_sql("BEGIN")
        SqlEventLogStorageMetadata.create_all(conn)
        context.stamp(_scripts(), "head")
        conn.exec_driver_sql("COMMIT")
        return True
    except db.exc.DatabaseError:
        conn.rollback()
        return False
