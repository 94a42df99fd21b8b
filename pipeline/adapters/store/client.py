"""The clickhouse-connect store: one client, every call serialised by a lock.

Over HTTP (a ClickHouse server, ``TAILGUARD_CLICKHOUSE_URL``) this is the back-end as is;
the embedded engine (:mod:`pipeline.adapters.store.embedded`) adds its own insert path.
Inserts name their columns and types explicitly so that no round trip asks the server for
the table's columns.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any


class ClickHouseStore:
    """clickhouse-connect client (a ClickHouse server over HTTP, or the base of
    :class:`~pipeline.adapters.store.embedded.EmbeddedStore`), serialised by a lock.

    chDB corrupts data when two threads insert on one session at once, so
    every call goes through one lock.
    """

    # chDB in this process (the embedded engine reads files of this host): see EmbeddedStore
    embedded = False

    def __init__(self, client: Any, database: str) -> None:
        self._client = client
        self.database = database
        self._lock = threading.Lock()

    def command(self, sql: str) -> Any:
        with self._lock, self._failing():
            return self._client.command(sql)

    def query_rows(
        self, sql: str, parameters: dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        with self._lock, self._failing():
            return list(self._client.query(sql, parameters=parameters).result_rows)

    def query_arrow(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        with self._lock, self._failing():
            return self._client.query_arrow(sql, parameters=parameters, use_strings=True)

    @contextlib.contextmanager
    def _failing(self) -> Iterator[None]:
        """A call that fails is followed by :meth:`_after_failure` (under the lock)."""
        try:
            yield
        except BaseException:
            self._after_failure()
            raise

    def _after_failure(self) -> None:
        """After a call that failed (over HTTP each query stands alone: nothing)."""

    def insert_columns(
        self,
        table: str,
        columns: Sequence[Sequence[Any]],
        names: Sequence[str],
        types: Sequence[str],
        settings: dict[str, Any] | None = None,
    ) -> None:
        types = self._sent_types(types)
        with self._lock:
            self._before_insert(table)
            context = self._client.create_insert_context(
                table,
                column_names=list(names),
                column_type_names=list(types),
                column_oriented=True,
                database=self.database,
                settings=settings,
                data=list(columns),
            )
            try:
                self._client.insert(context=context)
            finally:
                _release(context)

    def _sent_types(self, types: Sequence[str]) -> Sequence[str]:
        """The column types an insert sends (here the table's own)."""
        return types

    def _before_insert(self, table: str) -> None:
        """Called under the lock before each insert (fault injection hooks in here)."""

    @property
    def lock(self) -> threading.Lock:
        """Held for every call; another user of this process's chDB engine takes it too."""
        return self._lock

    def close(self) -> None:
        with self._lock:
            self._client.close()


def _release(context: Any) -> None:
    """Drop what a used insert context holds. clickhouse-connect's ``InsertContext``
    refers to itself (a bound method in an attribute) and, after the insert, still to
    the columns: without this, every insert's rows would wait for the cycle collector's
    oldest generation, which ``tune_gc`` makes rare (the worker's RSS grew by ~28 MiB a
    minute at 10,000 events/s: ``bench/memory_live.py``)."""
    vars(context).clear()


def http_client(url: str, user: str, password: str) -> Any:
    """A clickhouse-connect client of the ClickHouse server at ``url`` (a DSN)."""
    import clickhouse_connect  # adapter-only import

    return clickhouse_connect.get_client(dsn=url, username=user, password=password)
