"""Migration 0013 (``requests.control_mode``, ``requests.control_verdict``, issue 48)
upgrades a store written before it: every row kept, with no mode (NULL: off); after it,
records carry the enforcement's fields, whichever way the rows were written."""

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

NEW = {"control_mode", "control_verdict"}
LATER = {"client_attempt", "logical_request_id"}  # 0014's
OLD = [n for n, _ in REQUEST_COLUMNS if n not in NEW | LATER]  # 0012's table


@pytest.mark.parametrize("json_path", [True, False], ids=["json", "columns"])
def test_0013_keeps_old_rows_and_stores_the_verdicts(tmp_path: Path, json_path: bool) -> None:
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        old = build_record("a", received("a"), completed("a"), finished("a"))
        assert upgrade(store, tmp_path, 13, [old], OLD)[0] == "0013_control_verdicts"
        assert stored_requests(store) == [old]
        assert store.query_rows(
            "SELECT control_mode, control_verdict FROM tailguard.requests FINAL"
        ) == [(None, None)]
        replace = msgspec.structs.replace
        shadow = replace(old, request_id="b", control_mode="shadow", control_verdict="admission")
        enforce = replace(old, request_id="c", control_mode="enforce",
                          control_verdict="shed_priority", outcome="rejected")  # fmt: skip
        write_new_requests(store, [shadow, enforce], json_path)
        assert stored_requests(store) == [old, shadow, enforce]
        assert column_types(store, sorted(NEW)) == dict.fromkeys(
            NEW, "LowCardinality(Nullable(String))"
        )
    finally:
        store.close()
