"""A store as an older release left it, for the migration tests: the migrations before
a version applied, request rows written with that version's columns, and the rows read
back as records."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.adapters.store import (
    REQUEST_COLUMNS,
    ClickHouseStore,
    load_migrations,
    migrate,
    record_from_row,
    request_columns,
)
from pipeline.core.record import RequestRecord

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
