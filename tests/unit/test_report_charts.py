"""The HTML report's chart helpers and the report's SLO ordering (pure)."""

from __future__ import annotations

import math

import pytest

from pipeline.app.report import _badness
from pipeline.app.report_html import _Chart, _dates, line_chart, log_floor, with_gaps


@pytest.mark.parametrize(
    ("points", "expected_nan_at"),
    [
        ([(0, 1.0), (60, 2.0), (120, 3.0)], []),
        ([(0, 1.0), (60, 2.0), (300, 3.0)], [2]),  # three minutes without data: a break
        ([(0, 1.0), (600, 2.0), (660, 1.0), (1200, 5.0)], [1, 4]),
    ],
)
def test_lines_break_across_missing_minutes(
    points: list[tuple[float, float]], expected_nan_at: list[int]
) -> None:
    ts, vs = with_gaps(points)
    assert [i for i, v in enumerate(vs) if math.isnan(v)] == expected_nan_at
    assert [v for v in vs if not math.isnan(v)] == [p[1] for p in points]
    assert ts == sorted(ts)


@pytest.mark.parametrize(
    ("values", "floor"),
    [
        ([0.0, 12.0, 3400.0], 10.0),  # a zero never stretches the axis down to 0.001
        ([0.5, 80.0], 0.1),
        ([1.0], 1.0),
        ([0.0, -1.0], None),
    ],
)
def test_log_floor(values: list[float], floor: float | None) -> None:
    assert log_floor(values) == pytest.approx(floor) if floor else log_floor(values) is None


def test_time_ticks_fall_on_whole_minutes_whatever_the_data() -> None:
    t0 = 1_800_000_041.0  # hh:mm:41
    c = _Chart("t", "ms")
    c.ax.plot(_dates([t0 + 60 * i for i in range(12)]), [1.0] * 12)
    c.time_axis()
    c.fig.canvas.draw()  # type: ignore[no-untyped-call]
    ticks = c.ax.get_xticks()
    assert len(ticks) >= 2
    for tick in ticks:
        seconds = round(tick * 86400)  # matplotlib dates are days
        assert seconds % 60 == 0, f"tick at {seconds % 60} s past the minute"
    labels = [t.get_text() for t in c.ax.get_xticklabels()]
    assert all(len(x) == 5 and x[2] == ":" for x in labels if x), labels


def test_log_chart_svg_has_no_decades_below_the_data_and_tags_its_marks() -> None:
    svg = line_chart(
        "latency", "P99", {"queue_ms": [(0.0, 0.0), (60.0, 20.0), (120.0, 300.0)]}, "ms", log=True
    )
    assert 'id="mark-latency-0"' in svg
    assert "10^{-3}" not in svg
    assert "10^{-1}" not in svg
    assert "10^{1}" in svg


def test_worst_slo_first() -> None:
    slos = {
        "ok": {"met": True, "budget_remaining": 0.9, "compliance": 0.999, "objective": 0.99},
        "burning": {"met": True, "budget_remaining": 0.1, "compliance": 0.991, "objective": 0.99},
        "broken": {"met": False, "budget_remaining": -2.0, "compliance": 0.9, "objective": 0.99},
        "empty": {"met": None, "budget_remaining": None, "compliance": None, "objective": 0.99},
    }
    assert sorted(slos, key=lambda n: _badness(slos[n])) == ["broken", "burning", "ok", "empty"]


def test_open_windows_are_announced() -> None:
    from pipeline.app.report import Report, open_windows_hint

    def report(after: int) -> Report:
        return Report(
            127, {}, {}, {}, {}, [],
            open_windows={"last_closed_window_end": "2026-12-01T20:06:00+00:00",
                          "requests_after": after},
        )  # fmt: skip

    hint = open_windows_hint(report(57))
    assert hint is not None
    assert "57 of 127 requests" in hint
    assert "still open" in hint
    assert open_windows_hint(report(0)) is None
