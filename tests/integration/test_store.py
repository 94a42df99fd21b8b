"""The ClickHouse schema and writer on the real embedded engine (chDB)."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from pipeline.adapters.store import (
    load_migrations,
    migrate,
    open_store,
    write_requests,
    write_with_retry,
)
from pipeline.core.record import build_record
from pipeline.settings import Settings
from tests.factories import completed, finished, received

pytestmark = pytest.mark.integration


def test_migrate_is_idempotent_and_rows_are_one_per_request(tmp_path: Path) -> None:
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        assert migrate(store) == [m.name for m in load_migrations()]
        assert migrate(store) == []
        partial = build_record("a", received("a"), completed("a"), None)
        joined = build_record("a", received("a"), completed("a"), finished("a"))
        other = build_record("b", None, None, finished("b"))
        write_requests(store, [partial, other])
        write_requests(store, [joined, other])  # re-delivery and an upgrade
        write_requests(store, [partial])  # a stale partial arriving last
        rows = store.query_rows(
            "SELECT request_id, source, revision, queue_ms "
            "FROM tailguard.requests FINAL ORDER BY request_id"
        )
        # revision: the store version, 2 x the record revision (see store_version)
        assert rows == [("a", "joined", 6, 10.0), ("b", "engine_only", 0, 10.0)]
    finally:
        store.close()


class _Flaky:
    """A store whose inserts fail a given number of times."""

    def __init__(self, inner: object, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.database = "tailguard"

    def insert_columns(self, *args: object, **kw: object) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("injected")
        self.inner.insert_columns(*args, **kw)  # type: ignore[attr-defined]


def test_writer_retries_with_backoff_and_loses_nothing(tmp_path: Path) -> None:
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate(store)
        sleeps: list[float] = []
        recs = [build_record(f"r{i}", None, completed(f"r{i}"), None) for i in range(100)]
        retries = write_with_retry(_Flaky(store, 4), recs, sleep=sleeps.append, base_delay_s=0.1)  # type: ignore[arg-type]
        assert retries == 4
        assert sleeps == [0.1, 0.2, 0.4, 0.8]
        assert store.query_rows("SELECT count() FROM tailguard.requests FINAL") == [(100,)]
    finally:
        store.close()


def test_an_insert_keeps_no_reference_to_its_columns(tmp_path: Path) -> None:
    """After an insert the columns are the caller's alone, with the cycle collector off.

    clickhouse-connect's insert context refers to itself (a bound method in an attribute)
    and still to the columns after the insert: unless the store breaks that cycle, every
    insert's rows stay in memory until the collector's oldest generation is collected,
    which the worker's settings (``tune_gc``) make rare: its RSS grew by tens of MiB a
    minute (``bench/memory_live.py``)."""
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        store.command("CREATE DATABASE IF NOT EXISTS tailguard")
        store.command(
            "CREATE TABLE tailguard.cols (k UInt64, s LowCardinality(String), xs Array(Float64))"
            " ENGINE = MergeTree ORDER BY k"
        )
        columns = [[1, 2, 3], ["a", "b", "a"], [[0.5], [], [1.0, 2.0]]]
        names, types = ["k", "s", "xs"], ["UInt64", "LowCardinality(String)", "Array(Float64)"]
        gc.collect()
        gc.disable()
        try:
            before = [sys.getrefcount(c) for c in columns]
            store.insert_columns("cols", columns, names, types)
            store.insert_columns("cols", columns, names, types)
            after = [sys.getrefcount(c) for c in columns]
        finally:
            gc.enable()
        assert after == before
        assert store.query_rows("SELECT count(), sum(length(xs)) FROM tailguard.cols") == [(6, 6)]
    finally:
        store.close()
