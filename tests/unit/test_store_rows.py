"""Row formats of the store adapter: each named row format fills exactly its table's column
list, by name, and the writers hand the store those columns (a recording fake store)."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.adapters.sketch_sql import SKETCH_COLUMNS
from pipeline.adapters.store import (
    BUDGET_EVENT_COLUMNS,
    CHECKPOINT_COLUMNS,
    CLOCK_SKEW_FIELDS,
    CONTROL_COLUMNS,
    EVENT_COLUMNS,
    REQUEST_COLUMNS,
    REQUEST_COUNT_FIELDS,
    SLO_BAD_FIELDS,
    SLO_COUNT_FIELDS,
    SLO_ROW_BOUNDARY,
    WINDOW_COLUMNS,
    BudgetEventRow,
    Checkpoint,
    ControlRow,
    EventRow,
    WindowRow,
    raw_event_columns,
    record_from_row,
    records_from_columns,
    request_columns,
    window_columns,
    window_rows,
    windows_columns,
    write_audit,
    write_checkpoints,
    write_raw_events,
    write_windows,
)
from pipeline.contract.codec import SourceRef, encode_batch
from pipeline.contract.events import Event
from pipeline.contract.wire import decode_fast
from pipeline.core.sketch import SketchColumns
from pipeline.core.slo_windows import SLOBadRow, SLOWindowRow
from pipeline.core.window_counts import ClockSkewRow, RequestCountRow
from pipeline.core.windows import ClosedWindow
from tests.factories import completed, finished, joined, received


def _names(spec: tuple[tuple[str, str], ...]) -> list[str]:
    return [n for n, _ in spec]


_WINDOW_FIELDS = [
    n for f in dataclasses.fields(WindowRow) for n in (
        _names(SKETCH_COLUMNS) if f.name == "sketch" else [f.name]
    )
]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "spec"),
    [
        (list(EventRow._fields), EVENT_COLUMNS),
        (list(ControlRow._fields), CONTROL_COLUMNS),
        (list(BudgetEventRow._fields), BUDGET_EVENT_COLUMNS),
        (_WINDOW_FIELDS, WINDOW_COLUMNS),
        (
            ["group_id", "source_topic", *(f.name for f in dataclasses.fields(Checkpoint))],
            CHECKPOINT_COLUMNS,
        ),
    ],
    ids=["lifecycle_events", "control_signals", "budget_events", "window_sketches", "checkpoints"],
)
def test_row_format_fills_its_column_list(fields: list[str], spec: Any) -> None:
    assert fields == _names(spec)


def test_slo_counts_map_type_names_its_fields_in_order() -> None:
    slo_type = dict(WINDOW_COLUMNS)["slo_counts"]
    inner = ", ".join(f"{n} {t}" for n, t in SLO_COUNT_FIELDS)
    assert slo_type == f"Map(String, Tuple({inner}))"
    assert {n for n, _ in SLO_COUNT_FIELDS} <= {f.name for f in dataclasses.fields(SLOWindowRow)}


def test_the_report_counts_types_name_their_rows_fields_in_order() -> None:
    """The '__slo__' row's report counts (sql/0018): each tuple names its core row's
    fields, in order, and the column's type is the array of them."""
    for column, fields, row in (
        ("request_counts", REQUEST_COUNT_FIELDS, RequestCountRow),
        ("slo_bad", SLO_BAD_FIELDS, SLOBadRow),
        ("clock_skew", CLOCK_SKEW_FIELDS, ClockSkewRow),
    ):
        inner = ", ".join(f"{n} {t}" for n, t in fields)
        assert dict(WINDOW_COLUMNS)[column] == f"Array(Tuple({inner}))", column
        assert [n for n, _ in fields] == [f.name for f in dataclasses.fields(row)], column


