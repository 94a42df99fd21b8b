"""Migration 0013 (``requests.control_mode``, ``requests.control_verdict``, issue 48)
upgrades a store written before it: every row kept, with no mode (NULL: off); after it,
records carry the enforcement's fields, whichever way the rows were written."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from pipeline.adapters.store import (
    REQUEST_COLUMNS,
    migrate,
    open_store,
    request_columns,
    write_requests,
)
from pipeline.core.record import build_record
from pipeline.settings import Settings
from tests.factories import completed, finished, received
from tests.integration.migrations import (
    NAMES,
    insert_old_requests,
    migrate_before,
    stored_requests,
)

pytestmark = pytest.mark.integration

NEW = {"control_mode", "control_verdict"}
LATER = {"client_attempt", "logical_request_id"}  # 0014's
OLD = [n for n, _ in REQUEST_COLUMNS if n not in NEW | LATER]  # 0012's table


@pytest.mark.parametrize("json_path", [True, False], ids=["json", "columns"])
def test_0013_keeps_old_rows_and_stores_the_verdicts(tmp_path: Path, json_path: bool) -> None:
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate_before(store, tmp_path, 13)
        old = build_record("a", received("a"), completed("a"), finished("a"))
        insert_old_requests(store, [old], OLD)
        assert migrate(store)[0] == "0013_control_verdicts"
        assert stored_requests(store) == [old]
        assert store.query_rows(
            "SELECT control_mode, control_verdict FROM tailguard.requests FINAL"
        ) == [(None, None)]
        replace = msgspec.structs.replace
        shadow = replace(old, request_id="b", control_mode="shadow", control_verdict="admission")
        enforce = replace(old, request_id="c", control_mode="enforce",
                          control_verdict="shed_priority", outcome="rejected")  # fmt: skip
        if json_path:
            write_requests(store, [shadow, enforce])
        else:
            store.insert_columns("requests", request_columns([shadow, enforce]), NAMES,
                                 [t for _, t in REQUEST_COLUMNS])  # fmt: skip
        assert stored_requests(store) == [old, shadow, enforce]
        types = dict(
            store.query_rows(
                "SELECT name, type FROM system.columns WHERE database = 'tailguard' "
                "AND table = 'requests' AND name IN ('control_mode', 'control_verdict')"
            )
        )
        assert types == dict.fromkeys(NEW, "LowCardinality(Nullable(String))")
    finally:
        store.close()
