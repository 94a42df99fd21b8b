"""Producers for what must not be lost: dead letters, the controller's summaries.

Unlike the request path's producer (:mod:`producers.emit`, which drops when full),
``send`` waits for room and ``flush`` for the broker. Needs confluent-kafka only (the
Envoy ingester uses it without the worker's dependencies).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from pipeline.contract.codec import (
    DLQ_INDEX,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_TOPIC_HEADER,
    DLQ_TOPIC_ID,
    DeadLetter,
    Headers,
    dead_letter_key,
    dead_letter_message,
    dead_subposition,
    truncate_dead,
)
from pipeline.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)


# A dead letter's value is cut to this size, so that the DLQ takes it whatever its size
# (Kafka's default limit is ~1 MB per message); its original size is in a header.
DLQ_MAX_VALUE_BYTES: Final = 256 * 1024
_MIN_VALUE_BYTES: Final = 1024  # shrinking stops here (headers alone must then fit)


class ShuttingDownError(Exception):
    """The process is stopping: give up waiting (nothing after this point is committed)."""


class ReliableProducer:
    """One topic, idempotent producer; ``send`` waits for room, ``flush`` for the broker.

    Used for what the worker must not lose before it commits offsets: dead
    letters and the controller's summaries. (The request path's producers,
    in ``producers/``, drop instead of waiting.) A message whose delivery fails
    (broker down past ``message.timeout.ms``, too large for the topic, ...) is
    sent again by ``flush``, which returns only once every message sent has been
    acknowledged by the broker: the caller commits its input offsets after that.
    """

    def __init__(self, settings: KafkaSettings, topic: str, what: str) -> None:
        conf = settings.kafka_config()
        conf.update({"linger.ms": 20, "compression.type": "lz4", "enable.idempotence": True})
        self._producer = Producer(conf)
        self._topic = topic
        self._what = what
        self._failed_lock = threading.Lock()
        self._resend: list[tuple[bytes, Headers | None, KafkaError, int | None, bytes | None]] = []
        self.failed = 0  # delivery failures (each one was sent again)

    def _callback(
        self, value: bytes, headers: Headers | None, partition: int | None, key: bytes | None
    ) -> Any:
        def on_delivery(err: Any, _msg: Any) -> None:
            if err is None:
                return
            with self._failed_lock:
                self.failed += 1
                self._resend.append((value, headers, err, partition, key))
            log.error("%s delivery failed (%s): will send it again", self._what, err)

        return on_delivery

    def shrink(self, value: bytes, headers: Headers | None) -> tuple[bytes, Headers | None]:
        """A smaller form of a message the broker refused as too large (subclasses)."""
        raise KafkaException(
            KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, f"{self._what}: {len(value)} bytes")
        )

    def send(
        self,
        value: bytes,
        headers: Headers | None = None,
        partition: int | None = None,
        key: bytes | None = None,
    ) -> None:
        """Produce one message (to ``partition``, else the default partitioner's choice)."""
        while True:
            try:
                cb = self._callback(value, headers, partition, key)
                if partition is None:
                    self._producer.produce(
                        self._topic, value, key=key, headers=headers, on_delivery=cb
                    )
                else:
                    self._producer.produce(
                        self._topic, value, key=key, headers=headers, on_delivery=cb,
                        partition=partition,
                    )  # fmt: skip
                break
            except BufferError:
                self._producer.poll(0.1)
            except KafkaException as exc:  # refused locally, before it reached the broker
                if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                    raise
                value, headers = self.shrink(value, headers)
        # No poll(0) here: librdkafka's own threads deliver; the delivery reports (only
        # failures do anything) are served by flush, which the caller runs before it
        # commits. A poll per message released the GIL and took it back: on the writer
        # thread, each time behind the event loop's switch interval (up to 5 ms a send).
        # End to end, removing it measured within noise.

    def flush(self, stop: threading.Event | None = None) -> None:
        """Block until everything sent is acknowledged by the broker (failed deliveries are
        sent again; one refused as too large is shrunk first). Raises
        :class:`ShuttingDownError` when ``stop`` is set before that."""
        waited = 0
        while True:
            left = self._producer.flush(1.0)  # short: a stop is noticed within a second
            if stop is not None and stop.is_set() and (left or self._resend):
                raise ShuttingDownError(f"{self._what}: {left} messages not acknowledged")
            if left > 0:
                waited += 1
                if waited % 10 == 5:
                    log.warning(
                        "waiting for the %s producer to deliver (%d left)", self._what, left
                    )
                continue
            with self._failed_lock:
                again, self._resend = self._resend, []
            if not again:
                return
            log.warning("sending %d %s messages again", len(again), self._what)
            for value, headers, err, partition, key in again:
                if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    self.send(*self.shrink(value, headers), partition=partition, key=key)
                else:
                    self.send(value, headers, partition=partition, key=key)

    def abandon(self) -> None:
        """At shutdown, drop what the broker has not acknowledged (nothing was committed
        past it: it is produced again after the restart). Without this, librdkafka's
        destructor waits for those messages to time out (5 min) with the broker down."""
        self._producer.purge()
        self._producer.flush(0)
        with self._failed_lock:
            self._resend.clear()


class DeadLetterSink(ReliableProducer):
    """Rejected input to the DLQ topic: the raw bytes as the value, the reason
    and source coordinates as headers.

    A value larger than ``max_value_bytes`` is stored cut to that size, with headers
    ``tailguard.original.size`` and ``tailguard.truncated``; a DLQ topic that still
    refuses it as too large gets it cut in half again, so every dead letter lands.
    """

    def __init__(self, settings: KafkaSettings, max_value_bytes: int = DLQ_MAX_VALUE_BYTES) -> None:
        super().__init__(settings, settings.dlq_topic, "DLQ")
        self.max_value_bytes = max_value_bytes

    def shrink(self, value: bytes, headers: Headers | None) -> tuple[bytes, Headers | None]:
        if len(value) <= _MIN_VALUE_BYTES:
            return super().shrink(value, headers)
        return truncate_dead(value, headers, len(value) // 2)

    def send_dead(self, dead: list[DeadLetter], topic_id: str | None = None) -> None:
        """Send dead letters (of the generation ``topic_id`` of their source topic, when
        known), each keyed by its source position."""
        for d in dead:
            value, headers = dead_letter_message(d, topic_id)
            if len(value) > self.max_value_bytes:
                value, headers = truncate_dead(value, headers, self.max_value_bytes)
            self.send(value, headers, key=dead_letter_key(d))


def _dead_position(
    headers: list[Any], topic: str, topic_id: str | None, value: bytes = b""
) -> tuple[int, int, int] | None:
    """(partition, offset, index) of a DLQ message's source, when it is ``topic`` (of the
    generation ``topic_id``: letters without one are taken as its)."""
    h = {k: bytes(v).decode(errors="replace") for k, v in headers if v is not None}
    if h.get(DLQ_TOPIC_HEADER) != topic:
        return None
    gen = h.get(DLQ_TOPIC_ID)
    if topic_id is not None and gen is not None and gen != topic_id:
        return None
    try:
        index = h.get(DLQ_INDEX)
        return (
            int(h[DLQ_PARTITION]),
            int(h[DLQ_OFFSET]),
            dead_subposition(int(index) if index is not None else None, value),
        )
    except (KeyError, ValueError):
        return None


def read_dead_positions(
    settings: KafkaSettings,
    topic: str,
    topic_id: str | None,
    since_ms: int | None,
    timeout_s: float = 30.0,
) -> list[tuple[int, int, int, int]]:
    """The source positions of ``topic`` (of its generation ``topic_id``; letters without
    one are taken as its) that have a letter on the DLQ stamped at or after ``since_ms``
    (None: the whole DLQ): ``(partition, offset, index, timestamp_ms)``. Reads the DLQ
    from that time to its end at the call."""
    c = Consumer(
        settings.kafka_config()
        | {"group.id": f"tailguard-dlq-scan-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    )
    try:
        dlq = settings.dlq_topic
        parts = c.list_topics(dlq, timeout=timeout_s).topics[dlq].partitions or {}
        ends: dict[int, int] = {}
        starts: list[KafkaTopicPartition] = []
        for q in parts:
            lo, hi = c.get_watermark_offsets(KafkaTopicPartition(dlq, q), timeout=timeout_s)
            if hi > lo:
                ends[q] = hi
                starts.append(
                    KafkaTopicPartition(dlq, q, OFFSET_BEGINNING if since_ms is None else since_ms)
                )
        if since_ms is not None and starts:
            starts = c.offsets_for_times(starts, timeout=timeout_s)
            for tp in starts:
                if tp.offset < 0:  # nothing stamped that late
                    ends.pop(tp.partition, None)
            starts = [tp for tp in starts if tp.partition in ends]
        if not starts:
            return []
        c.assign(starts)
        out: list[tuple[int, int, int, int]] = []
        deadline = time.monotonic() + timeout_s
        while ends:
            if time.monotonic() > deadline:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"reading {dlq} back"))
            msg = c.poll(0.5)
            if msg is None or msg.error():
                continue
            q, off = msg.partition() or 0, msg.offset() or 0
            if off + 1 >= ends.get(q, 0):
                ends.pop(q, None)
            found = _dead_position(list(msg.headers() or []), topic, topic_id, msg.value() or b"")
            if found is not None:
                out.append((*found, msg.timestamp()[1]))
        return out
    finally:
        c.close()
