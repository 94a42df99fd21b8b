"""The worker's request-latency metrics under OpenTelemetry's GenAI / HTTP names, in
seconds, with the conventions' attributes (read back from the SDK's in-memory reader)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from pipeline.adapters.telemetry import WorkerTelemetry
from pipeline.core.record import build_record
from tests.factories import completed, finished, received


def histograms(t: WorkerTelemetry) -> dict[str, Any]:
    assert isinstance(t.reader, InMemoryMetricReader)
    data = t.reader.get_metrics_data()
    if data is None:  # nothing recorded at all
        return {}
    return {
        m.name: m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name.startswith(("gen_ai.", "http."))
    }


def test_latency_metrics_use_genai_names_in_seconds() -> None:
    t = WorkerTelemetry("test", request_metrics=True)
    joined = build_record("a", received("a"), completed("a"), finished("a"))
    gateway_only = build_record("b", received("b"), completed("b"), None)
    t.record_latencies([joined, gateway_only])
    got = histograms(t)
    assert set(got) == {
        "gen_ai.server.request.duration",
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "http.server.request.duration",
    }
    assert {m.unit for m in got.values()} == {"s"}
    (ttft,) = got["gen_ai.server.time_to_first_token"].data.data_points
    assert ttft.count == 1  # the gateway-only record has no engine TTFT
    assert ttft.sum == pytest.approx(joined.ttft_engine_ms / 1000)
    assert dict(ttft.attributes) == {"gen_ai.request.model": joined.model,
                                     "gen_ai.operation.name": "chat"}  # fmt: skip
    assert ttft.explicit_bounds[0] == 0.001
    (http,) = got["http.server.request.duration"].data.data_points
    assert http.count == 2
    assert http.sum == pytest.approx(
        (joined.gateway_total_ms + gateway_only.gateway_total_ms) / 1000
    )
    assert http.attributes["http.request.method"] == "POST"
    assert http.attributes["http.response.status_code"] == 200
    t.shutdown()


def test_off_with_no_exporter_by_default() -> None:
    t = WorkerTelemetry("test")
    t.record_latencies([build_record("a", received("a"), completed("a"), finished("a"))])
    assert histograms(t) == {}
    t.shutdown()
