"""Migration 0014 (``requests.client_attempt``, ``requests.logical_request_id``, issue 47)
upgrades a store written before it: every row kept, as a first try of its own (attempt 0,
no logical id); after it, records carry the client's attempt, whichever way the rows were
written."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from pipeline.adapters.store import REQUEST_COLUMNS, open_store
from pipeline.core.record import build_record
from pipeline.settings import Settings
from tests.factories import completed, finished, received
from tests.integration.migrations import (
    column_types,
    stored_requests,
    upgrade,
    write_new_requests,
)

pytestmark = pytest.mark.integration

NEW = {"client_attempt", "logical_request_id"}
OLD = [n for n, _ in REQUEST_COLUMNS if n not in NEW]  # 0013's table


@pytest.mark.parametrize("json_path", [True, False], ids=["json", "columns"])
def test_0014_keeps_old_rows_and_stores_the_attempts(tmp_path: Path, json_path: bool) -> None:
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        old = build_record("a", received("a"), completed("a"), finished("a"))
        assert upgrade(store, tmp_path, 14, [old], OLD)[0] == "0014_logical_requests"
        assert stored_requests(store) == [old]
        assert store.query_rows(
            "SELECT client_attempt, logical_request_id FROM tailguard.requests FINAL"
        ) == [(0, None)]
        replace = msgspec.structs.replace
        retry = replace(old, request_id="a~retry1", client_attempt=1, logical_request_id="a")
        keyed = replace(old, request_id="b", logical_request_id="idem-\u00e9\n" + "k" * 200)
        write_new_requests(store, [retry, keyed], json_path)
        assert stored_requests(store) == [old, retry, keyed]
        assert column_types(store, sorted(NEW)) == {
            "client_attempt": "UInt16",
            "logical_request_id": "Nullable(String)",
        }
    finally:
        store.close()
