"""``report --model M``: the per-minute P99 and "where the time goes" charts (JSON and
HTML alike, :func:`pipeline.app.report_html.read_html_data`) show the model's traffic,
read from the latency rollups' per-model rows (issue 51: they were empty)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from pipeline.adapters.queries import windows
from pipeline.adapters.queries.filters import ReportFilter
from pipeline.adapters.store import open_store
from pipeline.app.report_html import LATENCY_BOUNDARIES, SEGMENTS, read_html_data, series_json
from pipeline.settings import Settings
from tests.measurement_fixtures import simulate_and_replay

pytestmark = pytest.mark.integration


def test_model_filter_fills_the_latency_and_breakdown_charts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, store_dir, _ = simulate_and_replay(tmp_path, capsys, seed=7, limit=1500)
    store = open_store(Settings(store_dir=store_dir))
    try:
        boundaries = (*LATENCY_BOUNDARIES, *SEGMENTS)
        ((models,),) = store.query_rows(
            f"SELECT groupUniqArray(model) FROM {store.database}.requests"
        )
        assert len(models) >= 2
        everything = {
            (t, b): n for t, b, _p, _s, n in windows.minute_p99_and_means(
                store, ReportFilter(), boundaries
            )
        }  # fmt: skip
        assert everything
        summed: Counter[tuple[int, str]] = Counter()
        # (filter's model, what its rows must hold)
        cases = [(None, "all traffic"), *((m, f"model {m}") for m in sorted(models))]
        for model, what in cases:
            f = ReportFilter(model=model)
            data = read_html_data(store, f)
            assert set(data.latency_p99) == set(LATENCY_BOUNDARIES), what
            assert set(data.breakdown) == set(SEGMENTS), what
            charts = series_json(data)
            assert charts["latency_p99_ms_per_minute"], what
            assert charts["breakdown_mean_ms_per_minute"], what
            if model is not None:
                for t, b, _p, _s, n in windows.minute_p99_and_means(store, f, boundaries):
                    summed[t, b] += n
        # the models' rows add up to all traffic's, minute by minute and boundary by boundary
        assert dict(summed) == everything
    finally:
        store.close()
