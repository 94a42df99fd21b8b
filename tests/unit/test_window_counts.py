"""The report's counts per window (issue 53, pipeline.core.window_counts): the requests
per key, the clock-skew buckets and their median, the SLOs' measured bad requests, and
the cover that reads them only where the windows kept them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from msgspec.structs import replace

from pipeline.core.cover import HOUR_NS, Cover, cover, cover_from
from pipeline.core.record import RequestRecord
from pipeline.core.skew import median_offset_ms, offset_bucket, offset_ms
from pipeline.core.slo import RecordColumns, SLOMatcher
from pipeline.core.slo_windows import SLOBadRow, WindowSLOCounts
from pipeline.core.window_counts import RequestCountRow, RequestCounts
from pipeline.core.windows import WindowAggregator, WindowConfig
from pipeline.spec.slo import SLO
from tests.slo_strategies import JOINED, slo_data, spec_from

GW_ONLY = replace(JOINED, source="gateway_only", revision=1, engine_host=None,
                  engine_arrival_unix_ns=None, gateway_overhead_ms=None, queue_ms=None)  # fmt: skip
ENFORCED = replace(JOINED, request_id="e", outcome="rejected", control_mode="enforce",
                   control_verdict="admission")  # fmt: skip


def _row(rec: RequestRecord, n: int) -> RequestCountRow:
    return RequestCountRow(rec.source, rec.outcome, rec.model, rec.priority, rec.control_mode,
                           rec.control_verdict, n)  # fmt: skip


# (name, [(record, sign)], the count rows)
COUNT_CASES: list[tuple[str, list[tuple[RequestRecord, int]], list[RequestCountRow]]] = [
    ("one joined request", [(JOINED, 1)], [_row(JOINED, 1)]),
    ("a partial taken back, its upgrade added: the partial's key nets out",
     [(GW_ONLY, 1), (GW_ONLY, -1), (JOINED, 1)], [_row(JOINED, 1)]),
    ("a take-back alone (a correction): negative",
     [(GW_ONLY, -1)], [_row(GW_ONLY, -1)]),
    ("control mode and verdict, no priority: their own keys, None first",
     [(ENFORCED, 1), (replace(JOINED, priority=None), 1), (JOINED, 1)],
     [_row(replace(JOINED, priority=None), 1), _row(JOINED, 1), _row(ENFORCED, 1)]),
    ("two models", [(replace(JOINED, model="n"), 1), (JOINED, 1), (JOINED, 1)],
     [_row(JOINED, 2), _row(replace(JOINED, model="n"), 1)]),
]  # fmt: skip


def _both(adds: list[tuple[RequestRecord, int]]) -> tuple[RequestCounts, RequestCounts]:
    """The counts of one add per record, and of one add_batch of them all."""
    one, batch = RequestCounts(), RequestCounts()
    for rec, sign in adds:
        one.add(rec, sign)
    cols = RecordColumns([r for r, _ in adds])
    batch.add_batch(cols, np.arange(len(adds)), np.array([s for _, s in adds], dtype=np.int64))
    return one, batch


@pytest.mark.parametrize(("name", "adds", "want"), COUNT_CASES, ids=[c[0] for c in COUNT_CASES])
def test_counts_per_key(name: str, adds: list[tuple[RequestRecord, int]], want: Any) -> None:
    for counts in _both(adds):
        assert counts.count_rows() == want, name


# (name, record fields, offset ms or None)
OFFSET_CASES: list[tuple[str, dict[str, Any], float | None]] = [
    ("engine 5 ms ahead, overhead 2 ms", {"gateway_received_unix_ns": 1_000_000_000,
     "engine_arrival_unix_ns": 1_006_000_000, "gateway_overhead_ms": 2.0}, 5.0),
    ("engine behind: negative", {"gateway_received_unix_ns": 1_000_000_000,
     "engine_arrival_unix_ns": 970_000_000, "gateway_overhead_ms": 4.0}, -32.0),
    ("no overhead", {"gateway_overhead_ms": None}, None),
    ("no arrival", {"engine_arrival_unix_ns": None}, None),
    ("a partial, every field set", {"source": "gateway_only"}, None),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fields", "want"), OFFSET_CASES, ids=[c[0] for c in OFFSET_CASES])
def test_offset_of_a_record(name: str, fields: dict[str, Any], want: float | None) -> None:
    got = offset_ms(replace(JOINED, **fields))
    assert got == (pytest.approx(want) if want is not None else None), name


# (offsets ms, median as quantileExact(0.5) picks it: sorted index n // 2)
MEDIAN_CASES: list[tuple[list[float], float | None]] = [
    ([], None),
    ([3.0], 3.0),
    ([1.0, 2.0], 2.0),  # index 1 of 2
    ([5.0, -1.0, 2.0], 2.0),
    ([-300_000.04, -300_000.01, -299_999.96], -300_000.0),  # to 0.1 ms, however large
    ([0.04, 0.06, 0.14, 0.16], 0.1),  # 0.14 is bucket 1: -> 0.1
]


@pytest.mark.parametrize(("offsets", "want"), MEDIAN_CASES)
def test_median_of_buckets_is_the_exact_medians_to_a_tenth(
    offsets: list[float], want: float | None
) -> None:
    buckets: dict[int, int] = {}
    for o in offsets:
        buckets[offset_bucket(o)] = buckets.get(offset_bucket(o), 0) + 1
    got = median_offset_ms(buckets)
    assert got == want
    if offsets:
        exact = sorted(offsets)[len(offsets) // 2]
        assert got is not None
        assert abs(got - exact) <= 0.05 + 1e-9


def test_skew_buckets_add_up_over_windows_and_take_backs() -> None:
    """A pair's buckets: signed, a take-back empties its bucket (not stored), and two
    windows' buckets merged give the median of all offsets."""
    a = replace(JOINED, gateway_received_unix_ns=0, engine_arrival_unix_ns=7_000_000,
                gateway_overhead_ms=2.0)  # offset 6.0  # fmt: skip
    b = replace(a, engine_arrival_unix_ns=9_000_000)  # 8.0
    for counts in _both([(a, 1), (b, 1), (b, -1), (b, 1), (a, 1)]):
        (row,) = counts.skew_rows()
        assert (row.model, row.gateway_host, row.engine_host) == ("m", "gw-0", "m-0")
        assert (row.offset_buckets, row.counts) == ([60, 80], [2, 1])
    gone = RequestCounts()
    gone.add(a)
    gone.add(a, -1)
    assert gone.skew_rows() == []


