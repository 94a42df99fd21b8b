"""The hours a repair of the rollups compares (pipeline.adapters.store.rollups), no store."""

from __future__ import annotations

import pytest

from pipeline.adapters.store.rollups import RepairResult, _scope, window_hours

H = 1_763_316_000  # an hour's start (unix s)


@pytest.mark.parametrize(
    ("starts_ms", "hours"),
    [
        ([], set()),
        ([H * 1000], {H}),
        ([H * 1000 + 3_599_999, H * 1000 + 10_000], {H}),
        ([H * 1000 - 1, H * 1000 + 3_600_000], {H - 3600, H + 3600}),
    ],
)
def test_window_hours(starts_ms: list[int], hours: set[int]) -> None:
    assert window_hours(starts_ms) == hours


@pytest.mark.parametrize(
    ("hours", "sql"),
    [
        (None, "1"),
        ({H}, f"((c >= toDateTime({H}, 'UTC') AND c < toDateTime({H + 3600}, 'UTC')))"),
        (  # consecutive hours: one range; a gap: two
            {H, H + 3600, H + 3 * 3600},
            f"((c >= toDateTime({H}, 'UTC') AND c < toDateTime({H + 7200}, 'UTC')) OR "
            f"(c >= toDateTime({H + 10800}, 'UTC') AND c < toDateTime({H + 14400}, 'UTC')))",
        ),
    ],
)
def test_scope_as_ranges(hours: set[int] | None, sql: str) -> None:
    assert _scope("c", hours) == sql


def test_describe() -> None:
    assert RepairResult({"latency_1m": 0}, 3).describe() == (
        "every rollup equals its source (3 hours compared)"
    )
    r = RepairResult({"slo_windows": 0, "latency_1m": 12, "slo_1h": 2}, None)
    assert r.total == 14
    assert r.describe() == "buckets repaired: latency_1m 12, slo_1h 2 (all hours compared)"
