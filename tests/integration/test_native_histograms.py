"""Native histograms in a real Prometheus (3.16, built by ``tools.dev.prometheus_local``):
two workers' ``/metrics`` scraped over the protobuf format while their windows arrive;
``histogram_quantile(0.99, sum(rate(...)))`` over both is within the sketch's relative
accuracy (1 %) of the P99 the store reports for the same windows (the merged sketches:
the store's SQL selects the bucket :meth:`QuantileSketch.quantile` selects), where the
classic buckets' P99 is a bucket's width off. The classic series are kept beside the
native ones (``always_scrape_classic_histograms``) and the counters' start timestamps
give every series its zero (``created-timestamp-zero-ingestion``), so the rate covers the
first windows too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.adapters.prometheus import MetricsServer, MetricsState
from pipeline.contract.summary import ModelWindow, SLOWindowCounts, WindowSummary
from pipeline.core.sketch import QuantileSketch, exact_quantile_lower
from pipeline.core.slo_exposition import WindowCounters
from tests import ceilings
from tests.metrics_workers import served_workers
from tools.dev.prometheus_local import LocalPrometheus

pytestmark = pytest.mark.integration

RELATIVE_ACCURACY = 0.01
BOUNDARY = "gateway_ttfb_ms"
SELECTOR = f'tailguard_request_latency_seconds{{boundary="{BOUNDARY}"}}'


class NativePrometheus(LocalPrometheus):
    """A :class:`LocalPrometheus` that scrapes native histograms (protobuf first), keeps
    the classic buckets too, and ingests a zero at each series' start timestamp."""

    def config(self) -> dict[str, Any]:
        doc = super().config()
        for scrape in doc["scrape_configs"]:
            scrape["scrape_native_histograms"] = True  # PrometheusProto asked for first
            scrape["always_scrape_classic_histograms"] = True
        return doc

    def command(self) -> list[str]:
        return [*super().command(), "--enable-feature=created-timestamp-zero-ingestion"]


def latencies_ms(rng: np.random.Generator, n: int) -> Any:
    """Time to first byte in an overload: most requests around a second, 4 % queued for
    tens of seconds (the P99 among them, as in the replayed overload)."""
    fast = rng.lognormal(np.log(800.0), 0.5, n)
    queued = rng.lognormal(np.log(45_000.0), 0.3, n)
    return np.where(rng.random(n) < 0.04, queued, fast)


def window(partition: int, start_ms: int, values_ms: Any) -> WindowSummary:
    sk = QuantileSketch(RELATIVE_ACCURACY)
    sk.add_many(values_ms)
    good = int((values_ms <= 2000.0).sum())
    return WindowSummary(
        partition, start_ms, 10_000,
        {"m": ModelWindow(len(values_ms), {BOUNDARY: sk.to_columns()})},
        {"ttfb": SLOWindowCounts(len(values_ms), good, 0.99)},
    )  # fmt: skip


@pytest.fixture
def two_workers() -> Iterator[tuple[list[MetricsState], list[MetricsServer]]]:
    with served_workers(lambda: WindowCounters({BOUNDARY: [2000.0]}, RELATIVE_ACCURACY)) as workers:
        yield workers


def _value(prom: LocalPrometheus, expr: str) -> float | None:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else None


def test_promql_p99_over_two_workers_is_within_the_sketch_error(
    tmp_path: Path, two_workers: tuple[list[MetricsState], list[MetricsServer]]
) -> None:
    states, servers = two_workers
    rng = np.random.default_rng(51)
    merged = QuantileSketch(RELATIVE_ACCURACY)
    values: list[Any] = []
    targets = [f"{s.host}:{s.port}" for s in servers]
    with NativePrometheus(tmp_path / "prom", targets=targets) as prom:
        ceilings.wait_for(
            lambda: _value(prom, "sum(up)") == 2, "both workers scraped", timeout_s=30
        )
        fed = 0
        for batch in range(4):  # windows arrive between scrapes, each worker its partition
            for i in range(10):
                w = batch * 10 + i
                v = latencies_ms(rng, 400)
                values.append(v)
                merged.add_many(v)
                states[w % 2].windows_stored([window(w % 2, w * 10_000, v)])
                fed += len(v)
            ceilings.wait_for(
                lambda: _value(prom, f"histogram_count(sum({SELECTOR}))") == fed,  # noqa: B023
                f"Prometheus' native histograms counting {fed} requests",
                timeout_s=30,
            )
        # both workers' series are native (one histogram sample each) and classic
        assert len(prom.query(f"histogram_count({SELECTOR})")) == 2
        assert prom.query(f'tailguard_request_latency_seconds_bucket{{boundary="{BOUNDARY}"}}')
        native = _value(prom, f"histogram_quantile(0.99, sum(rate({SELECTOR}[10m])))")
        counted = _value(prom, f"histogram_count(sum(increase({SELECTOR}[10m])))")
        classic = _value(
            prom,
            "histogram_quantile(0.99, sum by (le) (rate("
            f'tailguard_request_latency_seconds_bucket{{boundary="{BOUNDARY}"}}[10m])))',
        )
    assert native is not None
    assert classic is not None
    assert counted is not None
    store = merged.quantile(0.99)
    assert store is not None
    store_s = store / 1000.0
    exact_s = exact_quantile_lower(np.sort(np.concatenate(values)), 0.99) / 1000.0
    print(
        f"P99 over {fed} requests, 40 windows, 2 workers: native {native:.3f} s "
        f"({native / store_s - 1:+.2%}), classic {classic:.3f} s ({classic / store_s - 1:+.2%})"
        f", store (merged sketches) {store_s:.3f} s, exact {exact_s:.3f} s; "
        f"requests counted by the rate's increase {counted:.0f}"
    )
    # the rate covers every window, the first ones included (the start timestamps'
    # zeros): the increase counts them all, extrapolated to the range's end at most by
    # the scrape interval's share of the time since the start
    assert fed <= counted < fed * 1.5
    assert abs(native / store_s - 1) <= RELATIVE_ACCURACY
    assert abs(native / exact_s - 1) <= 2 * RELATIVE_ACCURACY
