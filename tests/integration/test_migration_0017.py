"""Migration 0017 (``latency_1h`` in granules of 256 rows, issue 53) upgrades a store
written before it: the hourly rollup holds the same sketches and counts after it, in
its new granules, and its view fills it from the windows written after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.adapters.store import migrate, open_store, write_windows
from pipeline.app.replay import replay_file
from pipeline.contract.codec import encode_event
from pipeline.settings import Settings
from pipeline.shipped import DEFAULT_TRACE
from producers.simulator.model import SimConfig, Simulator
from producers.simulator.trace import read_trace
from tests.integration.migrations import migrate_before, write_old_windows

pytestmark = pytest.mark.integration



def hourly(merge: str = "sumMapMerge", table: str = "latency_1h") -> str:
    """A latency rollup (latency_1h) as its engine merges it: per key, boundary and bucket,
    the counts and bins (``merge``: sumMapMerge of its states before 0019, sumMap of its
    arrays after; latency_1m's: before and after 0023)."""
    return (
        "SELECT window_start, model, priority, ctx_bucket, boundary, sum(records), sum(count), "
        f"sum(sum), min(min), max(max), sum(zero_count), {merge}(pos), {merge}(neg) "
        f"FROM tailguard.{table} GROUP BY window_start, model, priority, ctx_bucket, "
        "boundary ORDER BY window_start, model, priority, ctx_bucket, boundary"
    )


def simulated_windows(tmp_path: Path) -> list[Any]:
    """The closed windows of 600 requests of the shared trace, replayed."""
    events = list(
        Simulator(
            read_trace(DEFAULT_TRACE)[:600],
            SimConfig(start_unix_ns=1_800_000_000_000_000_000, seed=3),
        ).events()
    )
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    return list(replay_file(path).windows)


def test_0017_keeps_the_hourly_rollup_in_smaller_granules(tmp_path: Path) -> None:
    windows = simulated_windows(tmp_path)
    half = len(windows) // 2
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate_before(store, tmp_path, 17)
        write_old_windows(store, windows[:half], "before")  # without 0018's columns
        before = store.query_rows(hourly())
        assert before
        assert migrate(store)[0] == "0017_latency_1h_granularity"
        assert store.query_rows(hourly("sumMap")) == before  # (0019 after it)
        ((ddl,),) = store.query_rows(
            "SELECT create_table_query FROM system.tables "
            "WHERE database = 'tailguard' AND name = 'latency_1h'"
        )
        assert "index_granularity = 256" in ddl
        write_windows(store, windows[half:], "t", 0.01, "after")
        ((after,),) = store.query_rows("SELECT sum(records) FROM tailguard.latency_1h")
        ((base,),) = store.query_rows(
            "SELECT sum(records) FROM tailguard.window_sketches WHERE boundary != '__slo__'"
        )
        assert after == base > sum(r[5] for r in before)
    finally:
        store.close()
