"""vLLM's real classes feed the tailguard plugin; its events, on the real broker, are joined
by the real worker with gateway events carrying the same request ids.

Needs ``vllm`` (not in the default test environment: ``./tg vllm-test`` builds
``.venv-vllm`` and runs this module); skipped otherwise.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vllm: run ./tg vllm-test")

from pipeline.adapters.store import open_store
from pipeline.contract.codec import SourceRef, decode_message
from pipeline.contract.events import EngineFinished, EngineStats, GatewayCompleted, GatewayReceived
from pipeline.contract.partitioning import partition_for
from producers.emit import open_kafka_sink
from producers.vllm_plugin import TailguardStatLogger
from tests.integration.harness import WorkerProcess, make_settings, read_all
from tests.kafka_fixture import KafkaUnderTest
from tests.vllm_driver import DrivenRequest, VllmDriver

pytestmark = pytest.mark.integration

MODEL = "tiny-chat"
N = 30


def _requests() -> list[tuple[str, DrivenRequest]]:
    """(gateway X-Request-Id, what the engine does with it)."""
    out = []
    for i in range(N):
        rid = uuid.uuid4().hex if i % 3 else str(uuid.uuid4())  # with and without dashes
        vllm_id = f"chatcmpl-{rid}" if i % 2 == 0 else f"cmpl-{rid}-0"
        if i == 7:  # aborted while still queued: vLLM reports no schedule, no token
            req = DrivenRequest(vllm_id, prompt_tokens=40, output_tokens=0, queue_s=0.3)
        else:
            req = DrivenRequest(
                vllm_id,
                prompt_tokens=20 + i,
                output_tokens=1 + i % 9,
                queue_s=0.004 * i,
                prefill_s=0.020 + 0.001 * i,
                tpot_s=0.003 + 0.0005 * (i % 4),
                cached_tokens=(i % 3) * 8,
                finish_reason="stop" if i % 4 == 0 else "length",
            )
        out.append((rid, req))
    return out


def test_real_vllm_output_processor_to_joined_request_records(
    kafka: KafkaUnderTest, tmp_path: Path
) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path, engine_host="vllm-node")
    plan = _requests()
    driver = VllmDriver(s, served_model_name=MODEL)
    try:
        # vLLM found the plugin through the entry point and built it for engine 0.
        assert TailguardStatLogger in driver.factories
        plugin = driver.plugin
        assert plugin.model == MODEL
        driver.run([r for _, r in plan[: N // 2]], num_waiting=5, kv_cache_usage=0.5)
        driver.run([r for _, r in plan[N // 2 :]], num_waiting=0, kv_cache_usage=0.25)
        assert driver.flush() == 0
        counters = plugin.sink.counters  # type: ignore[attr-defined]
        assert (counters.events_dropped, counters.events_failed) == (0, 0)
        rec = plugin.recorder(0).counters
        assert (rec.finished_emitted, rec.invalid, rec.errors, rec.without_request_id) == (
            N,
            0,
            0,
            0,
        )
        arrivals = dict(driver.arrival_wall_s)
    finally:
        driver.close()

    # The gateway's side of the same requests (the proxy would emit these).
    gw = open_kafka_sink(s, service="gateway-test")
    now_ns = time.time_ns()
    for i, (rid, r) in enumerate(plan):
        start = int(arrivals[r.vllm_request_id] * 1e9) - 2_000_000
        total_ms = r.e2e_s * 1000 + 3.0
        gw.emit(
            GatewayReceived(
                v=1,
                event_id=f"gw-0:{rid}:r",
                kind="gateway.received",
                request_id=rid,
                ts_unix_ns=start,
                host="gw-0",
                model=MODEL,
                priority=i % 4,
                prompt_tokens=r.prompt_tokens,
                stream=True,
            )
        )
        aborted = r.output_tokens == 0
        gw.emit(
            GatewayCompleted(
                v=1,
                event_id=f"gw-0:{rid}:c",
                kind="gateway.completed",
                request_id=rid,
                ts_unix_ns=min(start + int(total_ms * 1e6), now_ns),
                host="gw-0",
                model=MODEL,
                total_ms=total_ms,
                ttfb_ms=None if aborted else (r.frontend_s + r.queue_s + r.prefill_s) * 1000 + 2,
                http_status=0 if aborted else 200,
                outcome="client_abort" if aborted else "ok",
                output_tokens=r.output_tokens,
            )
        )
    gw.close()
    assert (gw.counters.events_sent, gw.counters.events_dropped) == (2 * N, 0)

    # On the broker: contract messages, batched, on the contract's partition.
    finished: dict[str, EngineFinished] = {}
    batched = 0
    for m in read_all(s, s.lifecycle_topic):
        decoded = decode_message(m.value(), SourceRef(m.topic(), m.partition(), m.offset()))
        assert decoded.dead == []
        batched += len(decoded.events) > 1
        for e in decoded.events:
            assert m.partition() == partition_for(e.request_id, s.topic_partitions)
            if isinstance(e, EngineFinished):
                finished[e.request_id] = e
    assert batched > 0
    assert set(finished) == {rid for rid, _ in plan}
    stats_events = [
        e
        for m in read_all(s, s.engine_stats_topic)
        for e in decode_message(m.value(), SourceRef(m.topic(), m.partition(), m.offset())).events
    ]
    stats = [e for e in stats_events if isinstance(e, EngineStats)]
    assert stats, "engine.stats expected"
    assert len(stats) == len(stats_events)
    assert {(e.host, e.model) for e in stats} == {("vllm-node/engine0", MODEL)}
    assert stats[0].num_waiting == 5
    assert stats[0].kv_cache_usage == 0.5
    assert stats[0].prefix_cache_hit_rate is not None

    worker = WorkerProcess(s, tmp_path / "worker.log")
    try:
        worker.wait_caught_up()
    finally:
        worker.stop()

    store = open_store(s)
    try:
        rows = store.query_rows(
            "SELECT request_id, source, model, engine_host, gateway_host, queue_ms, prefill_ms, "
            "decode_ms, inference_ms, engine_e2e_ms, prompt_tokens, output_tokens, "
            "cached_tokens, finish_reason, engine_arrival_unix_ns, outcome "
            f"FROM {s.database}.requests FINAL"
        )
    finally:
        store.close()
    by_id = {r[0]: r for r in rows}
    assert len(rows) == N
    assert set(by_id) == {rid for rid, _ in plan}
    for rid, r in plan:
        (
            _,
            source,
            model,
            engine_host,
            gateway_host,
            queue_ms,
            prefill_ms,
            decode_ms,
            inference_ms,
            e2e_ms,
            prompt_tokens,
            output_tokens,
            cached_tokens,
            finish_reason,
            arrival_ns,
            outcome,
        ) = by_id[rid]
        assert (source, model, engine_host, gateway_host) == (
            "joined",
            MODEL,
            "vllm-node/engine0",
            "gw-0",
        ), rid
        # Engine durations are exactly the engine-core timestamps' differences.
        if r.output_tokens == 0:
            assert queue_ms == pytest.approx(e2e_ms)
            assert (prefill_ms, decode_ms, inference_ms) == (0.0, 0.0, 0.0)
            assert (finish_reason, outcome) == ("abort", "client_abort")
        else:
            assert queue_ms == pytest.approx(r.queue_s * 1000, abs=1e-3)
            assert prefill_ms == pytest.approx(r.prefill_s * 1000, abs=1e-3)
            assert decode_ms == pytest.approx(r.decode_s * 1000, abs=1e-3)
            assert inference_ms == pytest.approx((r.prefill_s + r.decode_s) * 1000, abs=1e-3)
            assert finish_reason == r.finish_reason
            assert outcome == "ok"
        # e2e is vLLM's wall-clock measurement: the planned span plus the driving time.
        assert r.e2e_s * 1000 <= e2e_ms < r.e2e_s * 1000 + 5000
        # arrival = iteration wall clock - e2e = the arrival_time vLLM was given
        assert abs(arrival_ns - arrivals[r.vllm_request_id] * 1e9) < 10_000
        assert (prompt_tokens, output_tokens) == (r.prompt_tokens, r.output_tokens)
        assert cached_tokens == (r.cached_tokens if r.output_tokens else 0)
