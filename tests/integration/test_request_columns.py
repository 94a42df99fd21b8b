"""One list for the request columns (issue 38): the ``requests`` table's columns are the
record's fields (``pipeline.adapters.store.record_columns``), and the table the
migrations build has exactly those, with those types, on the real engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.store import (
    REQUEST_COLUMNS,
    clickhouse_type,
    migrate,
    open_store,
    record_columns,
)
from pipeline.core.record import RequestRecord
from pipeline.settings import Settings

pytestmark = pytest.mark.integration


def test_the_migrated_table_has_the_records_columns(tmp_path: Path) -> None:
    settings = Settings(store_dir=tmp_path / "store")
    store = open_store(settings)
    try:
        migrate(store, settings.cluster)
        rows = store.query_rows(
            "SELECT name, type FROM system.columns WHERE database = {d:String} "
            "AND table = 'requests' AND default_kind NOT IN ('MATERIALIZED', 'ALIAS') "
            "ORDER BY position",
            {"d": store.database},
        )
    finally:
        store.close()
    assert {(str(n), str(t)) for n, t in rows} == set(REQUEST_COLUMNS)
    assert {n for n, _ in REQUEST_COLUMNS} == set(RequestRecord.__struct_fields__)


class _RecordPlus(RequestRecord, kw_only=True):
    """The record with a field added (what a maintainer would write, with a migration)."""

    kv_wait_ms: float | None = None
    lora: str | None = None


def test_a_new_field_is_a_column_without_a_second_list() -> None:
    cols = dict(record_columns(_RecordPlus))
    assert cols["kv_wait_ms"] == "Nullable(Float64)"
    assert cols["lora"] == "Nullable(String)"
    assert set(cols) == set(_RecordPlus.__struct_fields__)


@pytest.mark.parametrize(
    ("annotation", "want"),
    [
        (str, "String"),
        (int, "Int64"),
        (float | None, "Nullable(Float64)"),
        (bool | None, "Nullable(Bool)"),
        (tuple[str, ...], "Array(String)"),
    ],
)
def test_types_follow_the_annotation(annotation: object, want: str) -> None:
    assert clickhouse_type(annotation) == want


def test_an_unmapped_type_is_an_error() -> None:
    with pytest.raises(TypeError, match="no ClickHouse type"):
        clickhouse_type(dict[str, int])
