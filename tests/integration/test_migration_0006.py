"""Migration 0006 upgrades a store written before it: windows, SLO counts and rollups kept."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline.adapters.store import migrate, open_store
from pipeline.settings import Settings
from tests.integration.migrations import migrate_before

pytestmark = pytest.mark.integration


def test_0006_keeps_what_0003_stored(tmp_path: Path) -> None:
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate_before(store, tmp_path, 6)
        start = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
        slo = {"s1": ("slo", "gateway_total_ms", 300.0, 0.99, 7, 5, 0, 0.0)}
        store.insert_columns(
            "window_sketches",
            [
                [start, start],
                [10_000, 10_000],
                ["lc", "lc"],
                [1, 1],
                ["*", "*"],
                ["*", "*"],
                ["*", "*"],
                ["gateway_total_ms", "__slo__"],
                [0.01, 0.01],
                [7, 7],
                [7, 0],
                [700.0, 0.0],
                [50.0, 0.0],
                [150.0, 0.0],
                [0, 0],
                [[10, 12], []],
                [[3, 4], []],
                [[], []],
                [[], []],
                [{}, slo],
            ],
            [
                "window_start",
                "window_ms",
                "source_topic",
                "partition",
                "model",
                "priority",
                "ctx_bucket",
                "boundary",
                "relative_accuracy",
                "records",
                "count",
                "sum",
                "min",
                "max",
                "zero_count",
                "pos_keys",
                "pos_counts",
                "neg_keys",
                "neg_counts",
                "slo_counts",
            ],
            [
                "DateTime64(3, 'UTC')",
                "UInt32",
                "String",
                "UInt16",
                "String",
                "String",
                "String",
                "String",
                "Float64",
                "UInt64",
                "UInt64",
                "Float64",
                "Float64",
                "Float64",
                "UInt64",
                "Array(Int32)",
                "Array(UInt64)",
                "Array(Int32)",
                "Array(UInt64)",
                "Map(String, Tuple(String, String, Float64, Float64, UInt64, UInt64, UInt64, "
                "Float64))",
            ],
        )
        applied = migrate(store)
        assert applied[0] == "0006_signed_windows"  # and any later ones
        db = store.database
        assert store.query_rows(
            f"SELECT boundary, count, pos_counts, correction FROM {db}.window_sketches "
            "ORDER BY boundary"
        ) == [("__slo__", 0, [], 0), ("gateway_total_ms", 7, [3, 4], 0)]
        assert store.query_rows(f"SELECT slo, total, good FROM {db}.slo_windows") == [("s1", 7, 5)]
        assert store.query_rows(f"SELECT sum(total), sum(good) FROM {db}.slo_1h") == [(7, 5)]
        assert store.query_rows(f"SELECT sum(count), sumMap(pos) FROM {db}.latency_1m") == [
            (7, ([10, 12], [3, 4]))
        ]
        cols = {r[0] for r in store.query_rows(f"DESCRIBE TABLE {db}.worker_checkpoints")}
        assert {"corrected_records", "quarantined_events", "replayed_records"} <= cols
    finally:
        store.close()
