"""Dagster's SQLite event log for `kb index` on an unconfigured $DAGSTER_HOME, with connections kept open.

Same files, same schema and the same directory as Dagster's default (`<home>/history/runs/<run id>.db` and
`index.db`), so the UI opened on that home with Dagster's defaults reads these runs. What differs is only how
this process talks to them: Dagster's class builds a new engine, opens a new connection and, on closing the
last one, checkpoints the WAL for every event (~70 events and ~30 index rows per run, each 10–30 ms here);
this one keeps one connection per shard (the run's and the index's) for the process and asks sqlite once
whether a table exists. Thread safety is the parent's: every use of a connection holds its `_db_lock`.
"""
from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Iterator

from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    SQLITE_BUSY_TIMEOUT_SECONDS,
    SqliteEventLogStorage,
)
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

_OPEN_SHARDS = 4       # the index shard and the latest runs' shards (one kb index runs one job per source)


class HeldSqliteEventLogStorage(SqliteEventLogStorage):
    def __init__(self, base_dir: str, inst_data: Any = None):
        self._engines: OrderedDict[str, Any] = OrderedDict()
        self._tables: dict[str, bool] = {}
        super().__init__(base_dir, inst_data=inst_data)

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> HeldSqliteEventLogStorage:  # ty: ignore
        return cls(inst_data=inst_data, **config_value)

    def _engine(self, shard: str):
        engine = self._engines.get(shard)
        if engine is None:
            engine = create_engine(self.conn_string_for_shard(shard), poolclass=StaticPool,
                                   connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS,
                                                 "check_same_thread": False})
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            self._engines[shard] = engine
            while len(self._engines) > _OPEN_SHARDS:
                self._engines.popitem(last=False)[1].dispose()
        else:
            self._engines.move_to_end(shard)
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Any]:
        with self._db_lock:
            with self._engine(shard).connect() as conn:
                with conn.begin():
                    yield conn

    def has_table(self, table_name: str) -> bool:
        if not self._tables.get(table_name):       # a table, once there, stays (absent: ask again)
            self._tables[table_name] = super().has_table(table_name)
        return self._tables[table_name]

    def dispose(self) -> None:
        with self._db_lock:
            while self._engines:
                self._engines.popitem()[1].dispose()
        super().dispose()
