"""Issue 12 item 5, without a broker: when librdkafka's queue is full the producer holds
the batch in hand (never drops it) and lets new events wait in its bounded buffer, which
alone decides what is dropped; nothing handed to librdkafka expires."""

from __future__ import annotations

import time

import orjson
import pytest

from pipeline.contract.partitioning import partition_for
from producers.emit import Batcher, BatchPolicy, KafkaSink, rebatch
from tests.ceilings import ceiling
from tests.factories import received

QUEUE_MESSAGES = 5
BUFFER = 40


def test_a_full_librdkafka_queue_holds_batches_and_the_buffer_decides_drops() -> None:
    sink = KafkaSink(
        {
            "bootstrap.servers": "127.0.0.1:9",  # nobody there: nothing is ever delivered
            "queue.buffering.max.messages": QUEUE_MESSAGES,
            "socket.connection.setup.timeout.ms": 1000,
        },
        topic_for=lambda _e: "lc",
        topics=["lc"],
        partitions={"lc": 1},
        policy=BatchPolicy(max_events=1, max_delay_ms=1),
        buffer_max_events=BUFFER,
    )
    try:
        emitted = 0
        for i in range(25):  # fills librdkafka's queue; the rest is held
            sink.emit(received(f"r{i}"))
            emitted += 1
        deadline = time.monotonic() + ceiling(10)
        while sink._inflight_events + len(sink._held) < emitted and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the thread's own counters: no event to await
        # Nothing dropped yet: 5 in librdkafka's queue, 20 held by the producer.
        assert sink.counters.events_dropped == 0
        assert sink._inflight_events == QUEUE_MESSAGES
        for i in range(25, 200):
            sink.emit(received(f"r{i}"))
            emitted += 1
        # (emit drops synchronously: nothing to wait for)
        c = sink.counters
        # The buffer filled (BUFFER events) and only then did emit drop, and count.
        assert c.events_dropped == emitted - QUEUE_MESSAGES - 20 - BUFFER
        assert sink.buffered + sink._inflight_events + c.events_dropped == emitted
        assert c.events_failed == 0  # message.timeout.ms = 0: nothing expires
    finally:
        sink.close(timeout_s=0.2)


@pytest.mark.parametrize(
    ("events", "before", "after", "max_events"),
    [
        (7, 4, 2, 200),  # fewer partitions
        (7, 2, 4, 200),  # more
        (9, 4, 1, 4),  # one partition, cut at max_events
        (1, 4, 3, 200),  # a message of one event (no array)
    ],
)
def test_held_batches_are_made_again_for_a_new_partition_count(
    events: int, before: int, after: int, max_events: int
) -> None:
    batcher = Batcher(before, BatchPolicy(max_events=max_events))
    made = [b for i in range(events) for b in batcher.add(received(f"r{i}"), 0.0)]
    held = [("lc", p, payload, n) for p, payload, n in made + batcher.drain()]
    out = rebatch(held, {"lc": after}, max_events)
    seen: list[str] = []
    for topic, p, payload, n in out:
        doc = orjson.loads(payload)
        items = doc if isinstance(doc, list) else [doc]
        assert topic == "lc"
        assert n == len(items) <= max_events
        for d in items:
            assert partition_for(d["request_id"], after) == p
            seen.append(d["request_id"])
    assert sorted(seen) == sorted(f"r{i}" for i in range(events))
