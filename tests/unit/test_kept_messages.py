"""The processor keeps raw events per message (``KeptMessage``), not one tuple per event:
an array message whole (its elements are its events' bytes), a single event with its
bytes, a message with a bad event with the bytes of the events it kept. Flattened, they
are exactly the events the decoder hands on with their bytes; a message the store refuses
is written again event by event, so that only the events it refuses are dead letters."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from pipeline.adapters.store import kept_events, write_raw_isolating
from pipeline.contract.codec import SourceRef, encode_batch
from pipeline.contract.wire import decode_fast
from pipeline.core.processor import KeptMessage, StreamProcessor
from tests.factories import completed, finished, received
from tests.unit.test_store_rows import RecordingStore

_A = encode_batch([received("a"), completed("a"), finished("a")])
_ONE = encode_batch([received("b")])[1:-1]  # a single event, not in an array
_SPACED = b" [ %s ,\n %s ] " % (encode_batch([received("c")])[1:-1], _ONE)
_BAD = b"[%s,%s]" % (encode_batch([received("d")])[1:-1], b'{"v":1,"kind":"gateway.received"}')
_STATS = (
    b'[{"v":1,"kind":"engine.stats","event_id":"s:1","ts_unix_ns":1700000000000000000,'
    b'"host":"e-0","model":"m","num_running":3,"num_waiting":0,"kv_cache_usage":0.5}]'
)


@pytest.mark.parametrize(
    ("message", "whole", "n_events"),
    [
        (_A, True, 3),
        (_SPACED, True, 2),
        (_STATS, True, 1),
        (_ONE, False, 1),
        (_BAD, False, 1),  # the valid one, re-encoded by the reference decoder
        (b"[]", None, 0),
        (b"not json", None, 0),
    ],
    ids=["array", "array with spaces", "stats", "single event", "bad event", "empty", "junk"],
)
def test_each_message_is_kept_once_with_the_bytes_of_its_events(
    message: bytes, whole: bool | None, n_events: int
) -> None:
    proc = StreamProcessor("lc", keep_events=True)
    out = proc.process([(2, 7, message)], None)
    if whole is None:
        assert out.kept == []
        return
    [kept] = out.kept
    assert (kept.partition, kept.offset, len(kept.events)) == (2, 7, n_events)
    assert isinstance(kept.payload, bytes) is whole
    if whole:
        assert kept.payload is message  # no copy, no slices
    # flattened: what the decoder gives, event by event, with its bytes as received
    ref = decode_fast(message, SourceRef("lc", 2, 7))
    flat = kept_events([kept])
    assert [(p, o) for p, o, _, _ in flat] == [(2, 7)] * n_events
    assert [ev for _, _, ev, _ in flat] == ref.events
    assert [bytes(raw) for _, _, _, raw in flat] == [bytes(r) for r in ref.raws]


def test_without_keep_events_nothing_is_kept() -> None:
    proc = StreamProcessor("lc", keep_events=False)
    out = proc.process([(0, 0, _A)], None)
    assert out.kept == []
    assert proc.counters.events == 3


class RefusingStore(RecordingStore):
    """Refuses any insert holding an event of ``bad`` (as ClickHouse does a row)."""

    def __init__(self, bad: set[str]) -> None:
        super().__init__()
        self.bad = bad

    def insert_columns(self, table: str, columns: Any, names: Any, types: Any,
                       settings: dict[str, Any] | None = None) -> None:  # fmt: skip
        ids = set(dict(zip(names, columns, strict=True))["event_id"])
        if ids & self.bad:
            raise ValueError(f"Code: 6. DB::Exception: refused {sorted(ids & self.bad)}")
        super().insert_columns(table, columns, names, types, settings)


def _no_retry(fn: Any, what: str) -> int:
    fn()
    return 0


def test_a_refused_message_is_written_event_by_event_and_only_its_bad_event_is_returned() -> None:
    msgs = [(0, i, encode_batch([received(f"r{i}"), completed(f"r{i}")])) for i in range(5)]
    kept = StreamProcessor("lc", keep_events=True).process(msgs, None).kept
    assert len(kept) == 5
    store = RefusingStore({"r3:c"})
    retries, rejected = write_raw_isolating(store, "lc", kept, retry=_no_retry)
    assert retries == 0
    [(event, reason)] = rejected
    partition, offset, ev, raw = event
    assert (partition, offset, ev.event_id) == (0, 3, "r3:c")
    assert orjson.loads(bytes(raw))["event_id"] == "r3:c"
    assert "refused" in reason
    assert reason.startswith("store_rejected")
    stored = [eid for _, cols, _, _ in store.inserts for eid in cols["event_id"]]
    assert sorted(stored) == sorted(
        [f"r{i}:{k}" for i in range(5) for k in "rc" if (i, k) != (3, "c")]
    )


def test_kept_message_is_a_named_row() -> None:
    m = KeptMessage(1, 2, [], b"[]")
    assert m._asdict() == {"partition": 1, "offset": 2, "events": [], "payload": b"[]"}
