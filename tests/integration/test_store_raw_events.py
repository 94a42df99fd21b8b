"""The embedded store takes the kept raw events as JSON lines the engine converts (off the
GIL): every stored value equals what the column-wise insert (the path a ClickHouse server
over HTTP takes) stores for the same events, and each payload is the event's bytes as the
producer sent them, byte for byte, on the real engine."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from pipeline.adapters import store as st
from pipeline.contract.codec import SourceRef
from pipeline.contract.wire import decode_fast
from pipeline.core.processor import KeptMessage, StreamProcessor
from pipeline.settings import Settings
from tests.factories import T0_NS, completed, finished, received

pytestmark = pytest.mark.integration

_ALL = "SELECT {} FROM tailguard.lifecycle_events ORDER BY source_offset, event_id".format(
    ", ".join(n for n, _ in st.EVENT_COLUMNS)
)


def _json(ev: object) -> bytes:
    return orjson.dumps(ev.model_dump(mode="json", exclude_none=True))  # type: ignore[attr-defined]


_STATS = (
    b'{"v":1,"kind":"engine.stats","event_id":"s:1","ts_unix_ns":%d,"host":"e-0",'
    b'"model":"m","num_running":3,"num_waiting":0,"kv_cache_usage":0.5}' % (T0_NS + 7)
)
_PRETTY = orjson.dumps(orjson.loads(_json(received("c"))), option=orjson.OPT_INDENT_2)
# an escaped \u00e9 in one place, raw UTF-8 in others
_ESCAPED = _json(received('d "q" \\ \u00e9\u4e2d', model="m\u00e9"))
_ESCAPED = _ESCAPED.replace(b"\xc3\xa9", b"\\u00e9", 1)
# (what the message is, its bytes): every shape of event bytes the decoder hands on
MESSAGES: list[tuple[str, bytes]] = [
    ("array of events", b"[" + b",".join(_json(e) for e in (received("a"), completed("a"))) + b"]"),
    ("array with spaces", b' [ %s ,\n %s ] ' % (_json(finished("a")), _json(received("b")))),
    ("one event", _json(completed("b"))),
    ("one event, whitespace around it", b"  " + _json(finished("b")) + b"\r\n"),
    ("one event, pretty-printed", _PRETTY),
    ("escapes and UTF-8", _ESCAPED),
    ("a string with braces", _json(received('e}{"', model="{m}"))),
    ("stats (no request id)", _STATS),
    ("a repeated key (the decoder keeps the last)", _json(received("f"))[:-1] + b',"host":"gw-9"}'),
]  # fmt: skip


def _kept() -> list[st.KeptEvent]:
    kept: list[st.KeptEvent] = []
    for off, (what, raw) in enumerate(MESSAGES):
        d = decode_fast(raw, SourceRef("lc", 3, off))
        assert not d.dead, (what, d.dead)
        assert d.events, what
        kept.extend((3, off, ev, r) for ev, r in zip(d.events, d.raws, strict=True))
    return kept


def test_json_insert_stores_what_the_column_insert_stores(tmp_path: Path) -> None:
    store = st.open_store(Settings(store_dir=tmp_path / "store"))
    try:
        # the factories' events are from 2023 (and a TTL past 2106 overflows DateTime)
        st.migrate(store, raw_ttl_days=3650)
        assert store.embedded
        kept = _kept()
        st.write_raw_events(store, "lc", kept)  # the embedded path: JSON into the engine
        by_json = store.query_rows(_ALL)
        store.command("TRUNCATE TABLE tailguard.lifecycle_events")
        columns = st.raw_event_columns("lc", kept)
        st._insert_columns(store, "lifecycle_events", st.EVENT_COLUMNS, columns)
        by_columns = store.query_rows(_ALL)
        assert len(by_json) == len(kept)
        assert by_json == by_columns
        payload = [n for n, _ in st.EVENT_COLUMNS].index("payload")
        stored = {(r[0], r[8]): r[payload] for r in by_json}  # (event_id, offset)
        for _, off, ev, raw in kept:
            assert stored[ev.event_id, off].encode() == bytes(raw), ev.event_id
        assert ("a:r", 0) in stored
        assert len({r[2] for r in by_json}) == 7  # request ids
        assert next(r for r in by_json if r[0] == "f:r")[4] == "gw-9"  # the decoded host
    finally:
        store.close()


@pytest.mark.parametrize("twice", [False, True], ids=["each event once", "a message twice"])
def test_a_batch_stores_one_row_per_event_as_the_column_insert_does(
    tmp_path: Path, twice: bool
) -> None:
    """The JSON insert skips the engine's in-block merge only for a batch without a repeated
    event: a message delivered twice in one batch still leaves one row per event in the
    part written (no FINAL, no background merge), as the column-wise insert does."""
    store = st.open_store(Settings(store_dir=tmp_path / "store"))
    try:
        st.migrate(store, raw_ttl_days=3650)
        kept = _kept()
        if twice:  # the first message again, at the next offset (a redelivery)
            again = len(MESSAGES)
            kept += [(p, again, ev, raw) for p, off, ev, raw in kept if off == 0]
        st.write_raw_events(store, "lc", kept)
        by_json = store.query_rows(_ALL)
        store.command("TRUNCATE TABLE tailguard.lifecycle_events")
        columns = st.raw_event_columns("lc", kept)
        st._insert_columns(store, "lifecycle_events", st.EVENT_COLUMNS, columns)
        assert by_json == store.query_rows(_ALL)
        assert len(by_json) == len({ev.event_id for _, _, ev, _ in kept}) == len(_kept())
        parts = "SELECT count() FROM system.parts WHERE active AND table = 'lifecycle_events'"
        assert store.query_rows(parts) == [(1,)]  # one part: nothing merged in the background
    finally:
        store.close()


def _messages(with_repeated_key: bool) -> list[KeptMessage]:
    """MESSAGES as the processor keeps them (whole when an array), with or without the one
    whose event repeats a key (the engine refuses to read it: the batch is written from
    the decoded fields instead)."""
    proc = StreamProcessor("lc", keep_events=True)
    kept: list[KeptMessage] = []
    for off, (what, raw) in enumerate(MESSAGES):
        if "repeated key" in what and not with_repeated_key:
            continue
        kept += proc.process([(3, off, raw)], None).kept
    return kept


@pytest.mark.parametrize("repeated", [False, True], ids=["as sent", "a repeated key"])
def test_kept_messages_store_what_the_column_insert_stores(
    tmp_path: Path, repeated: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's path: whole messages, read by the engine (twice: fields and bytes), or
    from the decoded fields when the engine cannot read an event as the decoder did."""
    store = st.open_store(Settings(store_dir=tmp_path / "store"))
    try:
        st.migrate(store, raw_ttl_days=3650)
        kept = _messages(repeated)
        assert any(isinstance(m.payload, bytes) for m in kept)  # arrays kept whole
        with caplog.at_level("INFO", logger="pipeline.adapters.store"):
            st.write_raw_messages(store, "lc", kept)
        assert ("writing the decoded fields" in caplog.text) is repeated
        by_messages = store.query_rows(_ALL)
        store.command("TRUNCATE TABLE tailguard.lifecycle_events")
        flat = st.kept_events(kept)
        st._insert_columns(
            store, "lifecycle_events", st.EVENT_COLUMNS, st.raw_event_columns("lc", flat)
        )
        assert by_messages == store.query_rows(_ALL)
        assert len(by_messages) == len(flat) == sum(len(m.events) for m in kept)
        payload = [n for n, _ in st.EVENT_COLUMNS].index("payload")
        stored = {(r[0], r[8]): r[payload] for r in by_messages}
        for _, off, ev, raw in flat:
            assert stored[ev.event_id, off].encode() == bytes(raw), ev.event_id
        if repeated:
            assert next(r for r in by_messages if r[0] == "f:r")[4] == "gw-9"
    finally:
        store.close()
