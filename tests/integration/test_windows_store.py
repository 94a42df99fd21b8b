"""Stored window sketches: ClickHouse SQL gives the stream's quantiles; rollups count once."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from pipeline.adapters.sketch_sql import quantile_from_merged_sql, quantile_key_sql, quantile_sql
from pipeline.adapters.store import open_store
from pipeline.app.replay import replay_file
from pipeline.cli import main
from pipeline.core.sketch import QuantileSketch
from pipeline.settings import DEFAULT_SLO_SPEC, Settings
from pipeline.spec.slo import load_spec_file
from tests.measurement_fixtures import simulate_and_replay

pytestmark = pytest.mark.integration
ALL = ("*", "*", "*")


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and f"{a:.12g}" == f"{b:.12g}")


def test_sql_over_stored_sketches_equals_the_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events, store_dir, first = simulate_and_replay(tmp_path, capsys, seed=5, limit=6000)
    stream = replay_file(events, spec=load_spec_file(DEFAULT_SLO_SPEC))
    windows = {w.start_ms: w for w in stream.windows}
    assert first["windows"]["written"] == len(windows) > 20

    # The same file again: requests are idempotent and no window is written twice.
    assert main(["replay", str(events), "--store", str(store_dir), "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["windows"]["written"] == 0

    store = open_store(Settings(store_dir=store_dir))
    try:
        db = store.database
        per_window = store.query_rows(
            f"SELECT toUnixTimestamp64Milli(window_start), boundary, {quantile_key_sql(0.99)}, "
            f"{quantile_sql(0.99)} FROM {db}.window_sketches "
            "WHERE model = '*' AND boundary != '__slo__' GROUP BY window_start, boundary"
        )
        assert len(per_window) > 100
        for start_ms, boundary, key, value in per_window:
            sk = QuantileSketch.from_columns(windows[start_ms].sketches[(ALL, boundary)])
            assert tuple(key) == sk.quantile_bucket(0.99), (start_ms, boundary)
            assert _same(value, sk.quantile(0.99)), (start_ms, boundary, value, sk.quantile(0.99))

        # The per-minute rollup (materialized view) equals the merge of its windows.
        merged_q = quantile_from_merged_sql(0.99, "sumMap(pos)", "sumMap(neg)", "sum(zero_count)")
        minutes = store.query_rows(
            f"SELECT toUnixTimestamp(window_start) * 1000, sum(records), {merged_q} "
            f"FROM {db}.latency_1m WHERE model = '*' AND boundary = 'gateway_total_ms' "
            "GROUP BY window_start ORDER BY window_start"
        )
        assert sum(n for _, n, _ in minutes) == first["requests"]
        for minute_ms, _, value in minutes:
            sk = QuantileSketch()
            for start, w in windows.items():
                if start - start % 60_000 == minute_ms and (ALL, "gateway_total_ms") in w.sketches:
                    sk.merge(QuantileSketch.from_columns(w.sketches[(ALL, "gateway_total_ms")]))
            assert _same(value, sk.quantile(0.99)), minute_ms

        # SLO counts: windows (via the materialized views) add up to the replay's totals.
        slo_totals = {
            name: (total, good)
            for name, total, good in store.query_rows(
                f"SELECT slo, sum(total), sum(good) FROM {db}.slo_1h "
                "WHERE kind = 'slo' GROUP BY slo"
            )
        }
        for name, want in first["slos"].items():
            assert slo_totals[name] == (want["total"], want["good"]), name
        n = store.query_rows(f"SELECT count() FROM {db}.requests FINAL")[0][0]
        assert n == first["requests"]
        assert datetime.fromtimestamp(min(windows) / 1000, tz=UTC).year == 2025
    finally:
        store.close()
