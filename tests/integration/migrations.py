"""A store as an older release left it, for the migration tests: the migrations before
a version applied, request rows written with that version's columns, and the rows read
back as records."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.adapters.store import (
    REQUEST_COLUMNS,
    WINDOW_COLUMNS,
    ClickHouseStore,
    load_migrations,
    migrate,
    record_from_row,
    request_columns,
    windows_columns,
    write_requests,
)
from pipeline.core.record import RequestRecord
from pipeline.core.windows import ClosedWindow

NAMES = [n for n, _ in REQUEST_COLUMNS]


def migrate_before(store: ClickHouseStore, tmp_path: Path, version: int) -> None:
    """Only the migrations numbered below ``version``, from a copy of them in ``tmp_path``."""
    old_dir = tmp_path / "sql-old"
    old_dir.mkdir()
    for m in load_migrations():
        if m.version < version:
            (old_dir / f"{m.name}.sql").write_text(m.sql)
    migrate(store, sql_dir=old_dir)


def insert_old_requests(
    store: ClickHouseStore,
    records: Sequence[RequestRecord],
    old_names: Sequence[str],
    **old_values: list[Any],
) -> None:
    """``records`` as rows of a requests table that has only the columns ``old_names``;
    ``old_values``: columns whose values meant something else then."""
    cols = dict(zip(NAMES, request_columns(records), strict=True)) | old_values
    types = dict(REQUEST_COLUMNS)
    store.insert_columns("requests", [cols[n] for n in old_names], old_names,
                         [types[n] for n in old_names])  # fmt: skip


def stored_requests(store: ClickHouseStore, order_by: str = "request_id") -> list[RequestRecord]:
    """The requests table (FINAL) as records."""
    sql = f"SELECT {', '.join(NAMES)} FROM {store.database}.requests FINAL ORDER BY {order_by}"
    return [record_from_row(r) for r in store.query_rows(sql)]


def upgrade(
    store: ClickHouseStore,
    tmp_path: Path,
    version: int,
    records: Sequence[RequestRecord],
    old_names: Sequence[str],
) -> list[str]:
    """The store as it was before ``version``, holding ``records`` in its columns
    ``old_names``, migrated: the names of the migrations applied."""
    migrate_before(store, tmp_path, version)
    insert_old_requests(store, records, old_names)
    return migrate(store)


def write_new_requests(
    store: ClickHouseStore, records: Sequence[RequestRecord], json_path: bool
) -> None:
    """``records`` written as JSON into the embedded engine, or column-wise."""
    if json_path:
        write_requests(store, records)
    else:
        store.insert_columns("requests", request_columns(records), NAMES,
                             [t for _, t in REQUEST_COLUMNS])  # fmt: skip


def column_types(store: ClickHouseStore, names: Sequence[str]) -> dict[str, str]:
    """The requests table's type of each column in ``names``."""
    listed = ", ".join(f"'{n}'" for n in names)
    return dict(
        store.query_rows(
            "SELECT name, type FROM system.columns WHERE database = 'tailguard' "
            f"AND table = 'requests' AND name IN ({listed})"
        )
    )


def write_old_windows(store: ClickHouseStore, windows: Sequence[ClosedWindow], token: str) -> None:
    """``windows`` as an older release wrote them: only the ``window_sketches`` columns the
    store's table has (a later migration added the others)."""
    have = {
        str(n)
        for (n,) in store.query_rows(
            "SELECT name FROM system.columns WHERE database = 'tailguard' "
            "AND table = 'window_sketches'"
        )
    }
    cols = windows_columns(windows, "t", 0.01, {})
    kept = [(spec, c) for spec, c in zip(WINDOW_COLUMNS, cols, strict=True) if spec[0] in have]
    store.insert_columns(
        "window_sketches", [c for _, c in kept], [n for (n, _), _ in kept],
        [t for (_, t), _ in kept], {"insert_deduplication_token": token},
    )  # fmt: skip
