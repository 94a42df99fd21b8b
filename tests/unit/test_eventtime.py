"""The partition clock: outliers cannot move it; cost independent of gaps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.eventtime import ClockConfig, PartitionClock

HOUR = 3_600_000
YEAR = 365 * 24 * HOUR


def test_follows_events_then_wall_time_when_idle() -> None:
    c = PartitionClock(ClockConfig(quorum=1))
    assert c.now(123) == 0
    c.observe("h", 1000, wall_ms=50)
    c.observe("h", 900, wall_ms=60)  # an older event does not move it back
    assert c.now(60) == 1010
    c.observe("h", 2000, wall_ms=70)
    assert c.now(70) == 2000
    assert c.now(1070) == 3000
    assert c.now(1070, caught_up=False) == 2000  # input waiting: no wall time
    assert c.now(None) == 2000  # replay: event time only


def _feed(c: PartitionClock, events: list[tuple[str, int]]) -> None:
    for host, ts in events:
        if c.in_range(ts):
            c.observe(host, ts)


def _steady(hosts: list[str], start: int, n: int, step: int = 100) -> list[tuple[str, int]]:
    return [(hosts[i % len(hosts)], start + i * step) for i in range(n)]


BASE = 1_700_000_000_000


@pytest.mark.parametrize(
    ("name", "outliers", "expect_max"),
    [
        ("one event an hour ahead", [("gw-1", BASE + HOUR)], BASE + 5_000),
        ("one event a year ahead", [("gw-1", BASE + YEAR)], BASE + 5_000),
        ("four events of one host a year ahead", [("eng-1", BASE + YEAR)] * 4, BASE + 5_000),
        ("a new host a year ahead", [("rogue", BASE + YEAR)] * 3, BASE + 5_000),
    ],
)
def test_outliers_do_not_move_the_watermark(
    name: str, outliers: list[tuple[str, int]], expect_max: int
) -> None:
    c = PartitionClock()
    events = _steady(["gw-1", "gw-2", "eng-1"], BASE, 30)
    _feed(c, events[:10] + outliers + events[10:])
    assert BASE + 1_000 <= c.watermark_ms <= expect_max, name


def test_out_of_range_is_relative_to_the_watermark() -> None:
    c = PartitionClock(ClockConfig(max_ahead_ms=300_000))
    _feed(c, _steady(["a", "b", "c"], BASE, 10))
    assert c.in_range(BASE + 1_000 + 299_000)
    assert not c.in_range(BASE + 1_000 + HOUR)
    assert c.in_range(BASE - YEAR)  # behind is late data, not out of range


def test_one_host_slow_or_fast_does_not_drive_the_clock() -> None:
    c = PartitionClock()
    evs = []
    for i in range(200):
        t = BASE + i * 100
        evs += [("gw-1", t), ("gw-slow", t - 300_000), ("gw-fast", t + 30_000), ("eng-1", t),
                ("eng-2", t)]  # fmt: skip
    _feed(c, evs)
    assert abs(c.watermark_ms - (BASE + 199 * 100)) <= 500


def test_bootstrap_holds_until_quorum_and_establish_ends_it() -> None:
    c = PartitionClock(ClockConfig(quorum=5))
    c.observe("a", BASE + YEAR)  # a poison event read first
    assert c.bootstrapping
    assert c.watermark_ms == 0
    for i in range(4):
        c.observe("b", BASE + i)
    assert not c.bootstrapping
    assert c.watermark_ms < BASE + HOUR  # lower median of {a: +1y, b: base}
    assert not c.in_range(BASE + YEAR)
    quiet = PartitionClock(ClockConfig(quorum=5))
    quiet.observe("a", BASE)
    quiet.establish()
    assert quiet.watermark_ms == BASE


@given(st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=200))
@settings(max_examples=60, deadline=None)
def test_watermark_never_goes_back(ts: list[int]) -> None:
    c = PartitionClock(ClockConfig(quorum=2))
    last = 0
    for i, t in enumerate(ts):
        if c.in_range(t):
            c.observe(f"h{i % 3}", t)
        assert c.watermark_ms >= last
        last = c.watermark_ms


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["observe"] * 8 + ["jump", "establish"]),
            st.integers(0, 3),  # host
            st.integers(0, 200_000),  # event time
            st.integers(0, 10_000),  # wall time
        ),
        max_size=300,
    ),
    st.sampled_from([1, 2, 5]),
    st.sampled_from([1_000, 60_000]),
)
@settings(max_examples=1000)
def test_skipping_recomputes_keeps_the_same_clock(
    ops: list[tuple[str, int, int, int]], quorum: int, idle_ms: int
) -> None:
    # The reference recomputes the median whenever a mark moves (no settled watermark).
    cfg = ClockConfig(quorum=quorum, host_idle_ms=idle_ms)
    fast, ref = PartitionClock(cfg), PartitionClock(cfg)
    for op, host, ts, wall in ops:
        for clock in (fast, ref):
            if clock is ref:
                clock._settled_ms = None
            if op == "observe":
                clock.observe(f"h{host}", ts, wall)
            elif op == "jump":
                clock.jump(ts, wall)
            else:
                clock.establish(wall)
        assert (fast.watermark_ms, fast.wall_at_advance_ms) == (
            ref.watermark_ms,
            ref.wall_at_advance_ms,
        )
