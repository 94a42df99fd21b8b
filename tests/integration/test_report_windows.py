"""Issue 53 on the real embedded engine: what ``tailguard report`` reads from the windows
(the boundaries' sketches; the per-logical-request SLO counts) equals what ``requests``
says, whatever part of a range the windows answer (``pipeline.core.cover``): a range cut
inside base windows at both ends, the whole store, a model, and the windows taken as
closed only part of the way (the rest read from ``requests``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.adapters.queries import windows
from pipeline.adapters.queries.filters import ReportFilter
from pipeline.adapters.store import REQUEST_COLUMNS, open_store, record_from_row
from pipeline.app.report import QUANTILES, read_report
from pipeline.app.report_html import read_html_data, series_bucket_s
from pipeline.cli import main
from pipeline.contract.boundaries import BOUNDARIES
from pipeline.core.sketch import QuantileSketch
from pipeline.settings import DEFAULT_SLO_SPEC, Settings
from pipeline.spec.slo import load_spec_file
from tests.measurement_fixtures import simulate_jsonl

pytestmark = pytest.mark.integration
SPEC = load_spec_file(DEFAULT_SLO_SPEC)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("report-windows")
    events, store_dir = tmp / "events.jsonl", tmp / "store"
    simulate_jsonl(events, seed=5, limit=2500)
    assert main(["replay", str(events), "--store", str(store_dir), "--json"]) == 0
    store = open_store(Settings(store_dir=store_dir))
    names = ", ".join(n for n, _ in REQUEST_COLUMNS)
    records = [
        record_from_row(r)
        for r in store.query_rows(f"SELECT {names} FROM {store.database}.requests FINAL")
    ]
    closed_ns, window_ms = windows.closed_through(store)
    yield {"store": store, "records": records, "closed_ns": closed_ns, "window_ms": window_ms}
    store.close()


def _ranges(b: dict[str, Any]) -> list[tuple[str, ReportFilter]]:
    ends = sorted(r.end_unix_ns for r in b["records"])
    first_s, last_s = ends[0] / 1e9, b["closed_ns"] / 1e9
    model = sorted({r.model for r in b["records"]})[0]
    return [
        ("whole store", ReportFilter()),
        ("cut inside windows at both ends", ReportFilter(first_s + 73.3, last_s - 61.7)),
        ("from a cut window on", ReportFilter(since_unix_s=first_s + 125.05)),
        ("one model, cut", ReportFilter(first_s + 13.3, last_s - 7.1, model=model)),
    ]


def _exact(b: dict[str, Any], f: ReportFilter) -> dict[str, tuple[int, Any, Any]]:
    """Per boundary: the count, P50 and P99 of a sketch of the exact values in range."""
    lo = -(2**63) if f.since_unix_s is None else int(f.since_unix_s * 1e9)
    hi = 2**63 if f.until_unix_s is None else int(f.until_unix_s * 1e9)
    rs = [r for r in b["records"] if lo <= r.end_unix_ns < hi and f.model in (None, r.model)]
    out = {}
    for name in BOUNDARIES:
        sk = QuantileSketch()
        sk.add_many([getattr(r, name) for r in rs if getattr(r, name) is not None])
        out[name] = (sk.count, *(sk.quantile(q) for q in QUANTILES))
    return out


@pytest.mark.parametrize("closed_back_s", [0, 95])
def test_windows_and_requests_answer_the_same(
    built: dict[str, Any], closed_back_s: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``closed_back_s``: the windows taken as closed that many seconds less far (a live
    store's open windows): what they no longer answer is read from ``requests``."""
    store = built["store"]
    closed = built["closed_ns"] - closed_back_s * 1_000_000_000
    monkeypatch.setattr(windows, "closed_through", lambda _s: (closed, built["window_ms"]))
    for what, f in _ranges(built):
        got = read_report(store, f, SPEC)
        for name, (n, p50, p99) in _exact(built, f).items():
            stats = got.boundaries[name]
            assert (stats.count, stats.p50, stats.p99) == (n, p50, p99), (what, name)
        assert got.sources["latency"]["windows"], what  # the windows answered some of it
        assert got.sources["boundaries_counted"] == got.requests, what
        # the same report with no window closed: everything from requests
        monkeypatch.setattr(windows, "closed_through", lambda _s: (0, 0))
        alone = read_report(store, f, SPEC)
        monkeypatch.setattr(windows, "closed_through", lambda _s: (closed, built["window_ms"]))
        assert not alone.sources["latency"]["windows"], what
        assert got.logical == alone.logical, what
        assert got.boundaries == alone.boundaries, what
        assert (got.requests, got.by_source, got.by_outcome) == (
            alone.requests, alone.by_source, alone.by_outcome
        ), what  # fmt: skip


def test_long_ranges_chart_per_hour(built: dict[str, Any]) -> None:
    """Over ~3 weeks and more the charts are per hour (``series_bucket_s``): each hour's
    P99 is the sketch of its requests' values, and its SLO totals the minutes'."""
    store = built["store"]
    ends = [r.end_unix_ns for r in built["records"]]
    hi = max(ends) / 1e9 + 3600
    long_range, short = ReportFilter(hi - 30 * 86400, hi), ReportFilter(hi - 86400, hi)
    assert series_bucket_s(store, short) == 60
    assert series_bucket_s(store, long_range) == 3600
    data = read_html_data(store, long_range, SPEC)
    assert data.bucket_s == 3600
    by_hour: dict[int, list[float]] = {}
    for r in built["records"]:
        if r.gateway_total_ms is not None:
            by_hour.setdefault(r.end_unix_ns // 3_600_000_000_000 * 3600, []).append(
                r.gateway_total_ms
            )
    want = {}
    for t, values in by_hour.items():
        sk = QuantileSketch()
        sk.add_many(values)
        want[float(t)] = sk.quantile(0.99)
    assert dict(data.latency_p99["gateway_total_ms"]) == pytest.approx(want, rel=1e-12)
    assert len(want) >= 1
    for series in (*data.burn_rate.values(), *data.budget_remaining.values()):
        assert all(t % 3600 == 0 for t, _ in series)
    minutes = read_html_data(store, ReportFilter(hi - 2 * 86400, hi), SPEC)
    assert minutes.bucket_s == 60
    assert len(minutes.latency_p99["gateway_total_ms"]) > len(want)
