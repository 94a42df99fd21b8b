"""The worker's own health as OpenTelemetry metrics.

Instruments (meter ``tailguard.worker``):

* ``tailguard.events`` (counter): valid events consumed
* ``tailguard.messages`` (counter): Kafka messages consumed
* ``tailguard.dead_letters`` (counter): rejected events/messages sent to the DLQ
* ``tailguard.records`` (counter): request records written
* ``tailguard.join.timeouts`` (counter, attribute ``side``): partial records
* ``tailguard.join.conflicts`` (counter, attribute ``when``): conflicting terminal events
  (``pipeline.core.join``, "Conflicts"): ``before_record`` (resolved before the record was
  emitted) or ``after_record`` (the record emitted was corrected)
* ``tailguard.join.duplicates`` (counter, attribute ``content``): repeated events, ignored:
  ``changed`` (an event id the join holds, repeated with other content: a producer reusing
  ids) or ``same`` (the same content; or an event the join no longer holds)
* ``tailguard.windows.lateness`` (counter, attribute ``kind``): ``corrected`` (records
  that arrived after their window closed, written as corrections), ``retracted``
  (partials taken back when upgraded), ``quarantined`` (events out of range of the
  partition clock, dead-lettered), ``replayed`` (records a worker taking a partition
  over found already counted), ``counted_before`` (repeats of requests the join had
  forgotten that the windows counted already: ``pipeline.core.counted``)
* ``tailguard.windows.closed`` (counter)
* ``tailguard.clickhouse.write.duration`` (histogram, ms): one flush's writes
* ``tailguard.clickhouse.write.retries`` (counter)
* ``tailguard.consumer.lag`` (gauge): messages behind the high watermark
* ``tailguard.join.pending`` (gauge): requests waiting for their partner
* ``tailguard.clock.host_offset`` (gauge, ms, attribute ``host``): how far each host's
  clock mark stands from its partition's watermark (a skewed host shows here)

Request latency (``request_metrics=True``, on unless the exporter is ``none``), under
OpenTelemetry's semantic-convention names and units (seconds), one histogram per
boundary that has a metric convention (:data:`pipeline.core.otel_names.BOUNDARY_NAMES`,
docs/integrations.md's table): ``gen_ai.server.request.duration`` (engine end-to-end),
``gen_ai.server.time_to_first_token``, ``gen_ai.server.time_per_output_token``, and
``http.server.request.duration`` (the gateway's total), with ``gen_ai.request.model``
and ``gen_ai.operation.name`` (plus ``http.request.method`` / ``http.response.status_code``
on the HTTP one), and the conventions' advised bucket boundaries.

Exporters: ``none`` (an in-memory reader, readable by tests), ``console``
(JSON to a file, every ``metrics_interval_ms``), or ``otlp`` (needs the
``opentelemetry-exporter-otlp-proto-http`` package; endpoint from the usual
``OTEL_EXPORTER_OTLP_*`` variables).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    InMemoryMetricReader,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from pipeline.core.otel_names import (
    BOUNDARY_NAMES,
    DEFAULT_OPERATION,
    MODEL_ATTRIBUTE,
    OPERATION_ATTRIBUTE,
)
from pipeline.core.record import RequestRecord

# Bucket boundaries (s) the GenAI / HTTP semantic conventions advise for each metric.
_BUCKETS_S: dict[str, list[float]] = {
    "gen_ai.server.request.duration": [
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    ],
    "gen_ai.server.time_to_first_token": [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0,
    ],
    "gen_ai.server.time_per_output_token": [
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    ],
    "http.server.request.duration": [
        0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    ],
}  # fmt: skip


class ConfigError(Exception):
    """A setting that cannot work (raised at start-up)."""


def _reader(
    exporter: str, interval_ms: int, metrics_file: Path | None
) -> tuple[MetricReader, IO[str] | None]:
    if exporter == "none":
        return InMemoryMetricReader(), None
    if exporter == "console":
        fh = metrics_file.open("a") if metrics_file else None
        exp = ConsoleMetricExporter(out=fh) if fh else ConsoleMetricExporter()
        return PeriodicExportingMetricReader(exp, export_interval_millis=interval_ms), fh
    if exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError as exc:
            raise ConfigError(
                "metrics_exporter=otlp needs the opentelemetry-exporter-otlp-proto-http package"
            ) from exc
        return PeriodicExportingMetricReader(
            OTLPMetricExporter(), export_interval_millis=interval_ms
        ), None
    raise ConfigError(f"unknown metrics_exporter {exporter!r} (none, console, otlp)")


def meter_provider(
    service_name: str,
    exporter: str,
    interval_ms: int = 10_000,
    metrics_file: Path | None = None,
) -> tuple[MeterProvider, MetricReader]:
    """A meter provider for one of tailguard's own processes (gateway, Envoy ingester)."""
    reader, _fh = _reader(exporter, interval_ms, metrics_file)
    provider = MeterProvider(
        metric_readers=[reader], resource=Resource.create({"service.name": service_name})
    )
    return provider, reader


