"""Migration 0009: a request's llm-d objectives (slo_ttft_ms, slo_tpot_ms) in the requests
table, on the real embedded engine (chDB)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from pipeline.adapters.store import migrate, open_store, write_requests
from pipeline.core.record import RequestRecord, build_record
from pipeline.settings import Settings
from tests.factories import completed, received

pytestmark = pytest.mark.integration


class _WithObjectives:
    """A record carrying the two objectives (the record's own fields come with the merge
    of pipeline/core/record.py; the store writes NULL for a record without them)."""

    def __init__(self, rec: RequestRecord, ttft: float | None, tpot: float | None) -> None:
        self._rec = rec
        self.slo_ttft_ms = ttft
        self.slo_tpot_ms = tpot

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rec, name)


def test_objectives_are_stored_and_null_when_absent(tmp_path: Path) -> None:
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        assert "0009_request_slo_headers" in migrate(store)
        a = build_record("a", received("a"), completed("a"), None)
        b = build_record("b", received("b"), completed("b"), None)
        write_requests(store, cast("list[RequestRecord]", [_WithObjectives(a, 250.0, 30.5), b]))
        rows = store.query_rows(
            "SELECT request_id, slo_ttft_ms, slo_tpot_ms FROM tailguard.requests FINAL "
            "ORDER BY request_id"
        )
        assert rows == [("a", 250.0, 30.5), ("b", None, None)]
    finally:
        store.close()
