"""The statement's read of a tenant's period (``pipeline/adapters/queries/statement_rows``,
``_Read``) counts the period's rows once for its choices, and afresh only when asked: the
live-store check (``EngineSource.check_unchanged``) must see what was written since."""

from __future__ import annotations

from typing import Any

from pipeline.adapters.queries.statement_rows import _Read


class CountingStore:
    database = "tg"

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.counts = 0

    def query_rows(self, sql: str, params: Any = None) -> list[tuple[int]]:
        assert sql.startswith("SELECT count() FROM tg.requests WHERE tenant")
        self.counts += 1
        return [(self.rows,)]


def test_the_periods_rows_are_counted_once_unless_asked_afresh() -> None:
    store = CountingStore(rows=7)
    read = _Read(store, "t1", 0, 10)  # type: ignore[arg-type]
    assert (read.stored(), read.stored()) == (7, 7)
    assert store.counts == 1
    store.rows = 8  # a row written since: only a fresh count sees it
    assert read.stored() == 7
    assert read.stored(fresh=True) == 8
    assert store.counts == 2
    assert read.stored() == 8
