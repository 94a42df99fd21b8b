"""The one producer module every emitter shares.

:class:`Batcher` (pure) groups events per partition — using the contract's
partition hash — into messages of at most ``max_events`` events or
``max_delay_ms`` of age. Sinks deliver the messages:

* :class:`KafkaSink` — confluent-kafka, never blocks the caller: ``produce``
  + ``poll(0)`` into a bounded local queue; a full queue or an unreachable
  broker drops the message and counts the events dropped.
* :class:`JsonlSink` — one JSON array per line (the replay format).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from pipeline.contract.codec import event_to_dict
from pipeline.contract.events import Event
from pipeline.contract.partitioning import partition_for

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """Where emitters put events. ``emit`` must never block or raise."""

    def emit(self, event: Event) -> None: ...

    def flush(self, timeout_s: float = 10.0) -> int:
        """Send everything buffered; return the number of events still undelivered."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    max_events: int = 200
    max_delay_ms: int = 50

    def __post_init__(self) -> None:
        if self.max_events < 1:
            raise ValueError("max_events must be >= 1")
        if self.max_delay_ms < 0:
            raise ValueError("max_delay_ms must be >= 0")


@dataclass(slots=True)
class _Open:
    started_ms: float
    items: list[dict[str, Any]] = field(default_factory=list)


class Batcher:
    """Pure batching: events in, ``(partition, payload, n_events)`` out. Time passed in."""

    def __init__(self, num_partitions: int, policy: BatchPolicy) -> None:
        if num_partitions < 1:
            raise ValueError("num_partitions must be >= 1")
        self.num_partitions = num_partitions
        self.policy = policy
        self._open: dict[int, _Open] = {}

    def add(self, event: Event, now_ms: float) -> list[tuple[int, bytes, int]]:
        # Stats events have no request id: spread them by host, which is also their key.
        key = event.request_id or event.host
        p = partition_for(key, self.num_partitions)
        b = self._open.get(p)
        if b is None:
            b = self._open[p] = _Open(now_ms)
        b.items.append(event_to_dict(event))
        out = []
        if len(b.items) >= self.policy.max_events:
            out.append(self._close(p))
        out.extend(self.due(now_ms))
        return out

    def due(self, now_ms: float) -> list[tuple[int, bytes, int]]:
        limit = self.policy.max_delay_ms
        return [
            self._close(p) for p, b in list(self._open.items()) if now_ms - b.started_ms >= limit
        ]

    def drain(self) -> list[tuple[int, bytes, int]]:
        return [self._close(p) for p in list(self._open)]

    def _close(self, p: int) -> tuple[int, bytes, int]:
        b = self._open.pop(p)
        if len(b.items) == 1:
            return p, orjson.dumps(b.items[0]), 1
        return p, orjson.dumps(b.items), len(b.items)


@dataclass
class SinkCounters:
    events_sent: int = 0
    events_dropped: int = 0
    events_failed: int = 0
    messages_sent: int = 0


class JsonlSink:
    """Writes batched messages as JSON Lines (one message per line)."""

    def __init__(self, out: IO[bytes] | Path, policy: BatchPolicy | None = None) -> None:
        self._own = isinstance(out, Path)
        self._fh: IO[bytes] = out.open("wb") if isinstance(out, Path) else out
        self._batcher = Batcher(1, policy or BatchPolicy())
        self.counters = SinkCounters()

    def emit(self, event: Event) -> None:
        for _p, payload, n in self._batcher.add(event, time.monotonic() * 1000):
            self._write(payload, n)

    def _write(self, payload: bytes, n: int) -> None:
        self._fh.write(payload + b"\n")
        self.counters.events_sent += n
        self.counters.messages_sent += 1

    def flush(self, timeout_s: float = 10.0) -> int:
        for _p, payload, n in self._batcher.drain():
            self._write(payload, n)
        self._fh.flush()
        return 0

    def close(self) -> None:
        self.flush()
        if self._own:
            self._fh.close()


class KafkaSink:
    """Non-blocking batched producer on confluent-kafka.

    ``topic_for`` maps an event to its topic (lifecycle vs engine stats). The
    partition count of each topic is read once at start-up from metadata; a
    topic that does not exist yet is a configuration error.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topic_for: Callable[[Event], str],
        partitions: Mapping[str, int],
        policy: BatchPolicy | None = None,
        queue_max_messages: int = 100_000,
    ) -> None:
        from confluent_kafka import Producer  # adapter-only import

        conf = dict(config)
        conf.setdefault("queue.buffering.max.messages", queue_max_messages)
        conf.setdefault("linger.ms", 5)
        conf.setdefault("compression.type", "lz4")
        conf.setdefault("message.timeout.ms", 30_000)
        self._producer = Producer(conf)
        self._topic_for = topic_for
        pol = policy or BatchPolicy()
        self._batchers = {t: Batcher(n, pol) for t, n in partitions.items()}
        self.counters = SinkCounters()
        self._lock = threading.Lock()

    def _on_delivery(self, n: int) -> Callable[[Any, Any], None]:
        def cb(err: Any, _msg: Any) -> None:
            if err is not None:
                self.counters.events_failed += n
            else:
                self.counters.events_sent += n
                self.counters.messages_sent += 1

        return cb

    def _send(self, topic: str, items: list[tuple[int, bytes, int]]) -> None:
        for p, payload, n in items:
            try:
                self._producer.produce(
                    topic, payload, partition=p, on_delivery=self._on_delivery(n)
                )
            except BufferError:
                self.counters.events_dropped += n
            except Exception:  # never raise into the request path
                log.exception("produce failed; dropping %d events", n)
                self.counters.events_dropped += n
        self._producer.poll(0)

    def emit(self, event: Event) -> None:
        topic = self._topic_for(event)
        now = time.monotonic() * 1000
        with self._lock:
            batcher = self._batchers[topic]
            self._send(topic, batcher.add(event, now))
            for t, b in self._batchers.items():
                if t != topic:
                    self._send(t, b.due(now))

    def tick(self) -> None:
        """Send batches that reached their age limit (call periodically when idle)."""
        now = time.monotonic() * 1000
        with self._lock:
            for t, b in self._batchers.items():
                self._send(t, b.due(now))

    def flush(self, timeout_s: float = 10.0) -> int:
        with self._lock:
            for t, b in self._batchers.items():
                self._send(t, b.drain())
        remaining_msgs: int = self._producer.flush(timeout_s)
        return remaining_msgs

    def close(self) -> None:
        self.flush()
