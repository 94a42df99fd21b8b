"""Issue 49, without a broker: how the producer classifies librdkafka's errors. A batch
refused or undelivered because its topic or partition is gone (deleted, created again
soon) is held and produced again, never counted failed; any other error counts its events
failed. Each error name is tallied (``SinkCounters.delivery_errors``) and logged the first
time it is met, not behind the rate-limited warnings (a same-partition recreation counted
~3,000 events failed in CI and the error's name was never seen: it was ``_DESTROY``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline.contract.partitioning import partition_for
from producers.emit import TOPIC_GONE_ERRORS, Batcher, BatchPolicy, KafkaSink, delivery_outcome
from tests.factories import received

# (librdkafka's error name, what the sink does with the batch)
CASES = [
    ("_UNKNOWN_TOPIC", "held"),  # produce() refused: the topic is not in the metadata
    ("_UNKNOWN_PARTITION", "held"),  # its partitions removed, the queue failed
    ("UNKNOWN_TOPIC_OR_PART", "held"),  # the broker's answer
    ("UNKNOWN_TOPIC_ID", "held"),  # Kafka 4: the deleted topic's id
    ("INCONSISTENT_TOPIC_ID", "held"),
    ("_DESTROY", "held"),  # a request in flight to a removed partition (CI's ~3,000)
    ("_MSG_TIMED_OUT", "failed"),  # message.timeout.ms set by a caller: it expired
    ("_PURGE_QUEUE", "failed"),
    ("MSG_SIZE_TOO_LARGE", "failed"),
    ("TOPIC_AUTHORIZATION_FAILED", "failed"),
    ("_DESTROY_BROKER", "failed"),  # (librdkafka retries it: never a delivery report)
]


@pytest.mark.parametrize(("name", "outcome"), CASES)
def test_each_error_name_is_held_or_failed(name: str, outcome: str) -> None:
    assert delivery_outcome(name) == outcome


@pytest.mark.parametrize("name", sorted(TOPIC_GONE_ERRORS))
def test_every_held_name_is_one_librdkafka_reports(name: str) -> None:
    # the set holds names (pure); a misspelt one would never match a real error
    assert KafkaError(getattr(KafkaError, name)).name() == name


class _Msg:
    def __init__(self, topic: str, partition: int, value: bytes) -> None:
        self._t, self._p, self._v = topic, partition, value

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def value(self) -> bytes:
        return self._v


def _free_handle(sink: KafkaSink) -> None:
    """librdkafka's handle freed now, not at the interpreter's exit (no reconnect logs),
    once the sink's thread has ended its last round (it polls the handle)."""
    handle: Any = sink
    handle._thread.join(30)
    handle._producer = None


def _thread_ended(sink: KafkaSink) -> None:
    """The tests call the sink's methods as its thread would, so the thread ends first:
    left running, it sends a held batch again meanwhile (a refusal tallied twice: a
    clean-clone CI run beside two busy loops saw {'_DESTROY': 10} for 5 events)."""
    handle: Any = sink
    with handle._cond:
        handle._closing = True
        handle._cond.notify_all()
    handle._thread.join(30)
    assert not handle._thread.is_alive()


@pytest.fixture
def sink() -> Iterator[KafkaSink]:
    s = KafkaSink(
        {"bootstrap.servers": "127.0.0.1:9", "socket.connection.setup.timeout.ms": 1000},
        topic_for=lambda _e: "lc",
        topics=["lc"],
        partitions={"lc": 1},
        policy=BatchPolicy(max_events=1, max_delay_ms=1),
    )
    _thread_ended(s)
    yield s
    s.close(timeout_s=0.2)
    _free_handle(s)


@pytest.mark.parametrize(("name", "outcome"), CASES)
def test_a_delivery_report_holds_or_fails_the_batch_and_tallies_its_name(
    sink: KafkaSink, caplog: pytest.LogCaptureFixture, name: str, outcome: str
) -> None:
    caplog.set_level(logging.WARNING, logger="producers.emit")
    err = KafkaError(getattr(KafkaError, name))
    for n in (3, 4):  # two batches answered with the same error
        sink._inflight_events += n  # (as _produce_one counts a batch handed over)
        sink._on_delivery(n, 1)(err, _Msg("lc", 0, b"[]"))
    c = sink.counters
    assert c.delivery_errors == {name: 7}
    assert sink._inflight_events == 0
    if outcome == "held":
        assert c.events_failed == 0
        assert [(t, p, n) for t, p, _v, n in sink._held] == [("lc", 0, 3), ("lc", 0, 4)]
        assert sink.buffered == 7  # still the sink's to deliver: flush reports it left
    else:
        assert c.events_failed == 7
        assert not sink._held
    first = [r for r in caplog.records if f"first delivery error {name}" in r.getMessage()]
    assert len(first) == 1, caplog.text  # once per name, at once, with the batch's events
    assert "3 events" in first[0].getMessage()


@pytest.mark.parametrize(("name", "outcome"), CASES)
def test_a_refused_produce_holds_or_drops_the_batch_and_tallies_its_name(
    sink: KafkaSink, name: str, outcome: str
) -> None:
    real = sink._producer

    class Refusing:  # librdkafka refusing the batch; the rest (poll, metadata) as it is
        def produce(self, *_a: object, **_k: object) -> None:
            raise KafkaException(KafkaError(getattr(KafkaError, name)))

        def __getattr__(self, attr: str) -> object:
            return getattr(real, attr)

    sink._producer = Refusing()  # type: ignore[assignment]
    try:
        sink._batched_events += 5
        sink._produce_one("lc", 0, b"[]", 5)
    finally:
        sink._producer = real
    c = sink.counters
    assert c.delivery_errors == {name: 5}
    assert c.events_failed == 0  # refused before librdkafka had it: dropped, not failed
    assert (len(sink._held), c.events_dropped) == ((1, 0) if outcome == "held" else (0, 5))


@pytest.mark.parametrize(
    ("made_for", "now", "kept_as_is"),
    [
        (4, 4, True),  # reported before the counts were read again: _use_counts remakes it
        (4, 2, False),  # reported after (late, as _DESTROY is): made again for 2 now
        (2, 4, False),
    ],
)
def test_a_batch_reported_after_the_counts_changed_is_made_again_for_them(
    made_for: int, now: int, kept_as_is: bool
) -> None:
    sink = KafkaSink(
        {"bootstrap.servers": "127.0.0.1:9", "socket.connection.setup.timeout.ms": 1000},
        topic_for=lambda _e: "lc",
        topics=["lc"],
        partitions={"lc": now},
        policy=BatchPolicy(max_events=200, max_delay_ms=1),
    )
    _thread_ended(sink)
    try:
        batcher = Batcher(made_for, BatchPolicy(max_events=200))
        for i in range(40):
            batcher.add(received(f"r{i}"), 0.0)
        p, payload, n = max(batcher.drain(), key=lambda b: b[2])
        sink._inflight_events += n
        sink._on_delivery(n, made_for)(KafkaError(KafkaError._DESTROY), _Msg("lc", p, payload))
        held = list(sink._held)
        assert sum(h[3] for h in held) == n == sink.buffered
        if kept_as_is:
            assert held == [("lc", p, payload, n)]
        for _t, q, body, _n in held:
            for d in orjson.loads(body) if body.startswith(b"[") else [orjson.loads(body)]:
                assert partition_for(d["request_id"], now) == q  # its key's partition now
    finally:
        sink.close(timeout_s=0.2)
        _free_handle(sink)
