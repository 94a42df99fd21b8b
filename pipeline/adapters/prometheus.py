"""A worker's ``/metrics``: protobuf or OpenMetrics over HTTP, on 127.0.0.1 unless told
otherwise.

:class:`MetricsState` holds the counters and histograms of the final windows this worker
stored (:meth:`MetricsState.windows_stored`, from the writer thread), the latest
evaluation (budgets, control levels, P99s) that the controller shell publishes after each
step (the worker that runs it), and reads the worker's health when scraped;
:class:`MetricsServer` serves it (a thread; ``close`` stops it). The content is
:mod:`pipeline.core.slo_exposition`'s families (names and their meaning there), in the
format the scrape's ``Accept`` header asks for (:func:`render_for`): Prometheus' delimited
protobuf (:mod:`pipeline.adapters.prometheus_proto`; the only format that carries the
latency histogram's native buckets, which a Prometheus with ``scrape_native_histograms``
asks for first), else OpenMetrics text (``application/openmetrics-text; version=1.0.0``)
or the Prometheus text format 0.0.4, both rendered by ``prometheus_client`` with the
classic buckets only; ``promtool check metrics`` accepts the text.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from pipeline.adapters import prometheus_proto
from pipeline.contract.summary import WindowSummary
from pipeline.core.budget import BudgetStatus
from pipeline.core.slo_exposition import (
    Family,
    HistogramSample,
    Sample,
    WindowCounters,
    all_families,
)

log = logging.getLogger("tailguard.metrics")

METRICS_PATH = "/metrics"


class _Families(Collector):
    def __init__(self, families: Sequence[Family]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for f in self.families:
            names = [k for k, _ in f.samples[0].labels] if f.samples else []
            if f.kind == "histogram":
                h = HistogramMetricFamily(f.name, f.help, labels=names)
                for hs in f.samples:
                    assert isinstance(hs, HistogramSample)
                    buckets = [(floatToGoString(le), n) for le, n in hs.buckets]  # type: ignore[no-untyped-call]
                    h.add_metric([v for _, v in hs.labels], buckets, hs.sum)
                yield h
                continue
            family = CounterMetricFamily if f.kind == "counter" else GaugeMetricFamily
            g = family(f.name, f.help, labels=names)
            for s in f.samples:
                assert isinstance(s, Sample)
                g.add_metric([v for _, v in s.labels], s.value)
            yield g


def _registry(families: Sequence[Family]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return registry


def render(families: Sequence[Family]) -> bytes:
    """OpenMetrics text of ``families`` (ends with ``# EOF``)."""
    text: bytes = generate_latest(_registry(families))  # type: ignore[no-untyped-call]
    return text


def render_for(families: Sequence[Family], accept: str) -> tuple[bytes, str]:
    """``(body, content type)`` in the format the ``Accept`` header asks for: protobuf
    (native and classic histogram buckets) when it asks for that first, OpenMetrics for
    Prometheus otherwise (its scrapes ask for it first without native histograms), the
    Prometheus text format 0.0.4 otherwise (``curl``; what ``promtool check metrics``
    reads)."""
    if prometheus_proto.wants_protobuf(accept):
        return prometheus_proto.encode(families), prometheus_proto.CONTENT_TYPE
    encoder, content_type = choose_encoder(accept)
    return encoder(_registry(families)), content_type


class MetricsState:
    """The latest evaluation, published by the controller; read by scrapes (thread-safe)."""

    def __init__(
        self,
        health: Callable[[], Mapping[str, float]] | None = None,
        counters: WindowCounters | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._counters = counters or WindowCounters()
        self._counting_since_s = time.time()  # the counters' start (created) timestamp
        self._last_evaluation_s: float | None = None
        self._budgets: list[BudgetStatus] = []
        self._levels: dict[str, int] = {}
        self._p99: dict[str, Mapping[str, float | None]] = {}
        self._admit: dict[str, float | None] = {}
        self._not_load_caused: list[tuple[str, str]] = []
        self.health = health

    def publish(
        self,
        budgets: Sequence[BudgetStatus],
        levels: Mapping[str, int],
        p99_ms: Mapping[str, Mapping[str, Any]],
        admit_rps: Mapping[str, float | None] | None = None,
        not_load_caused: Sequence[tuple[str, str]] = (),
    ) -> None:
        """One evaluation: budgets, levels, the signals per model (P99s, load), the
        admission rate in force per model and the (model, SLO) burning not load-caused."""
        with self._lock:
            self._budgets = list(budgets)
            self._levels.update(levels)
            self._p99 = {
                m: {k: v for k, v in sig.items() if k.startswith(("p99.", "load.", "queue."))}
                for m, sig in p99_ms.items()
            }
            if admit_rps is not None:
                self._admit.update(admit_rps)
            self._not_load_caused = list(not_load_caused)
            self._last_evaluation_s = time.time()

    def use_counters(self, counters: WindowCounters) -> None:
        """Count into ``counters`` (fresh: the spec's thresholds among its buckets) from
        now on; their start timestamp is now."""
        with self._lock:
            self._counters = counters
            self._counting_since_s = time.time()

    def windows_stored(self, summaries: Sequence[WindowSummary]) -> None:
        """The final summaries of the windows this worker stored (the writer thread)."""
        with self._lock:
            for s in summaries:
                self._counters.add(s)

    def families(self) -> list[Family]:
        with self._lock:
            budgets, levels, p99 = list(self._budgets), dict(self._levels), dict(self._p99)
            admit, nlc = dict(self._admit), list(self._not_load_caused)
            counted = self._counters.families(self._counting_since_s)
            last_s = self._last_evaluation_s
        health: Mapping[str, float] = {}
        if self.health is not None:
            try:
                health = self.health()
            except Exception:  # a scrape never takes the worker down
                log.exception("worker health for /metrics failed")
        return [
            *counted,
            *all_families(
                budgets, levels, p99, health, admit_rps=admit, not_load_caused=nlc,
                last_evaluation_s=last_s,
            ),
        ]  # fmt: skip


class MetricsServer:
    """``GET /metrics`` on ``host:port`` (port 0 picks a free one) in a daemon thread."""

    def __init__(self, state: MetricsState, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = state

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != METRICS_PATH:
                    self.send_error(404)
                    return
                body, content_type = render_for(state.families(), self.headers.get("Accept", ""))
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: one line per scrape is noise

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        address = self._server.server_address
        self.host, self.port = str(address[0]), int(address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="tailguard-metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics on http://%s:%d%s", self.host, self.port, METRICS_PATH)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{METRICS_PATH}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)
