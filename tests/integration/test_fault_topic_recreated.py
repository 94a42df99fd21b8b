"""Issue 12 item 6: the lifecycle topic is deleted and recreated while a worker runs. The
worker notices (an error in its log), resubscribes and processes the new topic's messages
from its first offset: every request produced after the recreation reaches the store."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from pipeline.adapters.kafka_admin import ensure_topics
from tests.integration.faults import consecutive_events, produce_batches, wait_for
from tests.integration.harness import make_settings, running_caught_up

pytestmark = [pytest.mark.integration, pytest.mark.long(45)]


def _stored(s) -> set[str]:  # type: ignore[no-untyped-def]
    from pipeline.adapters.query_server import open_reader

    store = open_reader(s)  # through the worker's query port while it owns the store
    try:
        return {r for (r,) in store.query_rows(f"SELECT request_id FROM {s.database}.requests")}
    finally:
        store.close()


def test_a_deleted_and_recreated_topic_is_detected_and_resubscribed(kafka, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path)
    first, second = consecutive_events(2_000, 2_000, seed=91)
    produce_batches(s, first)
    with running_caught_up(s, tmp_path / "worker.log") as worker:
        a = AdminClient(s.kafka_config())
        a.delete_topics([s.lifecycle_topic])[s.lifecycle_topic].result(timeout=30)
        wait_for(
            lambda: s.lifecycle_topic not in a.list_topics(timeout=10).topics,
            "the deletion",
            30,
        )
        wait_for(
            lambda: "was deleted:" in worker.log_tail(50_000),
            "the worker noticing the deletion",
            60,
        )
        t_recreate = time.monotonic()
        ensure_topics(s)
        produce_batches(s, second)
        want = {ev.request_id for ev in second}
        wait_for(lambda: want <= _stored(s), "the new topic's requests in the store", 90, 0.5)
        took = time.monotonic() - t_recreate
        assert worker.alive()
    log_text = worker.log_path.read_text(errors="replace")
    print(f"requests after the recreation stored {took:.1f}s after it")
    assert "was deleted:" in log_text, log_text[-3000:]
    assert "was created again" in log_text, log_text[-3000:]
    assert "ERROR" in log_text
