"""Migration 0019 (``latency_1h``'s sketch bins as plain arrays, issue 53) upgrades a
store written before it: the hourly rollup holds the same counts and bins after it
(merged by ``sumMap`` of its arrays, as ``sumMapMerge`` merged its states), its view
fills it from the windows written after, and the latency reads answer as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.queries import windows as window_queries
from pipeline.adapters.store import migrate, open_store, write_windows
from pipeline.adapters.store.rollups import repair_rollups
from pipeline.settings import Settings
from tests.integration.migrations import migrate_before
from tests.integration.test_migration_0017 import hourly, simulated_windows

pytestmark = pytest.mark.integration

BOUNDARIES = ("gateway_total_ms", "ttft_engine_ms", "queue_ms")


def latency_read(merge: str, table: str = "latency_1h") -> str:
    """The report's and the dashboards' latency read of a latency rollup (all traffic):
    P50 and P99 per bucket and boundary, bins merged by ``merge``."""
    sql = window_queries.latency_sql(
        f"tailguard.{table}", "model = '*'", BOUNDARIES, quantiles=(0.5, 0.99), merge=merge
    )
    return f"SELECT * FROM ({sql}) ORDER BY time, boundary"


def test_0019_keeps_the_hourly_rollup_as_arrays(tmp_path: Path) -> None:
    assert_bins_become_arrays(tmp_path, "0019_latency_1h_plain_bins", "latency_1h", 256)


def assert_bins_become_arrays(tmp_path: Path, migration: str, table: str, granules: int) -> None:
    """A store written before ``migration``: after it, ``table`` holds the same counts and
    bins as plain arrays in granules of ``granules`` rows, the shared latency read answers
    as before, the view fills it from the windows written after, and the rollup repair
    finds nothing to set right (0019: latency_1h, 0023: latency_1m)."""
    windows = simulated_windows(tmp_path)
    half = len(windows) // 2
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate_before(store, tmp_path, int(migration[:4]))
        write_windows(store, windows[:half], "t", 0.01, "before")
        before = store.query_rows(hourly("sumMapMerge", table))
        series = store.query_rows(latency_read("sumMapMerge", table))
        assert before
        assert series
        assert migrate(store)[0] == migration
        assert store.query_rows(hourly("sumMap", table)) == before
        ((ddl,),) = store.query_rows(
            "SELECT create_table_query FROM system.tables "
            f"WHERE database = 'tailguard' AND name = '{table}'"
        )
        assert "SimpleAggregateFunction(sumMap" in ddl
        assert f"index_granularity = {granules}" in ddl
        # the reads through the shared latency SQL: the same answers
        assert store.query_rows(latency_read(window_queries.BINS_MERGE, table)) == series
        write_windows(store, windows[half:], "t", 0.01, "after")
        ((after,),) = store.query_rows(f"SELECT sum(records) FROM tailguard.{table}")
        ((base,),) = store.query_rows(
            "SELECT sum(records) FROM tailguard.window_sketches WHERE boundary != '__slo__'"
        )
        assert after == base > sum(r[5] for r in before)
        # the view's rows and the migrated ones are each their windows' (repair finds
        # nothing to set right)
        repaired = repair_rollups(store).repaired
        assert repaired.get("latency_1m") == 0
        assert repaired.get("latency_1h") == 0
    finally:
        store.close()