QUEUED = replace(JOINED, gateway_total_ms=500.0, queue_ms=300.0)  # late for 400 ms


# (name, SLO fields, record, measured bad)
BAD_CASES: list[tuple[str, dict[str, Any], RequestRecord, bool]] = [
    ("late, with a queue time", {}, QUEUED, True),
    ("good", {}, JOINED, False),
    ("late, no queue time (no engine)", {}, replace(QUEUED, queue_ms=None), False),
    ("a failure: bad, but no measured time", {}, replace(QUEUED, outcome="error"), False),
    ("an abort, measured", {}, replace(QUEUED, outcome="client_abort"), True),
    ("an abort, excluded", {"client_abort": "exclude"}, replace(QUEUED, outcome="client_abort"),
     False),
    ("at the threshold, strict", {"threshold_strict": True},
     replace(QUEUED, gateway_total_ms=400.0), True),
    ("at the threshold, not strict", {}, replace(QUEUED, gateway_total_ms=400.0), False),
    ("another model than the SLO selects", {"filter": {"model": ["n"]}}, QUEUED, False),
    ("no first byte, waited past the threshold: bad without a value",
     {"boundary": "gateway_ttfb_ms"}, replace(QUEUED, gateway_ttfb_ms=None), False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "fields", "rec", "want"), BAD_CASES, ids=[c[0] for c in BAD_CASES]
)
def test_measured_bad(name: str, fields: dict[str, Any], rec: RequestRecord, want: bool) -> None:
    m = SLOMatcher(SLO.model_validate(slo_data(**fields)))
    assert m.measured_bad(rec) is want, name
    assert m.measured_bad_many(RecordColumns([rec])).tolist() == [want], name


