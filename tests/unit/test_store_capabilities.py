"""The store's fast paths follow a capability, not a class: any store with
``insert_from_file`` (:class:`FileInsertStore`) gets the file inserts, any other the
column-wise ones; the back-ends and the fault-injecting stores have the capability exactly
when their engine is embedded. And :func:`open_store` narrows the settings once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from pipeline.adapters.store import (
    ClickHouseStore,
    EmbeddedOutageInjectingStore,
    EmbeddedPartialWriteInjectingStore,
    EmbeddedStore,
    FileInsertStore,
    OutageInjectingStore,
    PartialWriteInjectingStore,
    StoreSettings,
    file_inserts,
    kept_events,
    write_raw_events,
    write_raw_messages,
    write_requests,
)
from pipeline.adapters.store.faults import injecting_store
from pipeline.core.processor import StreamProcessor
from pipeline.core.record import build_record
from pipeline.settings import Settings
from tests.factories import completed, finished, received
from tests.unit.test_kept_messages import _A
from tests.unit.test_store_rows import RecordingStore


class FileRecordingStore(RecordingStore):
    """A fake with the file-insert capability: records each file insert (no engine)."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[tuple[str, str, bytes]] = []

    def insert_from_file(
        self,
        table: str,
        names: Any,
        select: str,
        data: bytes | Any,
        *,
        fmt: str,
        structure: str,
        settings: dict[str, int] | None = None,
        array_join: str = "",
    ) -> None:
        body = data if isinstance(data, bytes) else b"".join(data)
        self.files.append((table, fmt, body))


def _records() -> list[Any]:
    return [build_record("a", received("a"), completed("a"), finished("a"))]


def _kept() -> list[Any]:
    return StreamProcessor("lc", keep_events=True).process([(2, 7, _A)], None).kept


WRITES = [
    ("requests", lambda store: write_requests(store, _records()), "JSONEachRow"),
    (
        "lifecycle_events",
        lambda store: write_raw_messages(store, "lc", _kept()),
        "JSONCompactEachRow",
    ),
    (
        "lifecycle_events",
        lambda store: write_raw_events(store, "lc", kept_events(_kept())),
        "JSONCompactEachRow",
    ),
]


@pytest.mark.parametrize(("table", "write", "fmt"), WRITES, ids=["requests", "messages", "events"])
def test_a_store_with_the_capability_gets_file_inserts(table: str, write: Any, fmt: str) -> None:
    store = FileRecordingStore()
    assert file_inserts(store) is store
    write(store)
    assert [(t, f) for t, f, _ in store.files] == [(table, fmt)]
    assert store.inserts == []


@pytest.mark.parametrize(("table", "write", "fmt"), WRITES, ids=["requests", "messages", "events"])
def test_a_store_without_it_gets_columns(table: str, write: Any, fmt: str) -> None:
    store = RecordingStore()
    assert file_inserts(store) is None
    write(store)
    assert [t for t, *_ in store.inserts] == [table]


@pytest.mark.parametrize(
    ("cls", "capable"),
    [
        (ClickHouseStore, False),
        (OutageInjectingStore, False),
        (PartialWriteInjectingStore, False),
        (EmbeddedStore, True),
        (EmbeddedOutageInjectingStore, True),
        (EmbeddedPartialWriteInjectingStore, True),
    ],
)
def test_the_capability_follows_the_engine(cls: type[ClickHouseStore], capable: bool) -> None:
    args = (Path("flag"),) if cls not in (ClickHouseStore, EmbeddedStore) else ()
    store = cls(None, "tailguard", *args)
    assert isinstance(store, FileInsertStore) is capable
    assert store.embedded is capable


@pytest.mark.parametrize(
    ("embedded", "partial", "outage", "expected"),
    [
        (True, None, None, None),
        (False, None, None, None),
        (True, "p", None, EmbeddedPartialWriteInjectingStore),
        (False, "p", None, PartialWriteInjectingStore),
        (True, None, "o", EmbeddedOutageInjectingStore),
        (False, None, "o", OutageInjectingStore),
        (True, "p", "o", EmbeddedPartialWriteInjectingStore),  # a partial write first
    ],
)
def test_the_fault_injecting_store_the_flags_ask_for(
    embedded: bool, partial: str | None, outage: str | None, expected: type | None
) -> None:
    store = injecting_store(
        None,
        "tailguard",
        embedded=embedded,
        partial_file=Path(partial) if partial else None,
        outage_file=Path(outage) if outage else None,
    )
    assert (type(store) if store is not None else None) is expected


def test_store_settings_are_the_settings_narrowed() -> None:
    settings = Settings(
        store_dir=Path("/tmp/s"),
        database="db1",
        clickhouse_url="http://ch:8123",
        clickhouse_user="u",
        clickhouse_password=SecretStr("pw"),
        fault_store_outage_file=Path("/tmp/o"),
    )
    narrow = StoreSettings.of(settings)
    for name in StoreSettings.__dataclass_fields__:
        assert getattr(narrow, name) == getattr(settings, name), name
    assert not narrow.embedded
    assert "pw" not in repr(narrow)
    assert StoreSettings.of(Settings()).embedded
