"""Migration 0012 (``requests.conflicts``) upgrades a store written before it: every row
kept, with no conflicts; after it, a record corrected by a late conflicting terminal
event (same revision, ``conflicts`` > 0) replaces the row it corrects, whichever way the
rows were written (JSON into the embedded engine, or column-wise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.store import REQUEST_COLUMNS, open_store, write_requests
from pipeline.core.record import build_record
from pipeline.settings import Settings
from tests.factories import completed, finished, received
from tests.integration.migrations import stored_requests, upgrade, write_new_requests

pytestmark = pytest.mark.integration

# 0011's table: without 0012's conflicts and later columns
OLD = [
    n
    for n, _ in REQUEST_COLUMNS
    if n
    not in {"conflicts", "control_mode", "control_verdict", "client_attempt", "logical_request_id"}
]


@pytest.mark.parametrize("json_path", [True, False], ids=["json", "columns"])
def test_0012_keeps_old_rows_and_a_correction_replaces_its_row(
    tmp_path: Path, json_path: bool
) -> None:
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        ok = build_record("a", received("a"), completed("a"), finished("a"))
        other = build_record("b", received("b"), completed("b"), finished("b"))
        assert upgrade(store, tmp_path, 12, [ok, other], OLD)[0] == "0012_conflicts"
        assert stored_requests(store) == [ok, other]
        # a late gateway.completed error 500: the corrected record, same revision
        error = completed("a", outcome="error", http_status=500, eid="a:c2")
        fixed = build_record("a", received("a"), error, finished("a"), conflicts=1)
        assert fixed.revision == ok.revision
        if json_path:
            write_requests(store, [fixed])
            write_requests(store, [ok])  # the older version again (a re-delivery)
        else:
            write_new_requests(store, [fixed, ok], json_path=False)  # one block
        rows = stored_requests(store)
        assert rows == [fixed, other]
        assert rows[0].outcome == "error"
    finally:
        store.close()
