"""The hours a repair of the rollups compares and the views it compares them with
(pipeline.adapters.store.rollups), no store."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.store.rollups import (
    ROLLUPS,
    RepairResult,
    _scope,
    view_selects,
    window_hours,
)

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


# (the migrations, the view each rollup is then filled by: its source and a part of its SELECT)
_V1 = """CREATE MATERIALIZED VIEW ${db}.a_mv ${on_cluster} TO ${db}.a AS
SELECT toStartOfMinute(window_start) AS window_start, sum(n) AS n
-- a comment line inside the SELECT
FROM ${db}.base GROUP BY window_start;
"""
_V2 = """DROP VIEW IF EXISTS ${db}.a_mv ${on_cluster};
CREATE MATERIALIZED VIEW IF NOT EXISTS ${db}.a_mv ${on_cluster} TO ${db}.a AS
SELECT toStartOfHour(window_start) AS window_start, sum(n) AS n FROM ${db}.other
GROUP BY window_start;
"""
VIEW_CASES = [
    ("one definition", {"0001_a.sql": _V1}, ("base", "toStartOfMinute")),
    ("a later migration redefines it", {"0001_a.sql": _V1, "0002_b.sql": _V2}, ("other", "Hour")),
]


@pytest.mark.parametrize("case", VIEW_CASES, ids=[c[0] for c in VIEW_CASES])
def test_the_view_a_rollup_is_compared_with_is_the_last_migrations(
    tmp_path: Path, case: tuple[str, dict[str, str], tuple[str, str]]
) -> None:
    _, files, (source, part) = case
    for name, sql in files.items():
        (tmp_path / name).write_text(sql)
    views = view_selects(tmp_path)
    assert set(views) == {"a"}
    assert views["a"].source == source
    assert part in views["a"].select
    assert "--" not in views["a"].select


def test_every_rollup_is_compared_with_its_shipped_view_over_the_hours_only() -> None:
    views = view_selects()
    assert [r.table for r in ROLLUPS] == list(views)  # every view's target, sources first
    assert {t: v.source for t, v in views.items()} == {
        "slo_windows": "window_sketches",
        "latency_1m": "window_sketches",
        "latency_1h": "window_sketches",
        "slo_1m": "slo_windows",
        "slo_1h": "slo_windows",
        "request_counts_1h": "window_sketches",
        "slo_bad_1h": "window_sketches",
        "clock_skew_1h": "window_sketches",
    }
    for table, view in views.items():
        sql = view.over("db", {H})
        scoped = f"(SELECT * FROM db.{view.source} WHERE {_scope('window_start', {H})})"
        assert sql.count(f"db.{view.source}") == 1, table  # only inside the scoped rows
        assert scoped in sql, table
        assert "${" not in sql, table
