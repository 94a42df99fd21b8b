"""The chaos run's traffic (:mod:`bench.chaos`): the simulator's events paced into the
project's Kafka producer, one malformed message a minute on a raw producer, and the
producers' own record of what the broker acknowledged (:class:`Acks`): per request, the
kinds acknowledged and where its first terminal event landed (topic generation,
partition, offset), so that the end of the run can tell a request the worker never read
from one it read and lost."""

from __future__ import annotations

import heapq
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from confluent_kafka import Producer

from bench.common import REPO, producer_config, send
from pipeline.cli import DEFAULT_TRACE
from pipeline.contract.events import Event
from pipeline.settings import Settings
from producers.emit import open_kafka_sink
from producers.simulator.model import DEFAULT_MODELS, SimConfig, Simulator
from producers.simulator.trace import read_trace

BAD_EVERY_S = 60.0
BAD_KINDS = (b"not json {", b'{"v": 1, "kind": "gateway.completed"}', b'"a string"')
QUIET = {"log_level": 2}  # the bench's own clients: no librdkafka line per refused connect
BIT = {"gateway.received": 1, "gateway.completed": 2, "engine.finished": 4}


# --- the producers' own record of what was acknowledged -----------------------------------


@dataclass
class Acks:
    """Per request, the lifecycle kinds the broker acknowledged, from delivery callbacks
    (called on the producers' threads); ``generation`` counts the topic's deletions so far,
    ``topic_ids`` names each generation's topic id."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    kinds: dict[str, int] = field(default_factory=dict)
    # the first acknowledged gateway.completed or engine.finished: (generation, partition,
    # offset); a request's events share a partition, acknowledged in offset order
    first_terminal: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # per partition: the generation its acknowledgements are of, and the last offset
    last_offset: dict[int, tuple[int, int]] = field(default_factory=dict)
    requests: int = 0  # with a gateway.completed or engine.finished acknowledged
    events_acked: int = 0
    events_failed: int = 0
    generation: int = 0
    topic_ids: dict[int, str] = field(default_factory=dict)
    acked_in_gen: dict[int, int] = field(default_factory=dict)
    bad: list[tuple[str, int, int]] = field(default_factory=list)  # (topic id, part, offset)
    bad_failed: int = 0

    @property
    def topic_id(self) -> str:
        return self.topic_ids.get(self.generation, "")

    def delivered(self, err: Any, msg: Any, lifecycle: str) -> None:
        if msg is None or msg.topic() != lifecycle:
            return
        try:
            doc = orjson.loads(msg.value() or b"null")
        except orjson.JSONDecodeError:
            return
        items = doc if isinstance(doc, list) else [doc]
        with self.lock:
            if err is not None:
                self.events_failed += len(items)
                return
            gen = self.generation_of(msg.partition(), msg.offset())
            self.acked_in_gen[gen] = self.acked_in_gen.get(gen, 0) + len(items)
            where = (gen, msg.partition(), msg.offset())
            for d in items:
                bit = BIT.get(d.get("kind", ""), 0)
                if not bit:
                    continue
                self.events_acked += 1
                rid = d["request_id"]
                before = self.kinds.get(rid, 0)
                self.kinds[rid] = before | bit
                if bit != 1 and not before & 6:
                    self.requests += 1
                    self.first_terminal[rid] = where

    def generation_of(self, partition: int, offset: int) -> int:
        """The topic generation an acknowledgement at ``offset`` of ``partition`` is of.
        Not the generation when the callback runs: a callback can come seconds after its
        acknowledgement (the producer's thread busy, the GIL), after the bench counted the
        deletion. A producer's delivery reports come in the order the broker answered,
        and a generation's offsets start again from 0: on a partition, an offset below
        the last one acknowledged is the next generation's first (callers hold ``lock``)."""
        gen, last = self.last_offset.get(partition, (0, -1))
        if offset < last:
            gen += 1
        self.last_offset[partition] = (gen, offset)
        return gen

    def bad_delivered(self, err: Any, msg: Any) -> None:
        with self.lock:
            if err is not None:
                self.bad_failed += 1
            else:
                self.bad.append((self.topic_id, msg.partition(), msg.offset()))

    def expected(self) -> set[str]:
        """Requests with a ``gateway.completed`` or ``engine.finished`` acknowledged: each is
        stored (complete, or partial after the join timeout) exactly once."""
        with self.lock:
            return {rid for rid, k in self.kinds.items() if k & 6}


def track_deliveries(sink: Any, acks: Acks, lifecycle: str) -> None:
    """Hear the sink's delivery reports too (its counters are kept as they are)."""
    own = sink._on_delivery  # the sink's per-message callback factory

    def on_delivery(n: int) -> Callable[[Any, Any], None]:
        cb = own(n)

        def both(err: Any, msg: Any) -> None:
            cb(err, msg)
            acks.delivered(err, msg, lifecycle)

        return both

    sink._on_delivery = on_delivery


# --- traffic ----------------------------------------------------------------------------------


def simulated_events(rate: float, seed: int, start_ns: int) -> Iterator[Event]:
    """The simulator's events, forever, at ``rate`` requests/s from ``start_ns``: the trace
    compressed to that rate with its engines multiplied to match, one simulation after the
    other (each with its own seed and request-id prefix), merged in time order."""
    trace = read_trace(REPO / DEFAULT_TRACE)
    span_ms = trace[-1].arrival_offset_ms + 1.0
    scale = rate / (len(trace) / (span_ms / 1000))
    models = tuple(replace(m, engines=m.engines * math.ceil(scale)) for m in DEFAULT_MODELS)
    seg_ns = int(span_ms / scale * 1e6)
    heap: list[tuple[int, int, Event, Iterator[Event]]] = []
    seq = 0
    k = 0
    while True:
        if not heap or heap[0][0] >= start_ns + k * seg_ns - 5 * 10**9:
            sim = Simulator(
                trace,
                SimConfig(
                    start_unix_ns=start_ns + k * seg_ns,
                    models=models,
                    rate_scale=scale,
                    seed=seed * 100_000 + k,
                    request_id_prefix=f"chaos{seed}-{k}-",
                    stats_interval_ms=5_000.0,
                ),
            )
            it = iter(sim.events())
            if (ev := next(it, None)) is not None:
                heapq.heappush(heap, (ev.ts_unix_ns, seq, ev, it))
                seq += 1
            k += 1
            continue
        _, _, ev, it = heapq.heappop(heap)
        yield ev
        if (nxt := next(it, None)) is not None:
            heapq.heappush(heap, (nxt.ts_unix_ns, seq, nxt, it))
            seq += 1


@dataclass
class Traffic:
    settings: Settings
    rate: float
    seed: int
    acks: Acks
    stop: threading.Event = field(default_factory=threading.Event)
    bad_paused: threading.Event = field(default_factory=threading.Event)
    received: int = 0  # gateway.received events handed to the producer
    error: BaseException | None = None
    sink: Any = None
    bad_producer: Producer | None = None
    started: float = 0.0
    stopped: float = 0.0

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _run(self) -> None:
        s = self.settings
        lifecycle = s.lifecycle_topic
        self.sink = open_kafka_sink(s, service="chaos-bench", on_full="block", extra_config=QUIET)
        track_deliveries(self.sink, self.acks, lifecycle)
        self.bad_producer = Producer(
            producer_config(s) | QUIET | {"linger.ms": 5, "on_delivery": self.acks.bad_delivered}
        )
        rng = random.Random(self.seed)
        next_bad = time.monotonic() + BAD_EVERY_S / 2
        n_bad = 0
        self.started = time.monotonic()
        for ev in simulated_events(self.rate, self.seed, time.time_ns() + 10**9):
            while (ahead := ev.ts_unix_ns - time.time_ns()) > 0:
                if self.stop.is_set():
                    break
                time.sleep(min(ahead / 1e9, 0.02))
            if self.stop.is_set():
                break
            self.sink.emit(ev)
            if ev.kind == "gateway.received":
                self.received += 1
            if time.monotonic() >= next_bad and not self.bad_paused.is_set():
                next_bad += BAD_EVERY_S
                send(
                    self.bad_producer,
                    lifecycle,
                    rng.randrange(s.topic_partitions),
                    BAD_KINDS[n_bad % len(BAD_KINDS)],
                )
                n_bad += 1
            self.bad_producer.poll(0)
        self.stopped = time.monotonic()

    def finish(self, timeout_s: float = 300.0) -> int:
        """Flush both producers until everything is acknowledged (or ``timeout_s``); the
        events still undelivered."""
        left = 0
        deadline = time.monotonic() + timeout_s
        if self.bad_producer is not None:
            self.bad_producer.flush(max(1.0, deadline - time.monotonic()))
        if self.sink is not None:
            while (left := self.sink.flush(10.0)) and time.monotonic() < deadline:
                pass
        return left

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close(5.0)
            self.sink = None
