"""Issue 12, pure parts: contract bounds = column types, null/empty messages, one bad number
in an array, isolating the rows a store rejects, dead letters that always fit the DLQ."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError

from pipeline.adapters.reliable import (
    DLQ_MAX_VALUE_BYTES,
    _dead_position,
    dead_letter_key,
    dead_letter_message,
    dead_subposition,
    truncate_dead,
)
from pipeline.adapters.store import StoreError, is_data_error, with_retry, write_isolating
from pipeline.contract.codec import DeadLetter, SourceRef, decode_message, event_to_dict
from pipeline.contract.events import INT64_MAX, MAX_DURATION_MS, UINT16_MAX, UINT32_MAX
from tests.factories import completed, finished, received

SRC = SourceRef("lc", 3, 42)


def _with(event: Any, **fields: object) -> bytes:
    d = event_to_dict(event)
    d.update(fields)
    return json.dumps(d).encode()  # orjson refuses integers beyond 64 bits


# --- 1: every number bounded by the column that stores it -----------------------------

OVER = [
    ("engine.finished", "preemptions", UINT16_MAX + 1),  # UInt16
    ("engine.finished", "prompt_tokens", UINT32_MAX + 1),  # UInt32
    ("engine.finished", "output_tokens", UINT32_MAX + 1),
    ("engine.finished", "cached_tokens", UINT32_MAX + 1),
    ("engine.finished", "ts_unix_ns", INT64_MAX + 1),  # Int64
    ("engine.finished", "arrival_unix_ns", INT64_MAX + 1),
    ("engine.finished", "queue_ms", MAX_DURATION_MS * 2),
    ("gateway.received", "prompt_tokens", UINT32_MAX + 1),
    ("gateway.received", "ts_unix_ns", 2**64),
    ("gateway.completed", "output_tokens", UINT32_MAX + 1),
    ("gateway.completed", "total_ms", 1e300),
]
_EVENTS = {
    "engine.finished": finished("r"),
    "gateway.received": received("r"),
    "gateway.completed": completed("r"),
}


@pytest.mark.parametrize(("kind", "field", "value"), OVER)
def test_a_number_its_column_cannot_hold_is_a_dead_letter(
    kind: str, field: str, value: object
) -> None:
    d = decode_message(_with(_EVENTS[kind], **{field: value}), SRC)
    assert d.events == []
    assert len(d.dead) == 1, d.dead
    assert field in d.dead[0].reason, d.dead


@pytest.mark.parametrize(("kind", "field", "value"), OVER)
def test_the_largest_value_its_column_holds_is_accepted(
    kind: str, field: str, value: object
) -> None:
    at_bound = value - 1 if isinstance(value, int) else MAX_DURATION_MS
    if field == "ts_unix_ns" and value == 2**64:
        at_bound = INT64_MAX
    d = decode_message(_with(_EVENTS[kind], **{field: at_bound}), SRC)
    assert d.dead == []
    assert len(d.events) == 1


# --- 2: null and empty messages --------------------------------------------------------


@pytest.mark.parametrize("raw", [None, b"", b"   ", b"\n"])
def test_a_null_or_empty_message_is_a_dead_letter(raw: bytes | None) -> None:
    d = decode_message(raw, SRC)
    assert d.events == []
    assert [(x.reason.split(":")[0], x.source, x.index) for x in d.dead] == [
        ("empty_message", SRC, None)
    ]


# --- 4: one NaN inside an array -----------------------------------------------------------


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_one_non_finite_number_in_an_array_rejects_only_its_event(literal: str) -> None:
    good = [event_to_dict(completed(f"r{i}")) for i in range(3)]
    bad = orjson.dumps(event_to_dict(completed("bad"))).replace(
        b'"total_ms":100.0', b'"total_ms":' + literal.encode()
    )
    raw = b"[" + b",".join([orjson.dumps(good[0]), bad, *map(orjson.dumps, good[1:])]) + b"]"
    d = decode_message(raw, SRC)
    assert sorted(e.request_id for e in d.events) == ["r0", "r1", "r2"]
    assert len(d.dead) == 1
    assert d.dead[0].index == 1
    assert "total_ms" in d.dead[0].reason
    assert "finite" in d.dead[0].reason
    assert literal.encode() in d.dead[0].raw  # stored as received, not as null


def test_an_array_that_is_not_json_is_still_one_dead_letter() -> None:
    d = decode_message(b'[{"v": 1}, NaN', SRC)
    assert d.events == []
    assert len(d.dead) == 1
    assert d.dead[0].reason.startswith("invalid_json")


# --- 1: the rows a store rejects are isolated ----------------------------------------------


class FakeTable:
    """Rejects a whole insert when one row is poison (as the driver does), or everything
    during an outage."""

    def __init__(self, outage_calls: int = 0) -> None:
        self.rows: list[int] = []
        self.calls = 0
        self.outage_calls = outage_calls

    def write(self, rows: Sequence[int]) -> None:
        self.calls += 1
        if self.outage_calls > 0:
            self.outage_calls -= 1
            raise OperationalError("connection refused")
        if any(r < 0 for r in rows):
            raise DataError("Unable to create native array for column `preemptions`: error")
        self.rows.extend(rows)


def _retry(fn: Any, what: str) -> int:
    return with_retry(fn, what, sleep=lambda _s: None, fatal=is_data_error)


@pytest.mark.parametrize(
    ("n", "poison"),
    [(1, [0]), (2, [1]), (1000, [0]), (1000, [999]), (1000, [3, 500, 501, 998]), (7, [])],
)
def test_a_rejected_batch_is_split_until_the_offending_rows_are_isolated(
    n: int, poison: list[int]
) -> None:
    rows = [-(i + 1) if i in poison else i for i in range(n)]
    table = FakeTable()
    retries, rejected = write_isolating(table.write, rows, "write of records", retry=_retry)
    assert retries == 0
    assert sorted(table.rows) == [r for r in rows if r >= 0]
    assert [r for r, _ in rejected] == [r for r in rows if r < 0]
    assert all("store_rejected" in why and "preemptions" in why for _, why in rejected)
    # Bisection: about 2 * k * log2(n) inserts, not one per row.
    assert table.calls <= 1 + 2 * max(1, len(poison)) * (n.bit_length() + 1)


def test_an_outage_is_retried_not_split() -> None:
    table = FakeTable(outage_calls=3)
    retries, rejected = write_isolating(table.write, [1, 2, 3], "write", retry=_retry)
    assert (retries, rejected, table.rows) == (3, [], [1, 2, 3])


def test_an_outage_with_a_bounded_retry_raises() -> None:
    table = FakeTable(outage_calls=5)
    with pytest.raises(StoreError):
        write_isolating(
            table.write,
            [1, -2],
            "write",
            retry=lambda fn, w: with_retry(fn, w, attempts=1, fatal=is_data_error),
        )


@pytest.mark.parametrize(
    ("exc", "data"),
    [
        (DataError("Unable to create native array for column `a`: error"), True),
        (OverflowError("int too big to convert"), True),
        (DatabaseError("Code: 53. DB::Exception: Type mismatch (TYPE_MISMATCH)"), True),
        (DatabaseError("Code: 321. DB::Exception: out of range (VALUE_IS_OUT_OF_RANGE)"), True),
        # A constraint of the schema rejects rows; the fault injection's CHECK 0 stands
        # for an outage: retried, never split.
        (DatabaseError("Code: 469. DB::Exception: Constraint `c` is violated at row 1"), True),
        (
            DatabaseError(
                "Code: 469. DB::Exception: Constraint `tailguard_injected_outage` "
                "for table db.requests is violated at row 1. (VIOLATED_CONSTRAINT)"
            ),
            False,
        ),
        (OperationalError("Error HTTPConnectionPool: Connection refused"), False),
        (
            DatabaseError(
                "Code: 241. DB::Exception: Memory limit exceeded (MEMORY_LIMIT_EXCEEDED)"
            ),
            False,
        ),
    ],
)
def test_data_errors_are_told_from_outages(exc: Exception, data: bool) -> None:
    assert is_data_error(exc) is data


# --- 3: a dead letter always fits the DLQ ---------------------------------------------------


def test_an_oversize_dead_letter_is_stored_truncated_with_its_size_and_reason() -> None:
    raw = b"x" * (10 * 2**20)
    dead = DeadLetter(raw, "oversize: 10485760 > 1048576 bytes", SRC, None)
    value, headers = dead_letter_message(dead)
    value, headers = truncate_dead(value, headers, DLQ_MAX_VALUE_BYTES)
    h = dict(headers)
    assert len(value) == DLQ_MAX_VALUE_BYTES
    assert raw.startswith(value)
    assert h["tailguard.original.size"] == str(len(raw)).encode()
    assert h["tailguard.truncated"] == str(DLQ_MAX_VALUE_BYTES).encode()
    assert h["tailguard.reason"].startswith(b"oversize")
    # Truncated again (a DLQ with a smaller limit): the original size stays.
    value2, headers2 = truncate_dead(value, headers, 4096)
    h2 = dict(headers2)
    assert len(value2) == 4096
    assert h2["tailguard.original.size"] == str(len(raw)).encode()
    assert [k for k, _ in headers2].count("tailguard.truncated") == 1


# --- 9: a lone gateway.received does not pin the commit ----------------------------------


def test_a_lone_received_holds_the_commit_only_when_not_durable() -> None:
    from pipeline.core.join import JoinConfig, Joiner

    j = Joiner(JoinConfig())
    j.add_emitted(received("r1"), 0, 1)
    j.add_emitted(received("r2", tenant=None, prompt_tokens=None), 1, 1)
    j.add_emitted(completed("r3"), 2, 1)  # a terminal event waiting for its partner
    j.add_emitted(received("r4"), 3, 1)
    assert j.safe_offset(4) == 0
    assert j.safe_offset(4, lone_received_durable=True) == 2
    j.add_emitted(completed("r1"), 4, 1)  # r1 is no longer lone: its received is needed
    assert j.safe_offset(5, lone_received_durable=True) == 0


def test_restored_received_events_join_with_partners_read_after_a_restart() -> None:
    from pipeline.contract.codec import encode_batch
    from pipeline.core.processor import StreamProcessor

    proc = StreamProcessor("lc", keep_events=True)
    proc.init_partition(0)
    out = proc.process([(0, 0, encode_batch([received("a", priority=2)]))], 1000)
    assert out.records == []
    assert proc.safe_offsets() == {0: 1}  # durable in the raw events: not pinned
    # A restart: a fresh processor gets the received back, then reads its partners.
    fresh = StreamProcessor("lc", keep_events=True)
    assert fresh.restore_inflight(0, [(0, received("a", priority=2))]) == 1
    out = fresh.process([(0, 1, encode_batch([completed("a"), finished("a")]))], 1000)
    [rec] = out.records
    assert (rec.source, rec.priority, rec.tenant) == ("joined", 2, "t1")


def test_without_raw_events_a_lone_received_still_pins_the_commit() -> None:
    from pipeline.contract.codec import encode_batch
    from pipeline.core.processor import StreamProcessor

    proc = StreamProcessor("lc", keep_events=False)
    proc.init_partition(0)
    proc.process([(0, 0, encode_batch([received("a")])), (0, 1, encode_batch([received("b")]))], 1)
    assert proc.safe_offsets() == {0: 0}


@pytest.mark.parametrize(
    ("limit", "partitions", "sent"), [(100, 4, 1000), (7, 3, 50), (1000, 8, 999)]
)
def test_pending_joins_are_bounded_per_worker_not_per_partition(
    limit: int, partitions: int, sent: int
) -> None:
    from pipeline.contract.codec import encode_batch
    from pipeline.core.processor import StreamProcessor

    proc = StreamProcessor("lc", max_pending=limit)
    msgs = [
        (i % partitions, i // partitions, encode_batch([received(f"r{i}")])) for i in range(sent)
    ]
    for k in range(0, len(msgs), 10):
        proc.process(msgs[k : k + 10], 1000)
        assert proc.pending() <= limit
    assert proc.pending() == min(limit, sent)
    assert proc.join_counters().evicted == max(0, sent - limit)


@pytest.mark.parametrize(
    ("source", "index", "key"),
    [
        (SourceRef("lc", 3, 17), None, b"lc/3/17"),
        (SourceRef("lc", 3, 17), 4, b"lc/3/17/4"),
        (SourceRef("lc", -1, -1), None, None),  # a record the store refused: no position
    ],
)
def test_a_dead_letter_is_keyed_by_its_source_position(
    source: SourceRef, index: int | None, key: bytes | None
) -> None:
    d = DeadLetter(b"x", "bad", source, index)
    assert dead_letter_key(d) == key
    _value, headers = dead_letter_message(d, "gen-1")
    assert ("tailguard.source.topic_id", b"gen-1") in headers
    # ... and read back from the DLQ as that position, for that topic and generation
    sub = dead_subposition(index, d.raw)
    assert _dead_position(headers, "lc", "gen-1", d.raw) == (source.partition, source.offset, sub)
    assert _dead_position(headers, "lc", "gen-2", d.raw) is None  # another generation's
    assert _dead_position(headers, "other", "gen-1", d.raw) is None
    _value, untagged = dead_letter_message(d)  # a letter from before generations
    assert _dead_position(untagged, "lc", "gen-2", d.raw) == (
        source.partition, source.offset, sub,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("index", "raw_a", "raw_b", "same"),
    [
        (3, b"a", b"b", True),  # an event's index names it, whatever its bytes
        (None, b'{"event_id":"e1"}', b'{"event_id":"e1"}', True),  # the same bytes again
        (None, b'{"event_id":"e1"}', b'{"event_id":"e2"}', False),  # two events held
        (None, b"x" * 5000, b"x" * 5000 + b"tail", True),  # the same once truncated
    ],
)
def test_letters_of_one_message_are_told_apart(
    index: int | None, raw_a: bytes, raw_b: bytes, same: bool
) -> None:
    """Two events of one message quarantined (no index kept) are two letters; the same
    one read again after a restart is one."""
    assert (dead_subposition(index, raw_a) == dead_subposition(index, raw_b)) is same
    if index is None:
        assert dead_subposition(None, raw_a) < 0  # never an event's index
