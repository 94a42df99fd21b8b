"""Migration 0023 (``latency_1m``'s sketch bins as plain arrays, in granules of 1,024
rows, issue 53) upgrades a store written before it: the minute rollup holds the same
counts and bins after it (merged by ``sumMap`` of its arrays, as ``sumMapMerge`` merged
its states), its view fills it from the windows written after, the report's and the
dashboards' minute reads answer as before, and the rollup repair finds nothing to set
right."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.queries import windows as window_queries
from pipeline.adapters.store import migrate, open_store, write_windows
from pipeline.adapters.store.rollups import repair_rollups
from pipeline.settings import Settings
from tests.integration.migrations import migrate_before
from tests.integration.test_migration_0017 import hourly, simulated_windows
from tests.integration.test_migration_0019 import latency_read

pytestmark = pytest.mark.integration


def minutely(merge: str) -> str:
    """latency_1m as its engine merges it (sumMapMerge before 0023, sumMap after)."""
    return hourly(merge, "latency_1m")


def _latency(merge: str) -> str:
    """The report's and the dashboards' latency read of the minute rollup."""
    return latency_read(merge, "latency_1m")


def test_0023_keeps_the_minute_rollup_as_arrays(tmp_path: Path) -> None:
    windows = simulated_windows(tmp_path)
    half = len(windows) // 2
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate_before(store, tmp_path, 23)
        write_windows(store, windows[:half], "t", 0.01, "before")
        before = store.query_rows(minutely("sumMapMerge"))
        series = store.query_rows(_latency("sumMapMerge"))
        assert before
        assert series
        assert migrate(store) == ["0023_latency_1m_plain_bins"]
        assert store.query_rows(minutely("sumMap")) == before
        ((ddl,),) = store.query_rows(
            "SELECT create_table_query FROM system.tables "
            "WHERE database = 'tailguard' AND name = 'latency_1m'"
        )
        assert "SimpleAggregateFunction(sumMap" in ddl
        assert "index_granularity = 1024" in ddl
        # the reads through the shared latency SQL: the same answers
        assert store.query_rows(_latency(window_queries.BINS_MERGE)) == series
        write_windows(store, windows[half:], "t", 0.01, "after")
        ((after,),) = store.query_rows("SELECT sum(records) FROM tailguard.latency_1m")
        ((base,),) = store.query_rows(
            "SELECT sum(records) FROM tailguard.window_sketches WHERE boundary != '__slo__'"
        )
        assert after == base > sum(r[5] for r in before)
        # the view's rows and the migrated ones are each their windows' (repair finds
        # nothing to set right), and both rollups answer the month's minutes alike
        repaired = repair_rollups(store).repaired
        assert repaired.get("latency_1m") == 0
        assert repaired.get("latency_1h") == 0
    finally:
        store.close()
