"""Producers for what must not be lost: dead letters, the controller's summaries.

Unlike the request path's producer (:mod:`producers.emit`, which drops when full),
``send`` waits for room and ``flush`` for the broker. Needs confluent-kafka only (the
Envoy ingester uses it without the worker's dependencies).
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import Producer

from pipeline.contract.codec import DeadLetter
from pipeline.settings import Settings

log = logging.getLogger(__name__)


class ReliableProducer:
    """One topic, idempotent producer; ``send`` waits for room, ``flush`` for the broker.

    Used for what the worker must not lose before it commits offsets: dead
    letters and the controller's summaries. (The request path's producers,
    in ``producers/``, drop instead of waiting.)
    """

    def __init__(self, settings: Settings, topic: str, what: str) -> None:
        conf = settings.kafka_config()
        conf.update({"linger.ms": 20, "compression.type": "lz4", "enable.idempotence": True})
        self._producer = Producer(conf)
        self._topic = topic
        self._what = what
        self.failed = 0

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failed += 1
            log.error("%s delivery failed: %s", self._what, err)

    def send(
        self,
        value: bytes,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        partition: int | None = None,
    ) -> None:
        while True:
            try:
                if partition is None:
                    self._producer.produce(
                        self._topic, value, headers=headers, on_delivery=self._on_delivery
                    )
                else:
                    self._producer.produce(
                        self._topic,
                        value,
                        headers=headers,
                        on_delivery=self._on_delivery,
                        partition=partition,
                    )
                break
            except BufferError:
                self._producer.poll(0.1)
        self._producer.poll(0)

    def flush(self) -> None:
        """Block until everything sent is acknowledged by the broker."""
        while self._producer.flush(5.0) > 0:
            log.warning("waiting for the %s producer to deliver", self._what)


class DeadLetterSink(ReliableProducer):
    """Rejected input to the DLQ topic: the raw bytes as the value, the reason
    and source coordinates as headers."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, settings.dlq_topic, "DLQ")

    def send_dead(self, dead: list[DeadLetter]) -> None:
        for d in dead:
            headers: list[tuple[str, str | bytes | None]] = [
                ("tailguard.reason", d.reason.encode()),
                ("tailguard.source.topic", d.source.topic.encode()),
                ("tailguard.source.partition", str(d.source.partition).encode()),
                ("tailguard.source.offset", str(d.source.offset).encode()),
            ]
            if d.index is not None:
                headers.append(("tailguard.source.index", str(d.index).encode()))
            self.send(d.raw, headers)
