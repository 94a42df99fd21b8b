"""Migration 0008 upgrades a store written before it: every request row kept, as
attempt 1, with its version doubled (so that it still orders against new rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.store import REQUEST_COLUMNS, migrate, open_store, write_requests
from pipeline.core.record import build_record
from pipeline.settings import Settings
from tests.factories import completed, finished, received
from tests.integration.migrations import insert_old_requests, migrate_before, stored_requests

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
        "control_mode",
        "control_verdict",
        "client_attempt",
        "logical_request_id",
    }
]


def test_0008_keeps_what_0007_stored(tmp_path: Path) -> None:
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate_before(store, tmp_path, 8)
        joined = build_record("a", received("a"), completed("a"), finished("a"))
        partial = build_record("b", None, completed("b"), None)
        old_revision = [joined.revision, partial.revision]  # the old meaning
        insert_old_requests(store, [joined, partial], OLD, revision=old_revision)
        assert migrate(store)[0] == "0008_attempts"
        assert stored_requests(store) == [joined, partial]
        # a later joined version of the partial replaces it; a retry is a second row
        upgraded = build_record("b", received("b"), completed("b"), finished("b"))
        retry = build_record("b", received("b"), completed("b"), finished("b"), attempt=2)
        write_requests(store, [upgraded, retry])
        assert stored_requests(store, "request_id, attempt") == [joined, upgraded, retry]
    finally:
        store.close()
