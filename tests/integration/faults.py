"""Shared pieces of the fault tests: fast preloading, the exactly-once check (its counts and
the rollup check live in :mod:`tools.dev.fault_checks`, which the chaos run shares), RSS."""

from __future__ import annotations

import heapq
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from bench.common import send
from pipeline.adapters.kafka_admin import wait_partitions
from pipeline.adapters.store import open_store
from pipeline.cli import DEFAULT_TRACE
from pipeline.contract.codec import encode_batch
from pipeline.contract.events import Event
from pipeline.contract.partitioning import partition_for
from pipeline.settings import Settings
from producers.simulator.model import SimConfig, Simulator
from producers.simulator.trace import read_trace
from tests.ceilings import ceiling
from tests.integration.harness import WorkerProcess, make_settings
from tests.measurement_fixtures import START_NS
from tools.dev.fault_checks import dead_letters as _dead_letters
from tools.dev.fault_checks import exactly_once

EVENTS_PER_MESSAGE = 200  # what the producers' BatchPolicy sends at most


def lifecycle_events(
    requests: int, *, seed: int, prefix: str = "req-", start_ns: int = START_NS
) -> list[Event]:
    """Lifecycle events (no engine.stats) of ``requests`` simulated requests, in time order.

    Beyond the shipped trace's length, further independent simulations of the same trace
    (own seed, own request-id prefix: as many gateway/engine fleets feeding one pipeline)
    are merged in by time, so the event-time span (and with it the number of windows to
    write) stays that of one trace. No client aborts (no patience limit, no stream stopped
    midway): every request has its three events and joins, so no partial record can come
    out late and every request is in exactly one window.
    """
    trace = read_trace(DEFAULT_TRACE)
    runs = -(-requests // len(trace))
    share = -(-requests // runs)
    streams = []
    total = 0
    for k in range(runs):
        n = min(share, requests - total)
        total += n
        sim = Simulator(
            trace[:n],
            SimConfig(
                start_unix_ns=start_ns,
                seed=seed + k,
                patience_median_ms=None,
                stream_stop_fraction=0.0,
                request_id_prefix=f"{prefix}{k}-",
            ),
        )
        streams.append([ev for ev in sim.events() if ev.kind != "engine.stats"])
        assert sim.summary.requests == n
    return list(heapq.merge(*streams, key=lambda ev: ev.ts_unix_ns))


@dataclass
class Preload:
    """What :func:`produce_batches` put on the topic, per partition, in offset order."""

    messages: int = 0
    events: int = 0
    bytes: int = 0  # message values, uncompressed
    # partition -> event count of each message sent to it (in order)
    per_message: dict[int, list[int]] = field(default_factory=dict)

    def events_below(self, partition: int, offset_from: int, offset_to: int) -> int:
        """Events carried by this preload's messages in [offset_from, offset_to) of a partition
        (offsets relative to the first message this preload sent to it)."""
        return sum(self.per_message.get(partition, [])[offset_from:offset_to])


def batches(
    events: Sequence[Event], partitions: int, per_message: int = EVENTS_PER_MESSAGE
) -> Iterator[tuple[int, list[Event]]]:
    """Group events the way the producers do: per request partition, in order, chunked."""
    open_: dict[int, list[Event]] = {}
    for ev in events:
        p = partition_for(ev.request_id, partitions)
        buf = open_.setdefault(p, [])
        buf.append(ev)
        if len(buf) >= per_message:
            yield p, buf
            open_[p] = []
    for p, buf in open_.items():
        if buf:
            yield p, buf


def producer(settings: Settings) -> Producer:
    return Producer(
        settings.kafka_config()
        | {
            "linger.ms": 20,
            "compression.type": "lz4",
            "enable.idempotence": True,
            "queue.buffering.max.kbytes": 262_144,
        }
    )


def flush(prod: Producer, timeout_s: float = 120.0) -> None:
    left = prod.flush(timeout_s)
    assert left == 0, f"{left} messages not delivered"


def send_all(settings: Settings, messages: Iterable[tuple[str, int, bytes | None]]) -> None:
    """``(topic, partition, value)`` messages as given, in order (a None value: a null
    message), on one producer; returns once every one is delivered."""
    prod = producer(settings)
    for topic, partition, value in messages:
        send(prod, topic, partition, value)  # type: ignore[arg-type]  # None: a null message
    flush(prod)


def produce_batches(
    settings: Settings,
    events: Sequence[Event],
    *,
    per_message: int = EVENTS_PER_MESSAGE,
    prod: Producer | None = None,
) -> Preload:
    """Batched JSON-array messages straight to the lifecycle topic's partitions (fastest
    preload: one ``encode_batch`` and one ``produce`` per message), then flush."""
    topic = settings.lifecycle_topic
    n = wait_partitions(settings, [topic])[topic]
    own = prod is None
    prod = prod or producer(settings)
    pre = Preload()
    for p, chunk in batches(events, n, per_message):
        value = encode_batch(chunk)
        send(prod, topic, p, value)
        pre.bytes += len(value)
        pre.messages += 1
        pre.events += len(chunk)
        pre.per_message.setdefault(p, []).append(len(chunk))
    if own:
        flush(prod)
    return pre


def after(events: Sequence[Event], gap_s: float = 120.0) -> int:
    """A start time (ns) ``gap_s`` after the last of ``events``: a later stream that shares
    no window and no pending join with them."""
    return max(ev.ts_unix_ns for ev in events) + int(gap_s * 1e9)


def consecutive_events(*sizes: int, seed: int) -> list[list[Event]]:
    """Streams of :func:`lifecycle_events` of ``sizes`` requests, each :func:`after` the one
    before: the first with ``seed`` and request ids ``a-...``, the next with ``seed + 1``
    and ``b-...``, and so on."""
    streams: list[list[Event]] = []
    for i, n in enumerate(sizes):
        start_ns = after(streams[-1]) if streams else START_NS
        streams.append(lifecycle_events(n, seed=seed + i, prefix=f"{chr(97 + i)}-",
                                        start_ns=start_ns))  # fmt: skip
    return streams


def store_fault_settings(
    bootstrap: str, tmp_path: Path, fault: str, **over: object
) -> tuple[Settings, Path]:
    """Worker settings (:func:`make_settings`) whose store fails as the flag file says, and
    that file (``tmp_path / fault``, not created): ``fault`` "outage", every insert fails
    while it exists; "partial", the inserts it names fail part-way (store/faults.py)."""
    flag = tmp_path / fault
    return make_settings(bootstrap, tmp_path, **{f"fault_store_{fault}_file": flag}, **over), flag


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def wait_for(pred, what: str, timeout_s: float, interval_s: float = 0.1) -> None:  # type: ignore[no-untyped-def]
    timeout_s = ceiling(timeout_s)  # scaled: tests/ceilings.py
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
        time.sleep(interval_s)


def assert_exactly_once(settings: Settings, request_ids: set[str]) -> None:
    """Every request exactly once in ``requests`` and in the window totals of the store.

    Window totals: the ``__slo__`` rows (one per emitted window and partition) sum to the
    request count with no window written twice, and the materialized views (fed per insert,
    never deduplicated afterwards) agree (:func:`tools.dev.fault_checks.exactly_once`).
    """
    n_req = len(request_ids)
    store = open_store(settings)
    try:
        got = exactly_once(store, request_ids, slo="tier1-gateway")
    finally:
        store.close()
    missing, extra, twice = got["missing"], got["extra"], got["twice"]
    assert not missing, f"{len(missing)} requests lost, e.g. {missing[:5]}"
    assert not extra, f"{len(extra)} unexpected requests, e.g. {extra[:5]}"
    assert not twice, f"{len(twice)} requests twice, e.g. {twice[:5]}"
    # a window closes once (corrections, if any, are separate rows that add to it)
    assert got["windows"] == got["windows_distinct"], "a window was written twice"
    total = got["window_total"]
    assert total == n_req, f"window totals {total} != {n_req} requests"
    mv_total = got["latency_1m_total"]
    assert mv_total == n_req, f"latency_1m total {mv_total} != {n_req}"
    slo_total = got["slo_1m_total"]
    assert slo_total == n_req, f"slo_1m total {slo_total} != {n_req}"


def group_consumer(settings: Settings) -> Consumer:
    """A consumer with the worker group's id that never subscribes (so never joins): one
    for a loop of :func:`committed_offsets` instead of a client per question."""
    return Consumer(
        settings.kafka_config() | {"group.id": settings.group_id, "enable.auto.commit": False}
    )


def committed_offsets(settings: Settings, consumer: Consumer | None = None) -> dict[int, int]:
    """Per partition of the lifecycle topic, the worker group's committed offset (0: none).

    On ``consumer`` (:func:`group_consumer`, left open) when given, else on its own."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    topic = settings.lifecycle_topic
    c = consumer if consumer is not None else group_consumer(settings)
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        tps = [TopicPartition(topic, p) for p in parts]
        deadline = time.monotonic() + ceiling(30)
        while True:
            try:
                return {tp.partition: max(tp.offset, 0) for tp in c.committed(tps, timeout=10)}
            except KafkaException as exc:
                # A fresh broker answers NOT_COORDINATOR while it loads the group's state.
                err = exc.args[0]
                loading = err.code() in (
                    KafkaError.NOT_COORDINATOR,
                    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                    KafkaError.COORDINATOR_NOT_AVAILABLE,
                )
                if not (loading or err.retriable()) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        if consumer is None:
            c.close()


STOP_WITHIN_S = 10.0  # a SIGTERMed worker exits within this, in every state


def sigterm_exit_s(worker: WorkerProcess) -> float:
    """SIGTERM; seconds until the process exited (killed and failed after 60 s)."""
    t0 = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    try:
        worker.proc.wait(60)
    except subprocess.TimeoutExpired:
        worker.stop(signal.SIGKILL)
        pytest.fail(f"SIGTERM ignored for 60 s:\n{worker.log_tail()}")
    took = time.monotonic() - t0
    worker.stop()  # closes its log
    return took


def log_has(worker: WorkerProcess, text: str) -> bool:
    return text in worker.log_path.read_text(errors="replace")


def dead_letters(settings: Settings) -> list[dict[str, Any]]:
    """The DLQ's messages in order (:func:`tools.dev.fault_checks.dead_letters`)."""
    return _dead_letters(settings, ceiling(30))
