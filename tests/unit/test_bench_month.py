"""The month benchmark's generated windows are the core's (bench/month_data.py)."""

from __future__ import annotations

import dataclasses

import pytest

from bench.month_data import MonthRecipe, generate_hour, hour_messages, hour_windows
from pipeline.adapters.store import WINDOW_COLUMNS, windows_columns
from pipeline.core.slo_windows import slo_factory
from pipeline.core.windows import WindowAggregator, WindowConfig
from pipeline.settings import Settings
from pipeline.spec.slo import load_spec_file

# 2026-12-01 00:00 UTC; a low rate keeps the hour small
RECIPE = MonthRecipe(days=2, rate_per_s=0.5, end_ms=1_796_083_200_000)


@pytest.mark.parametrize(
    ("index", "partitions"),
    [
        (0, 1),  # night
        (15, 3),  # the afternoon peak, three partitions
        (4 * 24 + 14, 2),  # an overload episode (day 4, 14:00): rejections, long queues
    ],
)
def test_hour_windows_equal_the_aggregators(index: int, partitions: int) -> None:
    recipe = dataclasses.replace(RECIPE, days=6)
    hour = generate_hour(recipe, index)
    config = WindowConfig()
    factory = slo_factory(load_spec_file(Settings().slo_spec))
    got = hour_windows(hour, partitions, config, factory)
    aggs = [WindowAggregator(p, config, factory, hour.start_ms) for p in range(partitions)]
    for rec, p in zip(hour.records, (hour.partitions % partitions).tolist(), strict=True):
        aggs[p].add(rec, 0)
    want = [w for a in aggs for w in a.close(hour.start_ms + 3_600_000 + config.grace_ms)]
    assert hour.records
    if index == 4 * 24 + 14:
        assert any(r.outcome == "rejected" for r in hour.records)
    names = [n for n, _ in WINDOW_COLUMNS]
    for name, a, b in zip(names, windows_columns(got, "t", 0.01, {}),
                          windows_columns(want, "t", 0.01, {}), strict=True):  # fmt: skip
        if name == "sum":  # numpy's per-cell sum, not the sketch's left fold: a few ulps
            assert a == pytest.approx(b, rel=1e-12), name
        else:
            assert a == b, name


def test_hours_are_pure_and_raw_events_decode() -> None:
    a, b = generate_hour(RECIPE, 30), generate_hour(RECIPE, 30)
    assert a.records == b.records
    assert all(r.end_unix_ns // 1_000_000 - a.start_ms in range(3_600_000) for r in a.records)
    kept = hour_messages(a, 2)
    kinds = [ev.kind for m in kept for ev in m.events]
    rejected = sum(r.engine_host is None for r in a.records)
    assert len(kinds) == 3 * len(a.records) - rejected
