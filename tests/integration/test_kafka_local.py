"""The local Kafka broker works end to end: confluent-kafka in, aiokafka out, restarts."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Producer

from tests.kafka_fixture import KafkaUnderTest, create_topic  # `kafka` comes via tests/conftest.py

pytestmark = [pytest.mark.integration, pytest.mark.private_broker]

PARTITIONS = 3
DEADLINE_S = 30.0


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": int(DEADLINE_S * 1000),
        }
    )


def _produce(producer: Producer, topic: str, values: list[bytes]) -> Counter[int]:
    """Produce ``values`` (keyed, so they spread over partitions); return per-partition counts."""
    delivered: Counter[int] = Counter()
    errors: list[object] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered[msg.partition()] += 1  # type: ignore[attr-defined]

    for i, value in enumerate(values):
        producer.produce(topic, key=f"key-{i}".encode(), value=value, on_delivery=on_delivery)
        producer.poll(0)
    left = producer.flush(DEADLINE_S)
    assert left == 0, f"{left} messages still undelivered after {DEADLINE_S}s"
    assert not errors, errors[:5]
    assert sum(delivered.values()) == len(values)
    return delivered


async def _consume(
    bootstrap: str, topic: str, group: str, expected: int
) -> tuple[list[bytes], int]:
    """Consume as ``group`` until ``expected`` messages arrived (or the deadline), commit.

    Returns the values and the group's committed offsets summed over the partitions.
    """
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await asyncio.wait_for(consumer.start(), DEADLINE_S)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        got: list[bytes] = []
        while len(got) < expected and loop.time() < deadline:
            batches = await consumer.getmany(timeout_ms=250)
            for records in batches.values():
                got.extend(r.value for r in records if r.value is not None)
        await consumer.commit()
        committed = 0
        for p in range(PARTITIONS):
            committed += await consumer.committed(TopicPartition(topic, p)) or 0
    finally:
        await asyncio.wait_for(consumer.stop(), DEADLINE_S)
    return got, committed


def test_produce_with_confluent_consume_with_aiokafka(kafka: KafkaUnderTest) -> None:
    topic = _unique("it-roundtrip")
    create_topic(kafka.bootstrap_servers, topic, PARTITIONS)
    values = [f"message-{i}".encode() for i in range(600)]

    per_partition = _produce(_producer(kafka.bootstrap_servers), topic, values)
    assert set(per_partition) == set(range(PARTITIONS)), per_partition

    got, committed = asyncio.run(
        _consume(kafka.bootstrap_servers, topic, _unique("g"), len(values))
    )
    assert len(got) == len(values)
    assert set(got) == set(values)
    assert committed == len(values)


def test_data_and_committed_offsets_survive_a_restart(kafka: KafkaUnderTest) -> None:
    if not kafka.can_restart:
        pytest.skip("broker restart needs the local broker (TAILGUARD_TEST_BOOTSTRAP is set)")
    bootstrap = kafka.bootstrap_servers
    topic = _unique("it-restart")
    group = _unique("g")
    create_topic(bootstrap, topic, PARTITIONS)
    before = [f"before-{i}".encode() for i in range(200)]
    after = [f"after-{i}".encode() for i in range(200)]

    producer = _producer(bootstrap)  # one long-lived producer, across the restart
    _produce(producer, topic, before)
    got, committed = asyncio.run(_consume(bootstrap, topic, group, len(before)))
    assert sorted(got) == sorted(before)
    assert committed == len(before)

    kafka.restart()
    assert kafka.bootstrap_servers == bootstrap  # same port: clients just reconnect

    _produce(producer, topic, after)
    # The group's committed offsets survived: it resumes with exactly the new messages ...
    resumed, committed = asyncio.run(_consume(bootstrap, topic, group, len(after)))
    assert sorted(resumed) == sorted(after)
    assert committed == len(before) + len(after)
    # ... and the log survived: a new group reads everything from the beginning.
    everything, _ = asyncio.run(_consume(bootstrap, topic, _unique("g"), len(before) + len(after)))
    assert sorted(everything) == sorted(before + after)
