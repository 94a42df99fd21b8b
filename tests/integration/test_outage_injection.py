"""The store-outage injection point (TAILGUARD_FAULT_STORE_OUTAGE_FILE) on the real engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.store import (
    OutageInjectingStore,
    migrate,
    open_store,
    with_retry,
    write_requests,
    write_with_retry,
)
from pipeline.core.record import build_record
from pipeline.settings import Settings
from tests.factories import completed, finished, received

pytestmark = pytest.mark.integration


def _count(store: OutageInjectingStore) -> int:
    return int(store.query_rows("SELECT count() FROM tailguard.requests FINAL")[0][0])


def test_the_engine_rejects_inserts_while_the_flag_exists(tmp_path: Path) -> None:
    flag = tmp_path / "outage"
    s = Settings(store_dir=tmp_path / "store", fault_store_outage_file=flag)
    rec = build_record("a", received("a"), completed("a"), finished("a"))
    store = open_store(s)
    assert isinstance(store, OutageInjectingStore)
    try:
        migrate(store)
        flag.touch()
        with pytest.raises(Exception, match="VIOLATED_CONSTRAINT"):
            write_requests(store, [rec])
        assert _count(store) == 0  # queries work during the outage
        failures: list[Exception] = []
        delays: list[float] = []

        def sleep(d: float) -> None:  # the outage ends during the 4th backoff
            delays.append(d)
            if len(delays) == 4:
                flag.unlink()

        retries = write_with_retry(store, [rec], sleep=sleep, on_failure=failures.append)
        assert retries == 4
        assert len(failures) == 4
        assert delays == [0.2, 0.4, 0.8, 1.6]
        assert _count(store) == 1
    finally:
        store.close()


def test_a_constraint_left_by_a_killed_writer_is_dropped(tmp_path: Path) -> None:
    flag = tmp_path / "outage"
    s = Settings(store_dir=tmp_path / "store", fault_store_outage_file=flag)
    store = open_store(s)
    migrate(store)
    flag.touch()
    with pytest.raises(Exception, match="VIOLATED_CONSTRAINT"):
        write_requests(store, [build_record("a", received("a"), completed("a"), finished("a"))])
    store.close()  # as if killed: the constraint stays in the table's metadata
    flag.unlink()
    store = open_store(s)
    try:
        rec = build_record("b", received("b"), completed("b"), finished("b"))
        assert with_retry(lambda: write_requests(store, [rec]), "write", attempts=1) == 0
        assert _count(store) == 1  # type: ignore[arg-type]
    finally:
        store.close()
