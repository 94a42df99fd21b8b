from __future__ import annotations

import msgspec
import pytest

from pipeline.core.record import RequestRecord, build_record
from pipeline.core.windows import (
    ALL_KEY,
    OTHER_KEY,
    WindowAggregator,
    WindowConfig,
    rollup_start,
    window_start,
)
from tests.factories import completed, finished, received


@pytest.mark.parametrize(
    ("ts", "size", "start"),
    [(0, 10, 0), (9, 10, 0), (10, 10, 10), (19_999, 10_000, 10_000), (-1, 10, -10), (-10, 10, -10)],
)
def test_window_start(ts: int, size: int, start: int) -> None:
    assert window_start(ts, size) == start


@pytest.mark.parametrize(
    ("start", "rollup", "expected"), [(50_000, 60_000, 0), (60_000, 60_000, 60_000)]
)
def test_rollup_start(start: int, rollup: int, expected: int) -> None:
    assert rollup_start(start, rollup) == expected


def _rec(end_ms: int, *, model: str = "m", prio: int = 1, rid: str = "r") -> RequestRecord:
    rec = build_record(
        rid,
        received(rid, priority=prio, model=model),
        completed(rid, model=model),
        finished(rid, model=model),
    )
    return msgspec.structs.replace(rec, end_unix_ns=end_ms * 1_000_000)


def test_close_once_after_grace_then_late() -> None:
    agg = WindowAggregator(0, WindowConfig(size_ms=10_000, grace_ms=5_000))
    assert agg.add(_rec(1_000), 7)
    assert agg.add(_rec(9_999), 3)
    assert agg.min_open_offset() == 3
    assert agg.close(14_999) == []
    (win,) = agg.close(15_000)
    assert (win.start_ms, win.records[ALL_KEY]) == (0, 2)
    assert win.sketches[(ALL_KEY, "gateway_total_ms")].count == 2
    assert agg.close(99_000) == []  # emitted once
    assert not agg.add(_rec(5_000), 9)  # window closed: late, so a correction of it
    assert agg.counters.corrected == 1
    assert agg.min_open_offset() == 9  # until the correction is taken (and written)
    (corr,) = agg.take_corrections()
    assert (corr.correction, corr.start_ms, corr.records[ALL_KEY]) == (True, 0, 1)
    assert corr.sketches[(ALL_KEY, "gateway_total_ms")].count == 1
    assert agg.take_corrections() == []
    assert agg.min_open_offset() is None


@pytest.mark.parametrize(
    ("partial_end_ms", "joined_end_ms", "close_before", "rows"),
    [
        # (window, correction?) -> records of ALL_KEY in the emitted windows/corrections
        (1_000, 2_000, None, {(0, False): 1}),  # both in one open window: net one record
        (1_000, 12_000, None, {(0, False): 0, (10_000, False): 1}),  # moved between open windows
        (1_000, 2_000, 15_000, {(0, False): 1, (0, True): 0}),  # closed: retract + add correct
        (1_000, 12_000, 15_000, {(0, False): 1, (0, True): -1, (10_000, False): 1}),
    ],
)
def test_an_upgrade_takes_its_partial_back(
    partial_end_ms: int, joined_end_ms: int, close_before: int | None,
    rows: dict[tuple[int, bool], int],
) -> None:  # fmt: skip
    agg = WindowAggregator(0, WindowConfig(size_ms=10_000, grace_ms=5_000))
    partial = _rec(partial_end_ms)
    joined = msgspec.structs.replace(_rec(joined_end_ms), gateway_total_ms=250.0)
    out = []
    agg.add(partial, 1)
    if close_before is not None:
        out += agg.close(close_before)
    agg.add(partial, -1, sign=-1)
    agg.add(joined, 2)
    out += agg.take_corrections() + agg.drain()
    got = {(w.start_ms, w.correction): w.records.get(ALL_KEY, 0) for w in out}
    assert got == rows
    # Summed over everything emitted, exactly the joined record remains.
    total = {}
    for w in out:
        for (key, b), c in w.sketches.items():
            if key == ALL_KEY:
                total[b] = total.get(b, 0) + c.count
    assert total["gateway_total_ms"] == 1
    assert agg.counters.retracted == 1


def test_hold_keeps_windows_of_pending_joins_open() -> None:
    agg = WindowAggregator(0, WindowConfig(size_ms=10_000, grace_ms=0))
    agg.add(_rec(1_000), 0)
    agg.add(_rec(21_000), 1)
    assert [w.start_ms for w in agg.close(100_000, hold_ms=12_000)] == [0]
    assert agg.add(_rec(12_500), 2)  # its window was held open
    assert [w.start_ms for w in agg.close(100_000)] == [10_000, 20_000]


def test_checkpointed_horizon_never_reopens_a_window() -> None:
    agg = WindowAggregator(0, WindowConfig(size_ms=10_000, grace_ms=0), horizon_ms=20_000)
    assert not agg.add(_rec(19_999), 0)
    assert agg.add(_rec(20_000), 1)


def test_keys_are_bounded() -> None:
    agg = WindowAggregator(0, WindowConfig(max_keys=2))
    for i in range(5):
        agg.add(_rec(100, model=f"m{i}", rid=f"r{i}"), i)
    (win,) = agg.drain()
    assert win.records[ALL_KEY] == 5
    assert win.records[OTHER_KEY] == 3
    assert agg.counters.folded_keys == 3
    assert len(win.records) == 4  # 2 keys + other + all


def test_keys_split_by_model_priority_bucket() -> None:
    agg = WindowAggregator(0)
    agg.add(_rec(100, prio=0, rid="a"), 0)
    agg.add(_rec(100, prio=2, rid="b"), 1)
    (win,) = agg.drain()
    assert win.records == {("m", "0", "<512"): 1, ("m", "2", "<512"): 1, ALL_KEY: 2}


@pytest.mark.parametrize(
    ("field", "value"),
    [("size_ms", 0), ("grace_ms", -1), ("max_keys", 0), ("relative_accuracy", 1.0)],
)
def test_config_is_validated(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        WindowConfig(**{field: value})  # type: ignore[arg-type]
