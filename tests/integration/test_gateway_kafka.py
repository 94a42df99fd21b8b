"""Kafka down is not an outage: the gateway proxy keeps serving while the real broker is
stopped, and the events of those requests reach Kafka once it is back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from pipeline.contract.codec import decode_message
from pipeline.contract.partitioning import partition_for
from pipeline.settings import Settings
from producers.emit import KafkaSink, open_kafka_sink
from producers.gateway_proxy import build_gateway
from tests.gateway_fixtures import serve, wait_for
from tests.integration.harness import make_settings, read_all
from tests.kafka_fixture import KafkaUnderTest
from tools.dev.fake_openai import FakeOpenAI

pytestmark = [pytest.mark.integration, pytest.mark.private_broker]


def events_on_topic(s: Settings) -> dict[str, set[str]]:
    """request id -> kinds seen on the lifecycle topic; checks each event's partition."""
    out: dict[str, set[str]] = {}
    for msg in read_all(s, s.lifecycle_topic):
        decoded = decode_message(msg.value(), source=None)  # type: ignore[arg-type]
        assert not decoded.dead
        for e in decoded.events:
            assert msg.partition() == partition_for(e.request_id, s.topic_partitions)
            out.setdefault(e.request_id, set()).add(e.kind)
    return out


def metric_values(reader: InMemoryMetricReader) -> dict[str, float]:
    data = reader.get_metrics_data()
    out: dict[str, float] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = sum(p.value for p in m.data.data_points)  # type: ignore[attr-defined]
    return out


@pytest.fixture
def gateway(
    kafka: KafkaUnderTest, tmp_path: Path
) -> Iterator[tuple[str, Settings, KafkaSink, InMemoryMetricReader]]:
    s = make_settings(kafka.bootstrap_servers, tmp_path)
    reader = InMemoryMetricReader()
    sink = open_kafka_sink(s, service="gateway", meter_provider=MeterProvider([reader]))
    with serve(FakeOpenAI()) as upstream_url:
        app, _proxy, _mw = build_gateway(upstream_url, sink, host="gw")
        with serve(app) as url:
            yield url, s, sink, reader
    sink.close(timeout_s=5)


def _requests(client: httpx.Client, url: str, n: int) -> tuple[list[str], list[float]]:
    ids, latencies_ms = [], []
    for i in range(n):
        t0 = time.perf_counter()
        r = client.post(
            f"{url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": str(i)}]},
        )
        latencies_ms.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, r.text
        ids.append(r.headers["x-request-id"])
    return ids, latencies_ms


def test_broker_stopped_mid_run_requests_still_served_then_events_resume(
    kafka: KafkaUnderTest, gateway: tuple[str, Settings, KafkaSink, InMemoryMetricReader]
) -> None:
    if not kafka.can_restart:
        pytest.skip("needs the local broker (stop/start)")
    assert kafka.local is not None
    url, s, sink, reader = gateway
    with httpx.Client() as client:
        before, up_ms = _requests(client, url, 30)
        wait_for(lambda: sink.counters.events_sent == 60, 30, "events before the outage")

        kafka.local.stop()
        try:
            during, down_ms = _requests(client, url, 30)  # every one served
            assert sink.counters.events_sent == 60  # nothing delivered while down
        finally:
            kafka.local.start()
        after, _ = _requests(client, url, 30)

    # librdkafka reconnects by itself; the buffered events of the outage are delivered
    wait_for(lambda: sink.counters.events_sent == 180, 60, "events to resume")
    assert (sink.counters.events_dropped, sink.counters.events_failed) == (0, 0)
    on_topic = events_on_topic(s)
    for rid in before + during + after:
        assert on_topic.get(rid) == {"gateway.received", "gateway.completed"}, rid
    m = metric_values(reader)
    assert m["tailguard.producer.events.sent"] == 180
    assert m["tailguard.producer.events.dropped"] == 0
    up_ms.sort()
    down_ms.sort()
    print(f"median request latency: broker up {up_ms[15]:.2f} ms, down {down_ms[15]:.2f} ms")


def test_unreachable_broker_from_start_drops_and_counts_never_blocks(tmp_path: Path) -> None:
    s = Settings(bootstrap_servers="127.0.0.1:9", store_dir=tmp_path / "store")  # nobody there
    reader = InMemoryMetricReader()
    sink = open_kafka_sink(
        s, service="gateway", buffer_max_events=10, meter_provider=MeterProvider([reader])
    )
    try:
        with serve(FakeOpenAI()) as upstream_url:
            app, _proxy, _mw = build_gateway(upstream_url, sink, host="gw")
            with serve(app) as url, httpx.Client() as client:
                ids, _ = _requests(client, url, 20)  # 40 events into a 10-event buffer
        assert len(set(ids)) == 20
        assert sink.buffered == 10
        assert not sink.partitions_known
        assert sink.counters.events_dropped == 30
        m = metric_values(reader)
        assert m["tailguard.producer.events.dropped"] == 30
        assert m["tailguard.producer.buffered"] == 10
        t0 = time.monotonic()
        assert sink.flush(timeout_s=0.5) == 10  # undelivered, reported, not hanging
        assert time.monotonic() - t0 < 5
    finally:
        sink.close(timeout_s=0.5)
    assert sink.counters.events_dropped == 40  # what was left at close counts as dropped
