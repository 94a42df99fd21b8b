"""Deferred, vectorised window adds (issue 14) give exactly the windows of per-record adds.

``WindowAggregator.add`` only decides lateness and buffers; the buffer is applied per batch
(numpy keys, counts, sketch rows, SLO masks) before anything reads or closes a window.
The reference below applies every add at once, one record at a time, by the rules the
aggregator had before (scalar SLO classification, one ledger entry after another).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from pipeline.core.ledger import RETRACTED, code_order
from pipeline.core.record import BOUNDARIES, RequestRecord
from pipeline.core.slo_windows import slo_factory
from pipeline.core.windows import (
    ALL_KEY,
    OTHER_KEY,
    ClosedWindow,
    WindowAggregator,
    WindowConfig,
    _Rows,
    ledger_code,
    ledger_key,
    record_key,
)
from pipeline.spec.slo import SLOSpec
from tests.slo_strategies import JOINED, records, specs


class PerRecord(WindowAggregator):
    """Every add applied at once, record by record (the aggregator before issue 14)."""

    def add(self, rec: RequestRecord, lower_offset: int, sign: int = 1) -> bool:
        on_time = super().add(rec, lower_offset, sign)
        self._apply_pending()
        return on_time

    def _apply_pending(self) -> None:
        pending, self._pending = self._pending, []
        for rec, start, sign, lower_offset, late in pending:
            self._apply_one(rec, start, sign, lower_offset, late=late)

    def _apply_one(
        self, rec: RequestRecord, start: int, sign: int, lower_offset: int, *, late: bool
    ) -> None:
        c = self._counters
        table = self._corrections if late else self._open
        win = table.get(start)
        if win is None:
            win = table[start] = self._new_window(start, lower_offset)
        elif not late and 0 <= lower_offset < win.min_offset:
            win.min_offset = lower_offset
        if sign > 0:
            if late:
                c.corrected += 1
            else:
                c.records += 1
        else:
            c.retracted += 1
        key = record_key(rec)
        if key not in win.records and len(win.records) >= self.config.max_keys + 1:
            c.folded_keys += 1
            key = OTHER_KEY
        win.records[key] = win.records.get(key, 0) + sign
        win.records[ALL_KEY] = win.records.get(ALL_KEY, 0) + sign
        row = np.array([[getattr(rec, b) for b in BOUNDARIES]], dtype=np.float64)
        for k in (key, ALL_KEY):
            rows = win.rows.setdefault(k, _Rows())
            (rows.added if sign > 0 else rows.removed).append(row)
        if win.slos is not None:
            win.slos.add(rec, sign)
        win.counts.add(rec, sign)
        lk = ledger_key(rec)
        code = ledger_code(rec) | (0 if sign > 0 else RETRACTED)
        have = win.ledger.get(lk)
        if have is None or code_order(code) > code_order(have):
            win.ledger[lk] = code
        win.dirty = True


def _seen(w: ClosedWindow) -> tuple[Any, ...]:
    """A window as compared: key order of the counts included, sketches bin for bin (and
    their float sums exactly), SLO rows and measured bad requests, ledger, the report's
    counts and clock-skew buckets (pipeline.core.window_counts)."""
    slos = None if w.slos is None else (w.slos.rows(), w.slos.bad_rows())
    counts = None if w.counts is None else (w.counts.count_rows(), w.counts.skew_rows())
    return (
        w.partition, w.start_ms, w.size_ms, list(w.records.items()), w.sketches, slos,
        w.correction, w.ledger, counts,
    )  # fmt: skip


@st.composite
def window_records(draw: st.DrawFn) -> RequestRecord:
    return replace(
        draw(records(retries=True)),
        request_id=draw(st.sampled_from(["a", "b", "c"])),  # repeats: ledger versions
        revision=draw(st.integers(0, 3)),
        model=draw(st.sampled_from(["m", "n", "o"])),
        priority=draw(st.sampled_from([None, 0, 1, 3, 20])),
        end_unix_ns=draw(st.integers(0, 40_000)) * 1_000_000 + draw(st.integers(0, 999_999)),
    )


ADD = st.tuples(
    st.just("add"), window_records(), st.integers(-1, 40), st.sampled_from([1, 1, 1, -1])
)
OPS = st.one_of(
    ADD,
    ADD,
    ADD,
    st.tuples(st.just("close"), st.integers(0, 80_000), st.none() | st.integers(0, 40_000)),
    st.tuples(st.just("corrections")),
    st.tuples(st.just("provisional"), st.integers(0, 40_000)),
    st.tuples(st.just("read")),
)


def _step(agg: WindowAggregator, op: tuple[Any, ...]) -> Any:
    match op:
        case ("add", rec, offset, sign):
            return agg.add(rec, offset, sign)
        case ("close", watermark, hold):
            return [_seen(w) for w in agg.close(watermark, hold)]
        case ("corrections",):
            return [_seen(w) for w in agg.take_corrections()]
        case ("provisional", watermark):
            return [_seen(w) for w in agg.provisional(watermark)]
        case _:
            return (agg.min_open_offset(), agg.open_windows, agg.counters, agg.horizon_ms)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(OPS, max_size=80),
    st.none() | specs(retries=True),
    st.integers(1, 4),
    st.sampled_from([0, 5_000, 30_000]),
)
def test_deferred_adds_equal_per_record_adds(
    ops: list[tuple[Any, ...]], spec: SLOSpec | None, max_keys: int, grace_ms: int
) -> None:
    config = WindowConfig(size_ms=10_000, grace_ms=grace_ms, max_keys=max_keys)
    deferred = WindowAggregator(3, config, slo_factory(spec))
    reference = PerRecord(3, config, slo_factory(spec))
    for op in ops:
        assert _step(deferred, op) == _step(reference, op), op
    assert [_seen(w) for w in deferred.drain()] == [_seen(w) for w in reference.drain()]
    assert deferred.counters == reference.counters


def test_a_batch_over_many_windows_and_keys_folds_in_record_order() -> None:
    """One batch: records of two windows (one of them a correction), keys folded past
    max_keys in the order records meet them, a take-back among them."""
    base = JOINED  # model m, priority 1, 100 prompt tokens
    config = WindowConfig(size_ms=10_000, grace_ms=0, max_keys=2)
    deferred, reference = WindowAggregator(0, config), PerRecord(0, config)
    for agg in (deferred, reference):
        agg.close(20_000)  # windows before 20 s are closed: their records are corrections
    recs = [
        replace(base, model=m, request_id=f"r{i}", end_unix_ns=t * 1_000_000)
        for i, (m, t) in enumerate(
            [("a", 25_000), ("b", 5_000), ("c", 26_000), ("d", 27_000), ("a", 28_000)]
        )
    ]
    for agg in (deferred, reference):
        assert [agg.add(r, i) for i, r in enumerate(recs)] == [True, False, True, True, True]
        agg.add(recs[2], -1, sign=-1)
    assert deferred.counters.folded_keys == reference.counters.folded_keys == 1
    got = [_seen(w) for w in deferred.drain()]
    assert got == [_seen(w) for w in reference.drain()]
    (open_win, correction) = got
    assert open_win[3] == [
        (("a", "1", "<512"), 2),
        (ALL_KEY, 3),
        (("c", "1", "<512"), 0),
        (OTHER_KEY, 1),
    ]
    assert correction[6] is True


def test_equal_versions_in_one_batch_keep_the_first_in_the_ledger() -> None:
    """Two records of one request with the same version order (a gateway-only and an
    engine-only partial): the ledger keeps the first, as one add after another did."""
    gateway = replace(JOINED, request_id="a", revision=0, source="gateway_only")
    engine = replace(gateway, source="engine_only")
    for agg in (WindowAggregator(0), PerRecord(0)):
        agg.add(gateway, 1)
        agg.add(engine, 2)
        (win,) = agg.drain()
        assert win.ledger == {"a": ledger_code(gateway)} == {"a": 0}
