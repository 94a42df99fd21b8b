"""Migration 0008 upgrades a store written before it: every request row kept, as
attempt 1, with its version doubled (so that it still orders against new rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.store import (
    REQUEST_COLUMNS,
    load_migrations,
    migrate,
    open_store,
    record_from_row,
    request_columns,
    write_requests,
)
from pipeline.core.record import build_record
from pipeline.settings import Settings
from tests.factories import completed, finished, received

pytestmark = pytest.mark.integration

# the columns of 0007's table: without 0008's (attempt, superseded) and later ones
OLD = [
    n
    for n, _ in REQUEST_COLUMNS
    if n
    not in {
        "attempt",
        "superseded",
        "slo_ttft_ms",
        "slo_tpot_ms",
        "cold_start_unix_ns",
        "conflicts",
    }
]


def test_0008_keeps_what_0007_stored(tmp_path: Path) -> None:
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        old_dir = tmp_path / "sql-old"
        old_dir.mkdir()
        for m in load_migrations():
            if m.version < 8:
                (old_dir / f"{m.name}.sql").write_text(m.sql)
        migrate(store, sql_dir=old_dir)
        joined = build_record("a", received("a"), completed("a"), finished("a"))
        partial = build_record("b", None, completed("b"), None)
        names = [n for n, _ in REQUEST_COLUMNS]
        cols = dict(zip(names, request_columns([joined, partial]), strict=True))
        cols["revision"] = [joined.revision, partial.revision]  # the old meaning
        types = dict(REQUEST_COLUMNS)
        store.insert_columns("requests", [cols[n] for n in OLD], OLD, [types[n] for n in OLD])
        assert migrate(store)[0] == "0008_attempts"
        names = ", ".join(n for n, _ in REQUEST_COLUMNS)
        rows = store.query_rows(
            f"SELECT {names} FROM {store.database}.requests FINAL ORDER BY request_id"
        )
        assert [record_from_row(r) for r in rows] == [joined, partial]
        # a later joined version of the partial replaces it; a retry is a second row
        upgraded = build_record("b", received("b"), completed("b"), finished("b"))
        retry = build_record("b", received("b"), completed("b"), finished("b"), attempt=2)
        write_requests(store, [upgraded, retry])
        rows = store.query_rows(
            f"SELECT {names} FROM {store.database}.requests FINAL ORDER BY request_id, attempt"
        )
        assert [record_from_row(r) for r in rows] == [joined, upgraded, retry]
    finally:
        store.close()