def test_window_slo_counts_split_per_slo_and_model() -> None:
    spec = spec_from([slo_data(name="s0"), slo_data(name="s1", threshold_ms=1000)], 0.5)
    adds = [(QUEUED, 1), (replace(QUEUED, model="n", queue_ms=100.0), 1), (QUEUED, 1),
            (QUEUED, -1), (JOINED, 1)]  # fmt: skip
    one, batch = WindowSLOCounts(spec), WindowSLOCounts(spec)
    for rec, sign in adds:
        one.add(rec, sign)
    batch.add_batch(RecordColumns([r for r, _ in adds]), np.arange(len(adds)),
                    np.array([s for _, s in adds], dtype=np.int64))  # fmt: skip
    want = [SLOBadRow("s0", "m", 1, 300.0, 500.0), SLOBadRow("s0", "n", 1, 100.0, 500.0)]
    assert one.bad_rows() == batch.bad_rows() == want


def test_the_window_counts_each_record_where_its_sketches_do() -> None:
    """The aggregator's counts ride with its windows (and corrections): by the record's
    end, the window's own assignment."""
    agg = WindowAggregator(0, WindowConfig(size_ms=10_000, grace_ms=0))
    t0 = JOINED.end_unix_ns - JOINED.end_unix_ns % 10_000_000_000
    first, second = (replace(JOINED, request_id=r, end_unix_ns=t0 + d * 1_000_000)
                     for r, d in (("a", 9_999), ("b", 10_000)))  # fmt: skip
    agg.add(first, 0)
    agg.add(second, 1)
    closed = agg.close(t0 // 1_000_000 + 20_000)
    assert [(w.start_ms, w.counts.count_rows() if w.counts else None) for w in closed] == [
        (t0 // 1_000_000, [_row(JOINED, 1)]),
        (t0 // 1_000_000 + 10_000, [_row(JOINED, 1)]),
    ]
    agg.add(replace(first, request_id="late"), 2)  # its window is closed: a correction
    (correction,) = agg.take_corrections()
    assert correction.correction
    assert correction.counts is not None
    assert correction.counts.count_rows() == [_row(JOINED, 1)]


H = HOUR_NS
W = 10_000_000_000
T0 = 1_796_400_000 * 1_000_000_000  # a whole hour

# (name, since, until, from_ns, closed, the cover)
FROM_CASES: list[tuple[str, int | None, int | None, int, int, Cover]] = [
    ("every window kept: cover itself", T0, T0 + 2 * H, 0, T0 + 3 * H,
     cover(T0, T0 + 2 * H, closed_ns=T0 + 3 * H, window_ns=W)),
    ("kept from the second hour: the first read from requests", T0, T0 + 2 * H, T0 + H,
     T0 + 3 * H, Cover(hours=((T0 + H, T0 + 2 * H),), rest=((T0, T0 + H),))),
    ("unbounded start", None, T0 + 2 * H, T0 + H, T0 + 3 * H,
     Cover(hours=((T0 + H, T0 + 2 * H),), rest=((None, T0 + H),))),
    ("kept only after the range: all requests", T0, T0 + H, T0 + 2 * H, T0 + 3 * H,
     Cover(rest=((T0, T0 + H),))),
    ("kept from after the closed windows: all requests", T0, None, T0 + 2 * H, T0 + H,
     Cover(rest=((T0, None),))),
    ("kept before the range: cover itself", T0 + H, T0 + 2 * H, T0, T0 + 3 * H,
     cover(T0 + H, T0 + 2 * H, closed_ns=T0 + 3 * H, window_ns=W)),
]  # fmt: skip


@pytest.mark.parametrize(
    "case", FROM_CASES, ids=[c[0] for c in FROM_CASES]
)  # fmt: skip
def test_cover_from(case: tuple[str, int | None, int | None, int, int, Cover]) -> None:
    name, since, until, from_ns, closed, want = case
    assert cover_from(since, until, from_ns=from_ns, closed_ns=closed, window_ns=W) == want, name
