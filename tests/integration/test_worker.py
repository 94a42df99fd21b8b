"""The worker on the real broker and the embedded ClickHouse engine."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from pipeline.adapters.store import open_store
from pipeline.app.demo import kafka_sink
from pipeline.contract.codec import encode_event
from tests.factories import completed, finished, received
from tests.integration.harness import WorkerProcess, make_settings, read_all

pytestmark = pytest.mark.integration

N = 3000


def test_worker_joins_batched_and_single_messages_and_dead_letters_bad_input(
    kafka, tmp_path: Path
) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path, max_message_bytes=100_000)
    sink = kafka_sink(s)
    # Gateway events as single-event messages keyed by request_id through the
    # client's murmur2 partitioner; engine events batched by our Batcher. The
    # contract's hash must put both on the same partition.
    single = Producer(s.kafka_config() | {"partitioner": "murmur2_random", "linger.ms": 5})
    expected_abort = 0
    for i in range(N):
        rid = f"req-{i}"
        single.produce(s.lifecycle_topic, encode_event(received(rid, i)), key=rid)
        if i % 100 == 0:  # client abort: the engine never reports it
            single.produce(
                s.lifecycle_topic,
                encode_event(
                    completed(rid, i + 50, total_ms=50, outcome="client_abort", http_status=0)
                ),
                key=rid,
            )
            expected_abort += 1
            continue
        sink.emit(finished(rid, i + 98, queue_ms=float(i % 13)))
        single.produce(s.lifecycle_topic, encode_event(completed(rid, i + 100)), key=rid)
        if i % 500 == 1:  # an at-least-once producer retry: same event again
            sink.emit(finished(rid, i + 98, queue_ms=float(i % 13)))
    bad = [
        b"{this is not json",
        b"["
        + encode_event(completed("ok-in-bad-batch"))
        + b', {"v": 1, "kind": "gateway.completed"}]',
        orjson.dumps(
            {
                "v": 1,
                "event_id": "x",
                "kind": "engine.finished",
                "request_id": "neg",
                "ts_unix_ns": 1,
                "host": "h",
                "model": "m",
                "arrival_unix_ns": 1,
                "queue_ms": -5.0,
                "prefill_ms": 1.0,
                "decode_ms": 1.0,
                "inference_ms": 2.0,
                "e2e_ms": 1.0,
                "prompt_tokens": 1,
                "output_tokens": 1,
                "finish_reason": "stop",
            }
        ),
        b'{"v": 1, "kind": "gateway.teleported"}',
        b"x" * 200_000,  # over the worker's max_message_bytes below
    ]
    for i, raw in enumerate(bad):
        single.produce(s.lifecycle_topic, raw, partition=i % 4)
    sink.flush()
    assert single.flush(30) == 0

    worker = WorkerProcess(s, tmp_path / "worker.log")
    try:
        worker.wait_caught_up()
        assert worker.alive(), "a bad message must not stop the worker"
    finally:
        worker.stop()

    store = open_store(s)
    try:
        rows = dict(
            store.query_rows(
                f"SELECT source, count() FROM {s.database}.requests FINAL GROUP BY source"
            )
        )
        total = store.query_rows(
            f"SELECT count(), uniqExact(request_id) FROM {s.database}.requests FINAL"
        )[0]
        aborts = store.query_rows(
            f"SELECT count() FROM {s.database}.requests FINAL "
            "WHERE outcome = 'client_abort' AND source = 'gateway_only' AND queue_ms IS NULL"
        )[0][0]
        qsum = store.query_rows(f"SELECT sum(queue_ms) FROM {s.database}.requests FINAL")[0][0]
    finally:
        store.close()
    # +1: the valid neighbour of a bad event in one batch
    assert rows == {"joined": N - expected_abort, "gateway_only": expected_abort + 1}
    assert total == (N + 1, N + 1)
    assert aborts == expected_abort
    assert qsum == sum(float(i % 13) for i in range(N) if i % 100)

    dead = read_all(s, s.dlq_topic)
    reasons = sorted(dict(m.headers())["tailguard.reason"].decode().split(":")[0] for m in dead)
    assert reasons == sorted(
        ["invalid_json", "invalid_event", "invalid_event", "invalid_event", "oversize"]
    )
    for m in dead:
        h = dict(m.headers())
        assert h["tailguard.source.topic"].decode() == s.lifecycle_topic
        assert int(h["tailguard.source.offset"]) >= 0
    assert any(m.value() == b"{this is not json" for m in dead)
    assert " dead_letters=5 " in worker.log_tail(20_000), "the worker counts what it dead-letters"