class WorkerTelemetry:
    def __init__(
        self,
        service_name: str,
        *,
        exporter: str = "none",
        interval_ms: int = 10_000,
        metrics_file: Path | None = None,
        lag: Callable[[], int] | None = None,
        pending: Callable[[], int] | None = None,
        host_offsets: Callable[[], dict[str, int]] | None = None,
        request_metrics: bool | None = None,
    ) -> None:
        self.reader, self._fh = _reader(exporter, interval_ms, metrics_file)
        self.provider = MeterProvider(
            metric_readers=[self.reader],
            resource=Resource.create({"service.name": service_name}),
        )
        m = self.provider.get_meter("tailguard.worker")
        self.events = m.create_counter("tailguard.events", unit="{event}")
        self.messages = m.create_counter("tailguard.messages", unit="{message}")
        self.dead_letters = m.create_counter("tailguard.dead_letters", unit="{event}")
        self.records = m.create_counter("tailguard.records", unit="{record}")
        self.join_timeouts = m.create_counter("tailguard.join.timeouts", unit="{record}")
        self.join_conflicts = m.create_counter("tailguard.join.conflicts", unit="{event}")
        self.join_duplicates = m.create_counter("tailguard.join.duplicates", unit="{event}")
        self.lateness = m.create_counter("tailguard.windows.lateness", unit="{record}")
        self.windows_closed = m.create_counter("tailguard.windows.closed", unit="{window}")
        self.write_duration = m.create_histogram("tailguard.clickhouse.write.duration", unit="ms")
        self.write_retries = m.create_counter("tailguard.clickhouse.write.retries", unit="{retry}")

        def gauge(
            fn: Callable[[], int] | None,
        ) -> Callable[[CallbackOptions], Iterable[Observation]]:
            def cb(_options: CallbackOptions) -> Iterable[Observation]:
                return [Observation(fn())] if fn is not None else []

            return cb

        m.create_observable_gauge("tailguard.consumer.lag", [gauge(lag)], unit="{message}")
        m.create_observable_gauge("tailguard.join.pending", [gauge(pending)], unit="{request}")

        def offsets(_options: CallbackOptions) -> Iterable[Observation]:
            if host_offsets is None:
                return []
            return [Observation(v, {"host": h}) for h, v in sorted(host_offsets().items())]

        m.create_observable_gauge("tailguard.clock.host_offset", [offsets], unit="ms")

        if request_metrics is None:
            request_metrics = exporter != "none"
        self.latency: dict[str, Any] = {}
        if request_metrics:
            for boundary, otel in BOUNDARY_NAMES.items():
                if otel.kind == "metric":
                    self.latency[boundary] = m.create_histogram(
                        otel.name,
                        unit="s",
                        description=otel.note,
                        explicit_bucket_boundaries_advisory=_BUCKETS_S[otel.name],
                    )

    def record_latencies(self, records: Iterable[RequestRecord]) -> None:
        """Each record's boundaries under their OTel names, in seconds (no-op when off)."""
        if not self.latency:
            return
        hists = list(self.latency.items())
        for r in records:
            attrs: dict[str, str | int] = {
                MODEL_ATTRIBUTE: r.model,
                OPERATION_ATTRIBUTE: DEFAULT_OPERATION,
            }
            for boundary, hist in hists:
                ms = getattr(r, boundary)
                if ms is None:
                    continue
                if boundary == "gateway_total_ms":
                    http = {**attrs, "http.request.method": "POST"}
                    if r.http_status:
                        http["http.response.status_code"] = r.http_status
                    hist.record(ms / 1000.0, http)
                else:
                    hist.record(ms / 1000.0, attrs)

    def snapshot(self) -> dict[str, Any]:
        """Current values by instrument name (summed over attributes); in-memory reader only."""
        if not isinstance(self.reader, InMemoryMetricReader):
            return {}
        out: dict[str, Any] = {}
        data = self.reader.get_metrics_data()
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    points: list[Any] = list(metric.data.data_points)
                    if hasattr(points[0] if points else None, "value"):
                        out[metric.name] = sum(p.value for p in points)
                    elif points:
                        out[metric.name] = {
                            "count": sum(p.count for p in points),
                            "sum": sum(p.sum for p in points),
                        }
        return out

    def shutdown(self) -> None:
        self.provider.shutdown()
        if self._fh is not None:
            self._fh.close()
