"""Provisional window snapshots: the controller decides on ended windows without waiting for
the grace period; final windows supersede snapshots and alone count in budgets."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest

from pipeline.contract.summary import (
    ModelWindow,
    Progress,
    SLOWindowCounts,
    WindowSummary,
    decode_summary,
    encode_summary,
)
from pipeline.core.control import Controller
from pipeline.core.record import RequestRecord, build_record
from pipeline.core.summary import summarize
from pipeline.core.windows import WindowAggregator, WindowConfig
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.policy import load_policy
from tests.control_fixtures import TEST_POLICY
from tests.factories import completed, finished, received
from tests.paths import SPECS

SIZE = 10_000


def rec(end_ms: int, queue_ms: float) -> RequestRecord:
    r = build_record("r", received("r"), completed("r"), finished("r"))
    return msgspec.structs.replace(r, end_unix_ns=end_ms * 1_000_000, queue_ms=queue_ms, model="m")


def test_snapshots_cover_ended_open_windows_once_per_change() -> None:
    agg = WindowAggregator(0, WindowConfig(size_ms=SIZE, grace_ms=30_000))
    agg.add(rec(1_000, 5.0), 0)
    agg.add(rec(12_000, 7.0), 1)
    assert agg.provisional(9_999) == []  # [0, 10 s) has not ended
    snaps = agg.provisional(10_000)
    assert [w.start_ms for w in snaps] == [0]
    assert snaps[0].records[("*", "*", "*")] == 1
    assert agg.provisional(10_500) == []  # unchanged since
    agg.add(rec(9_000, 50.0), 2)  # a late record: still in grace, the window changes
    snaps = agg.provisional(20_000)
    assert [w.start_ms for w in snaps] == [0, 10_000]
    assert snaps[0].records[("*", "*", "*")] == 2
    assert agg.open_windows == 2  # nothing closed
    assert agg.close(40_000)
    assert agg.horizon_ms == 10_000


def test_a_snapshot_is_detached_from_the_open_window() -> None:
    agg = WindowAggregator(0, WindowConfig(size_ms=SIZE, grace_ms=30_000))
    agg.add(rec(1_000, 5.0), 0)
    snap = agg.provisional(10_000)[0]
    agg.add(rec(2_000, 6.0), 1)
    assert snap.records[("*", "*", "*")] == 1


@pytest.mark.parametrize("final", [True, False])
def test_summary_roundtrip_keeps_final_and_clock(final: bool) -> None:
    agg = WindowAggregator(3, WindowConfig(size_ms=SIZE, grace_ms=0))
    agg.add(rec(1_000, 5.0), 0)
    s = summarize(agg.provisional(10_000)[0], final=final)
    back = decode_summary(encode_summary(s))
    assert isinstance(back, WindowSummary)
    assert back.final is final
    assert back.models["m"].records == 1
    p = decode_summary(encode_summary(Progress(3, 10_000, 12_345)))
    assert p == Progress(3, 10_000, 12_345)
    assert decode_summary(encode_summary(Progress(3, 10_000))) == Progress(3, 10_000, None)


def _summary(
    start: int, queue_ms: float, n: int, *, final: bool, part: int = 0, slo: str = "e2e"
) -> WindowSummary:
    agg = WindowAggregator(part, WindowConfig(size_ms=SIZE, grace_ms=0))
    for i in range(n):
        agg.add(rec(start + 1 + i % (SIZE - 1), queue_ms), i)
    s = summarize(agg.provisional(start + SIZE)[0], final=final)
    slos = {slo: SLOWindowCounts(n, n, 0.99)} if final else {}
    return replace(s, slos=slos)


def test_final_supersedes_snapshots_and_budgets_count_finals_once() -> None:
    from pipeline.spec.slo import load_spec_file

    spec = load_spec_file(SPECS / "slo-example.yaml")
    name = spec.slos[0].name
    c = Controller(load_policy(TEST_POLICY), spec, load_burn_rules_file())
    assert c.add_window(_summary(0, 9000.0, 100, final=False, slo=name))
    assert c.signals("m", SIZE, [])["p99.queue_ms"] == pytest.approx(9000, rel=0.01)
    # a newer snapshot of the same window replaces the old one (not added to it)
    assert c.add_window(_summary(0, 100.0, 100, final=False, slo=name))
    assert c.signals("m", SIZE, [])["p99.queue_ms"] == pytest.approx(100, rel=0.01)
    assert c.book is not None
    assert c.book.tracker(name, "*").counts(0, SIZE).total == 0  # snapshots: no budget
    assert c.add_window(_summary(0, 200.0, 100, final=True, slo=name))
    assert c.signals("m", SIZE, [])["p99.queue_ms"] == pytest.approx(200, rel=0.01)
    assert c.book.tracker(name, "*").counts(0, SIZE).total == 100
    # after the final: a stale snapshot and a repeated final are both ignored
    assert not c.add_window(_summary(0, 9000.0, 100, final=False, slo=name))
    assert not c.add_window(_summary(0, 9000.0, 100, final=True, slo=name))
    assert c.duplicates == 1
    assert c.book.tracker(name, "*").counts(0, SIZE).total == 100
    assert c.signals("m", SIZE, [])["p99.queue_ms"] == pytest.approx(200, rel=0.01)


def test_partitions_merge_into_one_sketch() -> None:
    c = Controller(load_policy(TEST_POLICY))
    c.add_window(_summary(0, 100.0, 99, final=False, part=0))
    c.add_window(_summary(0, 5000.0, 1, final=False, part=1))
    sig = c.signals("m", SIZE, [])
    assert sig["p99.queue_ms"] == pytest.approx(100, rel=0.01)  # 1 of 100 is not the P99
    c.add_window(_summary(0, 5000.0, 3, final=False, part=1))  # replaces partition 1's snapshot
    assert c.signals("m", SIZE, [])["p99.queue_ms"] == pytest.approx(5000, rel=0.01)
    _ = ModelWindow  # the summary's per-model shape is what the controller merges


def test_processor_reports_each_partitions_watermark_not_a_wall_clock_extension() -> None:
    from pipeline.contract.codec import encode_event
    from pipeline.core.processor import StreamProcessor
    from tests.factories import T0_NS

    proc = StreamProcessor("t", window_config=WindowConfig(size_ms=SIZE, grace_ms=30_000))
    msgs = [(0, i, encode_event(e)) for i, e in enumerate(
        [received("r1", 0), finished("r1", 15_000), completed("r1", 15_010)]
    )]  # fmt: skip
    # Processing time far ahead of event time: the close horizon may run on wall time,
    # the decision clock must not.
    proc.process(msgs, wall_ms=T0_NS // 1_000_000 + 3_600_000)
    _snaps, clocks = proc.provisional()
    # The partition's robust event-time watermark (pipeline.core.eventtime), not wall time.
    assert set(clocks) == {0}
    assert T0_NS // 1_000_000 <= clocks[0] <= T0_NS // 1_000_000 + 15_010


def test_budget_signals_read_final_windows_only_lagging_by_the_grace() -> None:
    """With ``budget_lag_ms``, compliance_5m and the budgets at T read the windows ending
    at or before T - lag: the same counts live (last window a snapshot) and in replay."""
    from pipeline.core.control import ControllerConfig
    from pipeline.spec.slo import load_spec_file

    spec = load_spec_file(SPECS / "slo-example.yaml")
    name = spec.slos[0].name
    c = Controller(
        load_policy(TEST_POLICY),
        spec,
        load_burn_rules_file(),
        config=ControllerConfig(budget_lag_ms=SIZE),
    )
    c.add_window(replace(_summary(0, 100.0, 100, final=True, slo=name), slos={
        name: SLOWindowCounts(100, 100, 0.99)
    }))  # fmt: skip
    c.add_window(replace(_summary(SIZE, 100.0, 100, final=True, slo=name), start_ms=SIZE, slos={
        name: SLOWindowCounts(100, 0, 0.99)
    }))  # fmt: skip
    step = c.evaluate(2 * SIZE)
    # At 20 s, lag 10 s: only the window [0, 10 s) counts (all good), not [10 s, 20 s).
    assert step.signals["m"][f"compliance_5m.{name}"] == 1.0
    st = next(b for b in step.budgets if b.slo == name)
    assert st.consumed == 0
    step = c.evaluate(3 * SIZE)
    assert step.signals["m"][f"compliance_5m.{name}"] == 0.5


def test_budgets_at_the_window_resolution_stop_at_t_minus_lag() -> None:
    """2-second windows: the budgets' finest buckets are the windows, so the budget
    signals at T do not read a later window that shares a coarser bucket (live, that
    window may still be a snapshot; in replay it is final)."""
    from pipeline.core.control import ControllerConfig
    from pipeline.spec.slo import load_spec_file

    spec = load_spec_file(SPECS / "slo-example.yaml")
    name = spec.slos[0].name
    config = ControllerConfig.for_windows(2_000, 1_000)
    assert (config.budget_lag_ms, config.budget_base_ms) == (2_000, 2_000)
    c = Controller(load_policy(TEST_POLICY), spec, load_burn_rules_file(), config=config)
    for start, good in ((20_000, 10), (22_000, 10), (24_000, 0)):
        base = _summary(0, 100.0, 10, final=True, slo=name)
        slos = {name: SLOWindowCounts(10, good, 0.99)}
        c.add_window(replace(base, start_ms=start, size_ms=2_000, slos=slos))
    step = c.evaluate(26_000)  # reads the windows ending at or before 24 s: not [24 s, 26 s)
    assert step.signals["m"][f"compliance_5m.{name}"] == 1.0
    assert c.evaluate(28_000).signals["m"][f"compliance_5m.{name}"] == pytest.approx(20 / 30)
