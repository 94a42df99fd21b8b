"""Issue 53 on the real embedded engine: what ``tailguard report`` counts besides latency and
SLOs (requests per source and outcome, control modes, the bad requests' time, the clock
skew) is read from the windows' own counts (``sql/0018``: the '__slo__' rows and their
hourly rollups) and equals what ``requests`` alone says, for a store replayed from a
generated trace of ~2 hours (whole hours in the rollups, cut windows at both ends of a
range, a model, windows written before the counts were kept)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.adapters.queries import budget, counts, requests, windows
from pipeline.adapters.queries.filters import ReportFilter
from pipeline.adapters.store import migrate, open_store, repair_rollups, write_windows
from pipeline.app.report import counts_cover, read_report
from pipeline.cli import main
from pipeline.core.windows import WindowAggregator, WindowConfig
from pipeline.settings import DEFAULT_SLO_SPEC, Settings
from pipeline.spec.slo import load_spec_file
from tests.disorder import count_mismatches, final_records, store_mismatches
from tests.measurement_fixtures import simulate_jsonl
from tests.slo_strategies import JOINED

pytestmark = pytest.mark.integration
SPEC = load_spec_file(DEFAULT_SLO_SPEC)
COPIES = 24
SHIFT_NS = 5 * 60 * 1_000_000_000


def _spread(src: Path, dst: Path) -> None:
    """The trace's events again, copy after copy, each 5 minutes later than the one
    before with its own request and event ids: two hours of traffic."""
    events = [orjson.loads(line) for line in src.open("rb")]
    with dst.open("wb") as fh:
        for k in range(COPIES):
            for e in events:
                e2 = {
                    key: v + k * SHIFT_NS if key.endswith("_unix_ns") and isinstance(v, int) else v
                    for key, v in e.items()
                }
                e2["event_id"] = f"c{k}-{e['event_id']}"
                for key in ("request_id", "logical_request_id"):
                    if e.get(key):
                        e2[key] = f"c{k}-{e[key]}"
                fh.write(orjson.dumps(e2) + b"\n")


def test_where_the_counts_start(tmp_path: Path) -> None:
    """``counted_from_ns``: the end of the last window (or correction) written without the
    counts (built elsewhere, as before 0018); 0 when every window has them. (First in the
    module: one embedded store per process at a time, and the others share one.)"""
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate(store)
        assert counts.counted_from_ns(store) == 0
        agg = WindowAggregator(0, WindowConfig(size_ms=10_000, grace_ms=0))
        agg.add(JOINED, 0)
        (win,) = agg.drain()
        end_ns = (win.start_ms + 10_000) * 1_000_000
        write_windows(store, [win], "t", 0.01, "a")
        assert counts.counted_from_ns(store) == 0
        old = dataclasses.replace(win, counts=None, correction=True)
        write_windows(store, [old], "t", 0.01, "b")
        assert counts.counted_from_ns(store) == end_ns
        later = dataclasses.replace(win, start_ms=win.start_ms + 60_000)
        write_windows(store, [later], "t", 0.01, "c")
        assert counts.counted_from_ns(store) == end_ns
    finally:
        store.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("report-window-counts")
    one, events, store_dir = tmp / "one.jsonl", tmp / "events.jsonl", tmp / "store"
    simulate_jsonl(one, seed=9, limit=250)
    _spread(one, events)
    assert main(["replay", str(events), "--store", str(store_dir), "--json"]) == 0
    store = open_store(Settings(store_dir=store_dir))
    recs = final_records(store)
    yield {"store": store, "records": recs}
    store.close()


def test_the_windows_counts_equal_an_exact_count(built: dict[str, Any]) -> None:
    """Per window and key the requests, per window and host pair the offsets' buckets,
    per window, SLO and model the measured bad requests: the exact count over
    ``requests``; the hourly rollups equal the windows (nothing to repair)."""
    store = built["store"]
    assert store_mismatches(store, SPEC) == []
    assert count_mismatches(store, SPEC) == []
    assert repair_rollups(store).total == 0
    ((hours, rows),) = store.query_rows(
        f"SELECT uniqExact(window_start), sum(requests) FROM {store.database}.request_counts_1h"
    )
    assert hours >= 3
    assert rows == len(built["records"])


def _ranges(b: dict[str, Any]) -> list[tuple[str, ReportFilter]]:
    ends = sorted(r.end_unix_ns for r in b["records"])
    first_s, last_s = ends[0] / 1e9, ends[-1] / 1e9
    model = sorted({r.model for r in b["records"]})[0]
    return [
        ("whole store", ReportFilter()),
        ("cut inside windows at both ends", ReportFilter(first_s + 73.3, last_s - 61.7)),
        ("from a cut window on", ReportFilter(since_unix_s=first_s + 1925.05)),
        ("up to a cut window", ReportFilter(until_unix_s=last_s - 1800.5)),
        ("one model, cut", ReportFilter(first_s + 13.3, last_s - 7.1, model=model)),
    ]


def _same_summary(a: requests.RangeSummary, b: requests.RangeSummary, what: str) -> None:
    """Counts equal; the float sums within 1e-9 relative; the skew's samples equal and
    its median within 0.05 ms of the exact one."""
    assert (a.requests, a.by_source, a.by_outcome, a.ended_from, a.control) == (
        b.requests, b.by_source, b.by_outcome, b.ended_from, b.control
    ), what  # fmt: skip
    for x, y in zip(a.bad_splits, b.bad_splits, strict=True):
        assert x[0] == y[0], what
        assert x[1:] == pytest.approx(y[1:], rel=1e-9), what
    assert [r[:3] for r in a.clock_skew] == [r[:3] for r in b.clock_skew], what
    for x, y in zip(a.clock_skew, b.clock_skew, strict=True):
        assert abs(x[3] - y[3]) <= 0.05 + 1e-9, (what, x, y)


def test_the_counts_read_from_windows_equal_those_of_requests(built: dict[str, Any]) -> None:
    store = built["store"]
    last_ms = budget.last_window_end_ms(store)
    for what, f in _ranges(built):
        part = counts_cover(store, f, last_ms)
        assert part.windows or part.minutes, what
        if f.since_unix_s is None or f.until_unix_s is None or f.model is not None:
            assert part.hours, what  # the hourly rollups answered some of it
        got = requests.range_summary(
            store, f, split_slos=SPEC.slos, ended_from_ms=last_ms, cover=part
        )
        alone = requests.range_summary(store, f, split_slos=SPEC.slos, ended_from_ms=last_ms)
        assert got.skew_basis == requests.SKEW_BUCKETED, what
        assert alone.skew_basis == requests.SKEW_EXACT, what
        assert got.requests > 0, what
        assert any(n for n, _, _ in got.bad_splits), what
        _same_summary(got, alone, what)


def test_the_report_is_the_same_without_windows(
    built: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_report`` from the windows' counts and with no window closed (everything
    from ``requests``): the same figures."""
    store = built["store"]
    closed = windows.closed_through(store)
    for what, f in _ranges(built):
        monkeypatch.setattr(windows, "closed_through", lambda _s: closed)
        got = read_report(store, f, SPEC)
        monkeypatch.setattr(windows, "closed_through", lambda _s: (0, 0))
        alone = read_report(store, f, SPEC)
        assert got.sources["counts"]["windows"], what
        assert not alone.sources["counts"]["windows"], what
        assert (got.requests, got.by_source, got.by_outcome, got.open_windows) == (
            alone.requests, alone.by_source, alone.by_outcome, alone.open_windows
        ), what  # fmt: skip
        assert got.control_verdicts == alone.control_verdicts, what
        for name, slo in got.slos.items():
            assert slo.get("bad_measured") == alone.slos[name].get("bad_measured"), (what, name)
            share, exact = slo.get("bad_queue_share"), alone.slos[name].get("bad_queue_share")
            assert share == (None if exact is None else pytest.approx(exact, rel=1e-9)), what
        assert list(got.clock_skew) == list(alone.clock_skew), what
        for pair, est in got.clock_skew.items():
            exact = alone.clock_skew[pair]
            assert est["samples"] == exact["samples"], (what, pair)
            assert abs(est["offset_p50_ms"] - exact["offset_p50_ms"]) <= 0.05 + 1e-9


def test_windows_written_without_counts_are_read_from_requests(
    built: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store migrated with windows written before 0018 (no counts in them): the report
    reads the requests of the range up to the last such window, and the same figures."""
    store = built["store"]
    ends = sorted(r.end_unix_ns for r in built["records"])
    kept_from = (ends[0] + (ends[-1] - ends[0]) // 2) // 10_000_000_000 * 10_000_000_000
    monkeypatch.setattr(counts, "counted_from_ns", lambda _s: kept_from)
    last_ms = budget.last_window_end_ms(store)
    for what, f in _ranges(built):
        part = counts_cover(store, f, last_ms)
        for a, _ in (*part.hours, *part.minutes, *part.windows):
            assert a >= kept_from, what
        got = requests.range_summary(
            store, f, split_slos=SPEC.slos, ended_from_ms=last_ms, cover=part
        )
        alone = requests.range_summary(store, f, split_slos=SPEC.slos, ended_from_ms=last_ms)
        _same_summary(got, alone, what)