class RecordingStore:
    """A store that keeps each insert's columns by name (no engine)."""

    database = "tailguard"

    def __init__(self) -> None:
        self.inserts: list[tuple[str, dict[str, list[Any]], dict[str, str], Any]] = []

    def command(self, sql: str) -> Any:
        raise AssertionError("no commands expected")

    def query_rows(self, sql: str, parameters: dict[str, Any] | None = None) -> list[Any]:
        raise AssertionError("no queries expected")

    def query_arrow(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        raise AssertionError("no queries expected")

    def insert_columns(
        self,
        table: str,
        columns: Any,
        names: Any,
        types: Any,
        settings: dict[str, Any] | None = None,
    ) -> None:
        assert len(columns) == len(names) == len(types)
        cols = {n: list(c) for n, c in zip(names, columns, strict=True)}
        assert len({len(c) for c in cols.values()}) == 1, "columns of unequal length"
        self.inserts.append((table, cols, dict(zip(names, types, strict=True)), settings))

    def close(self) -> None:
        pass


def _kept(topic: str) -> list[Any]:
    """Events as the processor keeps them: (partition, offset, event, its bytes)."""
    events: list[Event] = [received("a"), completed("a"), finished("a", eid="a:f")]
    msg = encode_batch(events)
    decoded = decode_fast(msg, SourceRef(topic, 3, 41))
    assert not decoded.dead
    return [(3, 41, ev, raw) for ev, raw in zip(decoded.events, decoded.raws, strict=True)]


def test_raw_event_columns_by_name_with_the_bytes_as_sent() -> None:
    kept = _kept("lc")
    store = RecordingStore()
    write_raw_events(store, "lc", kept)
    write_raw_events(store, "lc", [])  # nothing: no insert
    [(table, cols, types, settings)] = store.inserts
    assert (table, types, settings) == ("lifecycle_events", dict(EVENT_COLUMNS), None)
    assert list(cols) == _names(EVENT_COLUMNS)
    for i, (p, off, ev, raw) in enumerate(kept):
        row = {n: c[i] for n, c in cols.items()}
        assert row == {
            "event_id": ev.event_id, "kind": ev.kind, "request_id": ev.request_id,
            "ts_unix_ns": ev.ts_unix_ns, "host": ev.host, "model": ev.model,
            "source_topic": "lc", "source_partition": p, "source_offset": off,
            "payload": bytes(raw),
        }  # fmt: skip
        # the payload is the event's own slice of the message, not a re-encoding
        assert orjson.loads(row["payload"])["event_id"] == ev.event_id
    assert raw_event_columns("lc", kept) == list(cols.values())


def _sketch(count: int, zero: int = 0) -> SketchColumns:
    keys, counts = ([7], [count - zero]) if count > zero else ([], [])
    return SketchColumns(count, 1.5 * count, 1.0, 2.0, zero, keys, counts, [], [])


class _SLOs:
    def rows(self) -> list[SLOWindowRow]:
        return [
            SLOWindowRow("ttft", "slo", "ttft_engine_ms", 300.0, 0.99, 5, 4, 0, 0.0),
            SLOWindowRow("tier", "blended", "", 0.0, 0.9, 5, 3, 1, 0.5),
        ]

    def bad_rows(self) -> list[SLOBadRow]:
        return [SLOBadRow("ttft", "m", 1, 250.0, 400.0)]


@pytest.mark.parametrize("correction", [False, True])
def test_window_rows_by_name(correction: bool) -> None:
    key, star = ("m", "1", "small"), ("*", "*", "*")
    empty = SketchColumns(0, 0.0, math.inf, -math.inf, 0, [], [], [], [])
    win = ClosedWindow(
        partition=2, start_ms=1_700_000_010_000, size_ms=10_000,
        records={key: 5, star: 5},
        sketches={(key, "queue_ms"): _sketch(5, zero=1), (star, "queue_ms"): _sketch(5),
                  (key, "tpot_ms"): empty},  # cancelled out: no row
        slos=_SLOs(), correction=correction, ledger={"a": 1, "b": 5},  # type: ignore[arg-type]
    )  # fmt: skip
    rows = window_rows(win, "lc", 0.01, through_offset=99)
    assert [(r.model, r.boundary) for r in rows] == [
        ("*", "queue_ms"),
        ("m", "queue_ms"),
        ("*", SLO_ROW_BOUNDARY),
    ]
    start = datetime.fromtimestamp(1_700_000_010, tz=UTC)
    for r in rows:
        assert (r.window_start, r.window_ms, r.source_topic, r.partition, r.correction) == (
            start,
            10_000,
            "lc",
            2,
            int(correction),
        )
        assert r.relative_accuracy == 0.01
    cell = rows[1]
    assert (cell.priority, cell.ctx_bucket, cell.records, cell.sketch) == (
        "1",
        "small",
        5,
        win.sketches[(key, "queue_ms")],
    )
    assert (cell.slo_counts, cell.through_offset, cell.ledger_ids) == ({}, 0, [])
    slo = rows[-1]
    assert (slo.records, slo.sketch.count, slo.sketch.min, slo.sketch.max) == (
        5,
        0,
        math.inf,
        -math.inf,
    )
    assert slo.slo_counts == {
        "ttft": ("slo", "ttft_engine_ms", 300.0, 0.99, 5, 4, 0, 0.0),
        "tier": ("blended", "", 0.0, 0.9, 5, 3, 1, 0.5),
    }
    assert (slo.through_offset, slo.ledger_ids, slo.ledger_versions) == (99, ["a", "b"], [1, 5])

    store = RecordingStore()
    write_windows(store, [win], "lc", 0.01, "tok-1", through_offsets={2: 99})
    [(table, cols, types, settings)] = store.inserts
    assert (table, types) == ("window_sketches", dict(WINDOW_COLUMNS))
    assert settings is not None
    assert settings["insert_deduplication_token"] == "tok-1"
    assert cols["boundary"] == ["queue_ms", "queue_ms", SLO_ROW_BOUNDARY]
    assert cols["zero_count"] == [0, 1, 0]
    assert cols["pos_counts"] == [[5], [4], []]
    assert cols["ledger_ids"] == [[], [], ["a", "b"]]
    assert cols["through_offset"] == [0, 0, 99]


class _Rows:
    def __init__(self, rows: list[SLOWindowRow]) -> None:
        self._rows = rows

    def rows(self) -> list[SLOWindowRow]:
        return self._rows

    def bad_rows(self) -> list[SLOBadRow]:
        return [SLOBadRow(r.slo, "m", r.total, 1.5 * r.total, 2.5 * r.total) for r in self._rows]


_KEYS = st.tuples(st.sampled_from(["m", "n", "*"]), st.sampled_from(["0", "1", "*"]),
                  st.sampled_from(["small", "*"]))  # fmt: skip
_BINS = st.lists(st.integers(-3, 3), max_size=3)
_SKETCHES = st.builds(
    SketchColumns, st.integers(-2, 5), st.floats(-10, 10), st.floats(-10, 10),
    st.floats(-10, 10), st.integers(-1, 2), _BINS, _BINS, _BINS, _BINS,
)  # fmt: skip
# (a count of 0 and no bins: a cell that cancelled out, which gets no row)
_SLO_ROWS = st.lists(
    st.builds(SLOWindowRow, st.sampled_from(["ttft", "tier"]), st.sampled_from(["slo", "blended"]),
              st.just("ttft_engine_ms"), st.floats(0, 500), st.floats(0, 1), st.integers(0, 9),
              st.integers(0, 9), st.integers(0, 9), st.floats(0, 1)),
    max_size=2,
)  # fmt: skip
_WINDOWS = st.builds(
    ClosedWindow,
    partition=st.integers(0, 3),
    start_ms=st.integers(1_700_000_000_000, 1_800_000_000_000),
    size_ms=st.sampled_from([10_000, 60_000]),
    records=st.dictionaries(_KEYS, st.integers(-3, 9), max_size=4),
    sketches=st.dictionaries(
        st.tuples(_KEYS, st.sampled_from(["queue_ms", "tpot_ms"])), _SKETCHES, max_size=6
    ),
    slos=st.none() | _SLO_ROWS.map(_Rows),
    correction=st.booleans(),
    ledger=st.dictionaries(st.text("abc", min_size=1, max_size=3), st.integers(0, 7), max_size=4),
)


@settings(max_examples=300, deadline=None)
@given(
    windows=st.lists(_WINDOWS, max_size=4),
    through=st.dictionaries(st.integers(0, 3), st.integers(0, 10**9)),
)
def test_windows_columns_equal_the_columns_of_the_named_rows(
    windows: list[ClosedWindow], through: dict[int, int]
) -> None:
    """The writer's column-wise build (no row object per row) is the reference: the
    columns of the named rows (:func:`window_rows`, :func:`window_columns`)."""
    rows = [r for w in windows for r in window_rows(w, "lc", 0.01, through.get(w.partition, 0))]
    assert windows_columns(windows, "lc", 0.01, through) == window_columns(rows)
    store = RecordingStore()
    write_windows(store, windows, "lc", 0.01, "tok", through_offsets=through)
    assert [cols for _, cols, _, _ in store.inserts] == (
        [dict(zip(_names(WINDOW_COLUMNS), window_columns(rows), strict=True))] if rows else []
    )


def test_checkpoints_and_audit_columns_by_name() -> None:
    store = RecordingStore()
    write_checkpoints(
        store, "g", "lc", [Checkpoint(1, 10, 20, 30, 4, 5, 6), Checkpoint(2, 11, 21, 31)]
    )
    write_checkpoints(store, "g", "lc", [])
    at = datetime(2026, 1, 1, tzinfo=UTC)
    control = ControlRow(
        scope="m", seq=3, level=2, phase="enter", issued_at=at, expires_at=at, event_time=at,
        reason="r", figures="{}", actions="{}", notify_customer=False, budget_exhausted=True,
        heartbeat=False, kid="k1", signal="{...}",
    )  # fmt: skip
    budget = BudgetEventRow(slo="ttft", event="budget_exhausted", event_time=at, details="{}")
    write_audit(store, [control], [budget])
    (t1, ck, _, _), (t2, cs, _, _), (t3, be, _, _) = store.inserts
    assert (t1, t2, t3) == ("worker_checkpoints", "control_signals", "budget_events")
    assert ck == {
        "group_id": ["g", "g"], "source_topic": ["lc", "lc"], "partition": [1, 2],
        "close_horizon_ms": [10, 11], "watermark_ms": [20, 21], "committed_offset": [30, 31],
        "corrected_records": [4, 0], "quarantined_events": [5, 0], "replayed_records": [6, 0],
    }  # fmt: skip
    assert cs == {n: [getattr(control, n)] for n in ControlRow._fields}
    assert be == {n: [getattr(budget, n)] for n in BudgetEventRow._fields}


def _stored_records() -> list[Any]:
    """Records whose stored values differ from their fields: no tenant, hosts, flags, a
    superseded attempt, a conflict (the store version); a joined, an engine-only and a
    gateway-only one."""
    base = joined([received("a", tenant=None), completed("a"), finished("a")])
    base += joined([finished("b"), received("c", tenant="t2"), completed("c")])
    (a, *rest) = base
    return [
        a,
        msgspec.structs.replace(a, request_id="a", attempt=2, flags=("x", "y"), conflicts=2),
        msgspec.structs.replace(a, request_id="d", superseded=True, gateway_host=None),
        *rest,
    ]


@pytest.mark.parametrize("n", [0, 1, 5])
def test_records_from_stored_columns_equal_those_from_stored_rows(n: int) -> None:
    """The statement's columnar read makes the records :func:`record_from_row` makes of
    the same rows."""
    records = _stored_records()[:n]
    stored = request_columns(records)
    assert len(stored) == len(REQUEST_COLUMNS)
    by_row = [record_from_row(row) for row in zip(*stored, strict=True)]
    assert by_row == records  # (the round trip itself)
    assert records_from_columns(stored) == by_row


def test_stored_columns_of_another_width_are_refused() -> None:
    with pytest.raises(ValueError, match="columns"):
        records_from_columns([[]] * (len(REQUEST_COLUMNS) - 1))
