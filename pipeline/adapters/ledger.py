"""The ledger topic (``pipeline.core.ledger``): published after each window write, read
by a worker taking a partition over."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition

from pipeline.adapters.kafka_admin import KafkaAdminError, wait_for_broker, wait_partitions
from pipeline.adapters.reliable import ReliableProducer, ShuttingDownError
from pipeline.contract.ledger import LedgerEntry, decode_ledger, encode_ledger
from pipeline.core.ledger import ENDED_THROUGH, counted_since, ledger_entries
from pipeline.core.windows import ClosedWindow
from pipeline.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)
_SCAN_STEP = 64  # messages read per step, backwards from the end
# One metadata request for the ledger topic's partitions waits at most this long (a stop
# signal is noticed between two requests: SIGTERM stops a worker within seconds).
_METADATA_TIMEOUT_S = 3.0


class LedgerPublisher:
    """Writes the ledger topic; ``kafka``: the connection and the topics' names (it reads
    ``ledger_topic`` and ``lifecycle_topic``)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka
        self._producer = ReliableProducer(kafka, kafka.ledger_topic, "ledger")
        self._partitions: int | None = None

    def publish(
        self,
        windows: Sequence[ClosedWindow],
        through: dict[int, int],
        stop: threading.Event | None = None,
    ) -> None:
        """Per source partition, the requests these (stored) windows counted. The ledger
        topic's partition count is read at the first publish, waiting for the broker
        while it does not answer (the windows are stored; nothing is committed until
        their ledger is acknowledged); raises :class:`ShuttingDownError` when ``stop`` is
        set meanwhile."""
        if self._partitions is None:
            self._partitions = self._ledger_partitions(stop or threading.Event())
        for entry in ledger_entries(self.kafka.lifecycle_topic, windows, through):
            for raw in encode_ledger(entry):
                self._producer.send(raw, partition=entry.partition % self._partitions)

    def flush(self, stop: threading.Event | None = None) -> None:
        """Block until the broker acknowledged every entry published (see
        :meth:`ReliableProducer.flush`; raises :class:`ShuttingDownError` at ``stop``)."""
        self._producer.flush(stop)

    def _ledger_partitions(self, stop: threading.Event) -> int:
        """The ledger topic's partition count, asked again (after the broker answers, with
        :func:`wait_for_broker`'s backoff) until metadata shows it."""
        t = self.kafka.ledger_topic
        while True:
            try:
                return wait_partitions(self.kafka, [t], _METADATA_TIMEOUT_S)[t]
            except (KafkaException, KafkaAdminError) as exc:
                log.warning(
                    "ledger topic %s: partitions not known (%s): the ledger of stored windows "
                    "waits for the broker",
                    t, exc,
                )  # fmt: skip
            if not wait_for_broker(self.kafka, stop, probe_timeout_s=_METADATA_TIMEOUT_S):
                raise ShuttingDownError("stopping while the ledger waited for the broker")


def read_topic_ledgers(
    kafka: KafkaSettings, first_offsets: dict[int, int], memory_ms: int
) -> dict[int, dict[str, int]]:
    """Per lifecycle partition, what the ledger topic says is counted (see
    :func:`pipeline.core.ledger.counted_since`), with one consumer for all of them.

    Reads each ledger partition backwards from the end in steps until a step holds only
    entries at or below the resume offset (or after an end mark: entries of an ended
    generation count by time only) and older than ``memory_ms`` before the newest
    (entries of a partition are written in offset order, whichever worker wrote them),
    so the cost is what was written since the commit and within the memory.
    """
    topic = kafka.ledger_topic
    n = wait_partitions(kafka, [topic])[topic]
    c = Consumer(
        kafka.kafka_config()
        | {"group.id": f"tailguard-ledger-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    )
    out: dict[int, dict[str, int]] = {}
    try:
        for partition, from_offset in first_offsets.items():
            tp = partition % n
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, tp), timeout=10)
            entries: list[LedgerEntry] = []  # in the order written
            end = hi
            ended = False  # an end mark read: entries before it count by time only
            while end > lo:
                start = max(lo, end - _SCAN_STEP)
                step = _read_range(c, topic, tp, start, end)
                entries[:0] = step
                mine = [e for e in step if e.partition == partition and
                        e.topic == kafka.lifecycle_topic]  # fmt: skip
                ended = ended or any(e.through == ENDED_THROUGH for e in mine)
                newest = max((e.end_ms for e in entries if e.partition == partition), default=0)
                if (
                    mine
                    and (ended or max(e.through for e in mine) <= from_offset)
                    and max(e.end_ms for e in mine) < newest - memory_ms
                ):
                    break
                end = start
            out[partition] = counted_since(
                entries, kafka.lifecycle_topic, partition, from_offset, memory_ms
            )
        return out
    finally:
        c.close()


def _read_range(c: Consumer, topic: str, tp: int, start: int, end: int) -> list[LedgerEntry]:
    c.assign([TopicPartition(topic, tp, start)])
    out: list[LedgerEntry] = []
    misses = 0
    while True:
        msg = c.poll(1.0)
        if msg is None:
            misses += 1
            if misses > 10:
                raise TimeoutError(f"ledger {topic}[{tp}]: could not read {start}..{end}")
            continue
        if msg.error():
            continue
        offset = msg.offset() or 0
        if offset >= end:
            break
        try:
            out.append(decode_ledger(msg.value() or b""))
        except (ValueError, KeyError, TypeError):
            log.exception("bad ledger message at %s[%d]@%d dropped", topic, tp, msg.offset())
        if offset + 1 >= end:
            break
    return out
