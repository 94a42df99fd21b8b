"""The one producer module every emitter shares.

:class:`Batcher` (pure) groups events per partition — using the contract's
partition hash — into messages of at most ``max_events`` events or
``max_delay_ms`` of age. Sinks deliver the messages:

* :class:`KafkaSink` — confluent-kafka; the caller only appends to a bounded
  buffer, a background thread batches and calls ``produce`` + ``poll(0)``; a
  full buffer drops (and counts) the event, it never blocks a request path.
* :class:`JsonlSink` — one JSON array per line (the replay format).

:func:`open_kafka_sink` builds the Kafka sink from :class:`KafkaSettings` and
exposes its counters as OpenTelemetry metrics (:func:`instrument_sink`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

import orjson

from pipeline.contract.codec import event_to_dict
from pipeline.contract.events import Event
from pipeline.contract.partitioning import partition_for

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider

    from pipeline.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

OnFull = Literal["drop", "block"]


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


def rebatch(
    held: Iterable[tuple[str, int, bytes, int]], counts: Mapping[str, int], max_events: int
) -> list[tuple[str, int, bytes, int]]:
    """Batches ``(topic, partition, payload, n_events)`` made for other partition counts,
    made again for ``counts`` (a topic created again with another number of partitions):
    each event goes to the partition of its key (as :meth:`Batcher.add` chose it), in
    order, at most ``max_events`` a message."""
    out: list[tuple[str, int, bytes, int]] = []
    for topic, _p, payload, _n in held:
        doc = orjson.loads(payload)
        items = doc if isinstance(doc, list) else [doc]
        groups: dict[int, list[Any]] = {}
        for d in items:
            key = str(d.get("request_id") or d.get("host"))
            groups.setdefault(partition_for(key, counts[topic]), []).append(d)
        for q, ds in groups.items():
            for i in range(0, len(ds), max_events):
                chunk = ds[i : i + max_events]
                out.append(
                    (topic, q, orjson.dumps(chunk if len(chunk) > 1 else chunk[0]), len(chunk))
                )
    return out


DeliveryOutcome = Literal["held", "failed"]

# librdkafka's errors (``KafkaError.name()``) that mean the topic or partition is not there
# (deleted; created again soon): the batch was not written; it is held and produced again once
# the topic exists, never counted failed.
# - _UNKNOWN_TOPIC, _UNKNOWN_PARTITION, UNKNOWN_TOPIC_OR_PART: the name is unknown.
# - UNKNOWN_TOPIC_ID, INCONSISTENT_TOPIC_ID: a broker naming topics by id (Kafka 4) answers
#   so for the deleted topic's id once the name exists again.
# - _DESTROY: the partitions of a deleted topic are removed (rd_kafka_toppar_broker_leave);
#   a produce request still in flight to one of them comes back with an error and librdkafka
#   puts its messages back on the removed partition's queue, then fails them with _DESTROY
#   when it frees that partition (rd_kafka_toppar_destroy_final), the producer still alive.
#   Measured (issue 49): 1,466-2,060 events so in 3 of 8 same-partition recreations beside
#   4 busy loops; they were counted failed and lost. Only at the producer's own destruction
#   would _DESTROY mean the end, and the sink serves no delivery report then (no poll).
TOPIC_GONE_ERRORS: frozenset[str] = frozenset(
    {
        "_UNKNOWN_TOPIC",
        "_UNKNOWN_PARTITION",
        "UNKNOWN_TOPIC_OR_PART",
        "UNKNOWN_TOPIC_ID",
        "INCONSISTENT_TOPIC_ID",
        "_DESTROY",
    }
)


def delivery_outcome(error_name: str) -> DeliveryOutcome:
    """What the sink does with a batch librdkafka refused or reported undelivered with the
    error named ``error_name`` (``KafkaError.name()``): hold it for the topic to exist again,
    or count its events failed."""
    return "held" if error_name in TOPIC_GONE_ERRORS else "failed"


@dataclass
class SinkCounters:
    events_sent: int = 0
    events_dropped: int = 0
    events_failed: int = 0
    messages_sent: int = 0
    # events per delivery error name (``KafkaError.name()``), held or failed alike
    delivery_errors: dict[str, int] = field(default_factory=dict)


def tally(counters: SinkCounters, err: Any, n: int, where: str) -> DeliveryOutcome:
    """Count ``n`` events under ``err``'s name (``KafkaError``); the first time a name is
    met it is logged at once (not behind the rate limit), with what is done about it."""
    name = err.name()
    outcome = delivery_outcome(name)
    seen = counters.delivery_errors
    if name not in seen:
        log.warning(
            "producer: first %s error %s (%s): %d events %s",
            where, name, err, n, "held, sent again" if outcome == "held" else "failed",
        )  # fmt: skip
    seen[name] = seen.get(name, 0) + n
    return outcome


def held_again(
    batch: tuple[str, int, bytes, int], made_for: int, batcher: Batcher | None, max_events: int
) -> list[tuple[str, int, bytes, int]]:
    """A batch reported undelivered, to hold. One reported after the partition counts were
    read again (a late report: ``_DESTROY`` comes when librdkafka frees the removed
    partition) is made again for the new count, as ``KafkaSink._use_counts`` did for those
    held before (otherwise it would go to a partition that is not its key's, or not there
    at all, refused for ever)."""
    if batcher is None or batcher.num_partitions == made_for:
        return [batch]
    return rebatch([batch], {batch[0]: batcher.num_partitions}, max_events)


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
    """The non-blocking, batched Kafka producer every emitter shares (confluent-kafka).

    The caller's thread only appends the event to a bounded in-memory buffer
    (``emit`` takes a lock for a few microseconds; it never does I/O, never
    serialises, never raises). A background thread owns the librdkafka
    producer: it batches events per partition (:class:`Batcher`, the contract's
    murmur2 partition hash), calls ``produce`` + ``poll(0)``, and learns each
    topic's partition count from the broker's metadata.

    When Kafka is unreachable nothing in the caller's path changes: events wait
    in the buffer (while the partition counts are unknown) or in librdkafka's
    bounded queue (``queue.buffering.max.kbytes``; librdkafka reconnects by
    itself); when the buffer is full a new event is dropped and counted
    (``on_full="drop"``, for request paths) — or the caller waits
    (``on_full="block"``, for the simulator and batch loaders, where back
    pressure is wanted). Messages handed to librdkafka never expire
    (``message.timeout.ms`` = 0): a broker outage of minutes loses nothing as long
    as librdkafka's queue (``queue.buffering.max.kbytes``, 256 MiB) holds it; when
    that queue is full the batch in hand is held back (not dropped) and new events
    wait in the buffer, so the bounded buffer alone decides what is dropped, and
    counts it. ``events_failed`` counts permanent delivery errors only.

    A topic deleted (and created again) is no permanent error either: a batch that
    librdkafka refuses because the topic or partition is unknown, or reports undelivered
    for that reason, is held like one that found the queue full, and the partition
    counts are read again (every ``metadata_retry_ms``) before anything more is
    produced; a topic back with another partition count gets the held batches made
    again for it (:func:`rebatch`). Meanwhile new events wait in the bounded buffer,
    which alone decides what is dropped (and counted), as above.

    ``topic_for`` maps an event to its topic (lifecycle vs engine stats).
    ``partitions`` may be given (then no metadata is needed); otherwise it is
    read, and retried every ``metadata_retry_ms``, in the background thread.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topic_for: Callable[[Event], str],
        *,
        topics: Sequence[str],
        partitions: Mapping[str, int] | None = None,
        policy: BatchPolicy | None = None,
        buffer_max_events: int = 100_000,
        on_full: OnFull = "drop",
        metadata_retry_ms: int = 1000,
        name: str = "tailguard-producer",
    ) -> None:
        from confluent_kafka import KafkaException, Producer  # adapter-only

        if buffer_max_events < 1:
            raise ValueError("buffer_max_events must be >= 1")
        if on_full not in ("drop", "block"):
            raise ValueError("on_full must be 'drop' or 'block'")
        conf = dict(config)
        conf.setdefault("linger.ms", 5)
        conf.setdefault("compression.type", "lz4")
        # Keep events through broker outages of minutes (issue 12): nothing expires in
        # librdkafka's queue; its size (256 MiB of batched JSON, ~3 min at 1,000
        # gateway requests/s uses about 1/3 of it, see docs/measurement.md, "Producers")
        # bounds the memory.
        conf.setdefault("message.timeout.ms", 0)  # 0 = never
        conf.setdefault("queue.buffering.max.messages", 1_000_000)
        conf.setdefault("queue.buffering.max.kbytes", 262_144)
        conf.setdefault("reconnect.backoff.max.ms", 2_000)
        conf.setdefault("error_cb", self._on_error)
        conf.setdefault("logger", log)  # librdkafka logs through Python logging
        self._producer = Producer(conf)
        self._kafka_exception = KafkaException
        # A batch met a topic that is gone: the partition counts are read again before
        # anything more is produced (background thread only).
        self._recheck = False
        self._topic_for = topic_for
        self._topics = list(topics)
        self._policy = policy or BatchPolicy()
        self._batchers: dict[str, Batcher] = {}
        if partitions is not None:
            self._set_partitions(partitions)
        self._buffer_max = buffer_max_events
        self._on_full = on_full
        self._metadata_retry_s = metadata_retry_ms / 1000
        self._buf: deque[Event] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._closed = False
        self._flush_waiters: list[threading.Event] = []
        self._inflight_events = 0  # produced, no delivery report yet (background thread only)
        # Batches librdkafka had no room for (its queue full): produced first, in order,
        # before anything new is taken from the buffer (background thread only).
        self._held: deque[tuple[str, int, bytes, int]] = deque()
        self._batched_events = 0  # in open batches (background thread only)
        self._last_error_log = 0.0
        self.counters = SinkCounters()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # --- caller side -------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        with self._cond:
            if self._closing:
                self.counters.events_dropped += 1
                return
            if len(self._buf) >= self._buffer_max:
                if self._on_full == "drop":
                    self.counters.events_dropped += 1
                    return
                while len(self._buf) >= self._buffer_max and not self._closing:
                    self._cond.wait(0.1)
                if self._closing:
                    self.counters.events_dropped += 1
                    return
            self._buf.append(event)
            if len(self._buf) >= self._policy.max_events:
                self._cond.notify_all()

    @property
    def buffered(self) -> int:
        """Events not yet handed to librdkafka (buffer and open batches)."""
        return len(self._buf) + self._batched_events

    @property
    def partitions_known(self) -> bool:
        return len(self._batchers) == len(self._topics) and not self._recheck

    def flush(self, timeout_s: float = 10.0) -> int:
        """Hand everything buffered to Kafka and wait for delivery reports.

        Returns the number of events still undelivered after ``timeout_s``.
        """
        done = threading.Event()
        with self._cond:
            if self._closed:
                return 0
            self._flush_waiters.append(done)
            self._cond.notify_all()
        done.wait(timeout_s)
        return self.buffered + self._inflight_events

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush (up to ``timeout_s``), stop the thread; what is left is counted as dropped."""
        if self._closed:
            return
        self.flush(timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        lost = self.buffered + self._inflight_events
        if self.counters.delivery_errors:
            log.info("producer: delivery errors (events) %s", self.counters.delivery_errors)
        if lost:
            log.warning("producer closed with %d events undelivered (counted as dropped)", lost)
            self.counters.events_dropped += lost
        self._closed = True

    # --- background thread -------------------------------------------------------------------

    def _set_partitions(self, partitions: Mapping[str, int]) -> None:
        missing = [t for t in self._topics if t not in partitions]
        if missing:
            raise ValueError(f"no partition count for topics {missing}")
        self._batchers = {t: Batcher(partitions[t], self._policy) for t in self._topics}

    def _discover(self) -> None:
        try:
            md = self._producer.list_topics(timeout=1.0).topics
        except Exception as exc:  # broker unreachable: keep buffering, retry later
            self._log_error("metadata unavailable (%s); buffering", exc)
            return
        counts = {t: len(md[t].partitions) for t in self._topics if t in md and md[t].partitions}
        if len(counts) == len(self._topics):
            self._use_counts(counts)
            self._recheck = False
            log.info("producer: partitions %s", counts)
        else:
            missing = sorted(set(self._topics) - set(counts))
            self._log_error("topics %s do not exist yet; buffering", missing)

    def _use_counts(self, counts: Mapping[str, int]) -> None:
        """Batch for ``counts`` from now; a topic whose count changed (created again) gets
        its open and held batches made again for it."""
        old = {t: b.num_partitions for t, b in self._batchers.items()}
        changed = {t for t in self._topics if old.get(t, counts[t]) != counts[t]}
        if changed:
            for t in changed:
                self._held.extend((t, p, payload, n) for p, payload, n in self._batchers[t].drain())
            again = [h for h in self._held if h[0] in changed]
            kept = [h for h in self._held if h[0] not in changed]
            self._held = deque(kept + rebatch(again, counts, self._policy.max_events))
            log.warning("producer: partition counts changed %s -> %s", old, dict(counts))
        self._batchers = {
            t: self._batchers[t] if t in self._batchers and t not in changed
            else Batcher(counts[t], self._policy)
            for t in self._topics
        }  # fmt: skip

    def _topic_gone(self, topic: str, err: Any) -> None:
        if not self._recheck:
            self._log_error(
                "topic %s unknown to the producer (%s: deleted?): holding its batches until "
                "it exists again; new events wait in the buffer (%d events at most, then "
                "dropped and counted)",
                topic, err, self._buffer_max,
            )  # fmt: skip
        self._recheck = True

    def _log_error(self, fmt: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last_error_log >= 30.0:
            self._last_error_log = now
            log.warning(fmt, *args)

    def _on_error(self, err: Any) -> None:
        self._log_error("kafka: %s", err)

    def _on_delivery(self, n: int, made_for: int) -> Callable[[Any, Any], None]:
        """The delivery report of a batch of ``n`` events made for ``made_for`` partitions."""

        def cb(err: Any, msg: Any) -> None:
            self._inflight_events -= n
            if err is None:
                self.counters.events_sent += n
                self.counters.messages_sent += 1
            elif tally(self.counters, err, n, "delivery") == "held" and msg is not None:
                # not written (its topic was deleted): produced again once it exists
                self._held.extend(
                    held_again(
                        (msg.topic(), msg.partition(), msg.value(), n), made_for,
                        self._batchers.get(msg.topic()), self._policy.max_events,
                    )
                )  # fmt: skip
                self._batched_events += n
                self._topic_gone(msg.topic(), err)
            else:
                self.counters.events_failed += n
                self._log_error("delivery failed (%s); %d events lost", err, n)

        return cb

    def _produce(self, topic: str, items: list[tuple[int, bytes, int]]) -> None:
        for p, payload, n in items:
            if self._held:  # behind what already waits, in order
                self._held.append((topic, p, payload, n))
                continue
            self._produce_one(topic, p, payload, n)

    def _produce_one(self, topic: str, p: int, payload: bytes, n: int) -> bool:
        """Hand one batch to librdkafka; False (and held) when its queue is full."""
        try:
            made_for = self._batchers[topic].num_partitions
            self._producer.produce(
                topic, payload, partition=p, on_delivery=self._on_delivery(n, made_for)
            )
        except BufferError:  # librdkafka's queue is full (broker down for long)
            self._held.append((topic, p, payload, n))
            self._log_error(
                "producer queue full (broker down?): holding; new events wait in the "
                "buffer (%d events at most, then dropped and counted)",
                self._buffer_max,
            )
            return False
        except self._kafka_exception as exc:
            if tally(self.counters, exc.args[0], n, "produce") != "held":
                return self._dropped(exc, n)
            self._held.append((topic, p, payload, n))
            self._topic_gone(topic, exc.args[0])
            return False
        except Exception as exc:
            return self._dropped(exc, n)
        self._batched_events -= n
        self._inflight_events += n
        return True

    def _dropped(self, exc: Exception, n: int) -> bool:
        """A batch librdkafka refused for good (dropped and counted)."""
        self._batched_events -= n
        self.counters.events_dropped += n
        self._log_error("produce failed (%s); dropping %d events", exc, n)
        return True

    def _produce_held(self) -> None:
        while self._held:
            topic, p, payload, n = self._held.popleft()
            if not self._produce_one(topic, p, payload, n):
                # _produce_one appended it at the back: restore its place at the front
                self._held.appendleft(self._held.pop())
                return

    def _run(self) -> None:
        wait_s = max(self._policy.max_delay_ms / 2000, 0.005)
        next_discover = 0.0
        while True:
            try:
                with self._cond:
                    if (
                        len(self._buf) < self._policy.max_events
                        and not self._flush_waiters
                        and not self._closing
                    ):
                        self._cond.wait(wait_s)
                    known = self.partitions_known
                    take: list[Event] = []
                    if known and not self._held:
                        take = list(self._buf)
                        self._buf.clear()
                        self._cond.notify_all()  # room again for blocked emitters
                    waiters, self._flush_waiters = self._flush_waiters, []
                    closing = self._closing
                if not known and time.monotonic() >= next_discover:
                    self._discover()
                    next_discover = time.monotonic() + self._metadata_retry_s
                    if self.partitions_known:
                        # Served next round, with the buffer: a flush that came before
                        # the partitions were known must not be dropped (it waited its
                        # whole timeout: `tailguard envoy` exited ~10 s after its work).
                        with self._cond:
                            self._flush_waiters[:0] = waiters
                        continue
                if self._held:
                    self._producer.poll(0.05)  # room in librdkafka's queue as it delivers
                    if self.partitions_known:  # (not while a topic that was gone is read)
                        self._produce_held()
                now = time.monotonic() * 1000
                for event in take:
                    topic = self._topic_for(event)
                    self._batched_events += 1
                    self._produce(topic, self._batchers[topic].add(event, now))
                for topic, b in self._batchers.items():
                    self._produce(topic, b.drain() if waiters or closing else b.due(now))
                self._producer.poll(0)
                if waiters:
                    deadline = time.monotonic() + 10.0
                    while self._inflight_events and time.monotonic() < deadline:
                        self._producer.poll(0.05)
                        with self._cond:
                            if self._closing or any(w.is_set() for w in waiters):
                                break
                    for w in waiters:
                        w.set()
                if closing:
                    return
            except Exception:  # the thread must survive anything
                log.exception("producer thread error")
                time.sleep(0.1)


# --- construction from settings, and the producer's own telemetry ----------------------------


def open_kafka_sink(
    settings: KafkaSettings,
    *,
    service: str,
    on_full: OnFull = "drop",
    buffer_max_events: int = 100_000,
    partitions: Mapping[str, int] | None = None,
    policy: BatchPolicy | None = None,
    meter_provider: MeterProvider | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> KafkaSink:
    """The Kafka sink for an emitter (gateway, vLLM plugin, Envoy ingester, simulator).

    Lifecycle events go to ``settings.lifecycle_topic``, ``engine.stats`` to
    ``settings.engine_stats_topic``. Never contacts the broker in the caller's
    thread: a broker that is down at start-up only delays delivery. The
    counters are registered as OpenTelemetry metrics on ``meter_provider``
    (default: the process's global provider, so a host application's exporter
    picks them up) with the attribute ``service``.
    """
    lifecycle, stats = settings.lifecycle_topic, settings.engine_stats_topic
    conf = {**settings.kafka_config(), "client.id": f"tailguard-{service}", **(extra_config or {})}
    sink = KafkaSink(
        conf,
        topic_for=lambda e: stats if e.kind == "engine.stats" else lifecycle,
        topics=[lifecycle, stats],
        partitions=partitions,
        policy=policy,
        buffer_max_events=buffer_max_events,
        on_full=on_full,
        name=f"tailguard-{service}-producer",
    )
    instrument_sink(sink, service=service, meter_provider=meter_provider)
    return sink


def instrument_sink(
    sink: KafkaSink | JsonlSink,
    *,
    service: str,
    meter_provider: MeterProvider | None = None,
) -> None:
    """Register the sink's counters as observable OpenTelemetry instruments.

    Meter ``tailguard.producer``; attribute ``service``:

    * ``tailguard.producer.events.sent`` — delivered (acknowledged by Kafka)
    * ``tailguard.producer.events.dropped`` — buffer full / queue full / closed
    * ``tailguard.producer.events.failed`` — not delivered within ``message.timeout.ms``
    * ``tailguard.producer.messages.sent``
    * ``tailguard.producer.buffered`` (gauge) — waiting in the local buffer

    Observable instruments read the counters at collection time: no per-event cost.
    """
    from opentelemetry import metrics
    from opentelemetry.metrics import Observation

    meter = (meter_provider or metrics.get_meter_provider()).get_meter("tailguard.producer")
    attrs = {"service": service}
    c = sink.counters

    def reader(get: Callable[[], int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def cb(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(get(), attrs)]

        return cb

    meter.create_observable_counter(
        "tailguard.producer.events.sent", [reader(lambda: c.events_sent)], unit="{event}"
    )
    meter.create_observable_counter(
        "tailguard.producer.events.dropped", [reader(lambda: c.events_dropped)], unit="{event}"
    )
    meter.create_observable_counter(
        "tailguard.producer.events.failed", [reader(lambda: c.events_failed)], unit="{event}"
    )
    meter.create_observable_counter(
        "tailguard.producer.messages.sent", [reader(lambda: c.messages_sent)], unit="{message}"
    )
    if isinstance(sink, KafkaSink):
        meter.create_observable_gauge(
            "tailguard.producer.buffered", [reader(lambda: sink.buffered)], unit="{event}"
        )
