"""The worker's Faust wiring and process: the app and its consumer (fetch wait, gated
committed offsets, tagged commits, untracked read offsets), the shell built from the
settings (:func:`build_shell`) and given its opened store and producers
(:func:`open_ports`), the agents and timers that drive it (:func:`build_app`), and the
process around it (:func:`run_worker`: broker wait, GC and GIL tuning, prompt stop).

The loop's logic is :class:`pipeline.adapters.worker.WorkerShell`'s."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import ssl
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import faust
from aiokafka import errors as aiokafka_errors
from aiokafka.structs import OffsetAndMetadata
from aiokafka.structs import TopicPartition as AioTopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from pipeline.adapters.control_feed import ControlFeed
from pipeline.adapters.controller import ControllerSettings, ControllerShell
from pipeline.adapters.dead_letters import DeadLetters
from pipeline.adapters.generations import TopicIds
from pipeline.adapters.kafka_admin import admin, wait_for_broker
from pipeline.adapters.ledger import LedgerPublisher, read_topic_ledgers
from pipeline.adapters.lifecycle_input import LifecycleInput
from pipeline.adapters.prometheus import MetricsServer, MetricsState
from pipeline.adapters.query_server import start_query_server
from pipeline.adapters.reliable import (
    DeadLetterSink,
    ReliableProducer,
    ShuttingDownError,
    read_dead_positions,
)
from pipeline.adapters.stop_signal import PromptStop
from pipeline.adapters.store import open_for_writing
from pipeline.adapters.telemetry import WorkerTelemetry
from pipeline.adapters.worker import WorkerPorts, WorkerSettings, WorkerShell
from pipeline.core.processor import StreamProcessor
from pipeline.core.slo_exposition import WindowCounters, thresholds_by_boundary
from pipeline.core.slo_windows import slo_factory
from pipeline.kafka_settings import KafkaSettings
from pipeline.settings import Settings
from pipeline.spec.slo import load_spec_file

log = logging.getLogger("tailguard.worker")

STOP_GRACE_S = 6.0  # a stop signal ends the process within this long, whatever Faust does
CLOSE_GRACE_S = 2.0  # ... plus at most this long waiting for a store write in flight


def build_shell(settings: Settings, app: Any) -> WorkerShell:
    """The worker's shell over ``app``, its core and adapters built from ``settings`` (no
    I/O: the spec, policy, rules and keys are loaded and checked, so that a bad one fails
    at start-up)."""
    topic = settings.lifecycle_topic
    kafka = settings.kafka_only()
    processor = StreamProcessor(
        topic,
        settings.join_config(),
        max_message_bytes=settings.max_message_bytes,
        window_config=settings.window_config(),
        clock_config=settings.clock_config(),
        slo_factory=slo_factory(
            load_spec_file(settings.slo_spec) if settings.slo_spec is not None else None
        ),
        keep_events=settings.store_raw_events,
        max_pending=settings.max_pending,
    )
    lifecycle_input = LifecycleInput(topic, app)

    telemetry = WorkerTelemetry(
        settings.group_id,
        exporter=settings.metrics_exporter,
        interval_ms=settings.metrics_interval_ms,
        metrics_file=settings.metrics_file,
        lag=lambda: lifecycle_input.lag(processor.next_offsets()),
        pending=processor.pending,
        host_offsets=processor.host_skew_ms,
    )
    return WorkerShell(
        WorkerSettings.of(settings),
        app,
        processor,
        telemetry,
        topic_ids=TopicIds(lambda: admin(kafka), topic),
        lifecycle_input=lifecycle_input,
        controller=ControllerShell(ControllerSettings.of(settings))
        if settings.control_enabled
        else None,
    )


def open_ports(settings: Settings, shell: WorkerShell) -> WorkerPorts:
    """Open the store (applying migrations), the query port, the producers and the
    metrics endpoint, and give them to ``shell``; before consuming."""
    if isinstance(shell.topic_ids, TopicIds):
        shell.topic_ids.open()
    opened = open_for_writing(settings)
    store = opened.store
    # Tools read the embedded store through this port while the worker owns it.
    query_server = start_query_server(settings, store)
    topic = settings.lifecycle_topic
    kafka = settings.kafka_only()
    dlq = DeadLetterSink(kafka)
    summaries = ReliableProducer(kafka, kafka.summaries_topic, "summaries")
    closers = [dlq.abandon, summaries.abandon]
    if query_server is not None:
        closers.append(query_server.stop)
    accuracy = settings.window_config().relative_accuracy
    metrics: MetricsState | None = None
    if settings.prometheus_port is not None:
        metrics = shell.control.metrics if shell.control is not None else MetricsState()
        spec = load_spec_file(settings.slo_spec) if settings.slo_spec is not None else None
        by_boundary = thresholds_by_boundary(spec.slos) if spec is not None else {}
        metrics.use_counters(WindowCounters(by_boundary, accuracy))
    ports = WorkerPorts(
        store=store,
        dead=DeadLetters(
            topic, dlq, lambda gen, since_ms: read_dead_positions(kafka, topic, gen, since_ms)
        ),
        feed=ControlFeed(
            summaries, accuracy, on_stored=metrics.windows_stored if metrics else None
        ),
        ledger=LedgerPublisher(kafka),
        read_ledgers=lambda first, memory_ms: read_topic_ledgers(kafka, first, memory_ms),
        closers=closers,
        rollups_unchecked=opened.rollups_unchecked,
    )
    shell.open(ports)
    if metrics is not None and settings.prometheus_port is not None:
        metrics.health = shell.health
        server = MetricsServer(metrics, settings.prometheus_host, settings.prometheus_port)
        closers.append(server.close)
    log.info(
        "worker started: %s",
        {k: v for k, v in settings.redacted().items() if "password" not in k},
    )
    return ports


def _credentials(settings: KafkaSettings) -> Any:
    if settings.security_protocol == "PLAINTEXT":
        return None
    ctx = ssl.create_default_context(
        cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None
    )
    if settings.security_protocol == "SSL":
        return faust.SSLCredentials(ctx)
    return faust.SASLCredentials(
        username=settings.sasl_username,
        password=settings.sasl_password.get_secret_value() if settings.sasl_password else None,
        mechanism=settings.sasl_mechanism,
        ssl_context=ctx if settings.security_protocol == "SASL_SSL" else None,
    )


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer thread with the broker's fetch wait the app's settings give
    (``fetch_max_wait_ms``): Faust passes aiokafka a fixed 1500 ms; with the app's gate
    on every fetch of committed offsets (``commit_gate``); and with a commit that carries
    metadata and is tried once (:meth:`commit_tagged`)."""

    async def on_start(self) -> None:
        await super().on_start()
        gate = getattr(self.app, "commit_gate", None)
        if gate is not None:
            _gate_committed_fetches(self._ensure_consumer()._coordinator, gate)

    def verify_event_path(self, now: float, tp: TP) -> None:
        """Faust's livelock check (a log line), skipped for a partition whose position
        aiokafka does not know yet (a reset pending: its topic was recreated, say). Faust
        reads ``position`` there, which asserts it is known: the assertion crashed the
        consumer and stopped the worker (a CI run of ``test_fault_topic_cycles.py``)."""
        try:
            subscription = self._ensure_consumer()._fetcher._subscriptions.subscription
            state = subscription.assignment.state_value(AioTopicPartition(tp.topic, tp.partition))
            if state is not None and not state.has_valid_position:
                return None
            return super().verify_event_path(now, tp)
        except (AssertionError, AttributeError):  # reset in between; no subscription yet
            return None

    async def commit_tagged(self, offsets: Mapping[TP, tuple[int, str]]) -> set[int]:
        """Commit ``{tp: (offset, metadata)}``, one attempt (aiokafka's own commit retries
        a retriable error such as an unknown topic until it succeeds); the partitions
        committed (those assigned). Raises aiokafka's errors."""
        result: set[int] = await self.call_thread(self._commit_tagged, offsets)
        return result

    async def _commit_tagged(self, offsets: Mapping[TP, tuple[int, str]]) -> set[int]:
        consumer = self._ensure_consumer()
        subscription = consumer._subscription.subscription
        assignment = subscription.assignment if subscription is not None else None
        if assignment is None:
            return set()
        todo = {
            AioTopicPartition(tp.topic, tp.partition): OffsetAndMetadata(offset, metadata)
            for tp, (offset, metadata) in offsets.items()
            if AioTopicPartition(tp.topic, tp.partition) in assignment.tps
        }
        if not todo:
            return set()
        coordinator = consumer._coordinator
        await coordinator.ensure_coordinator_known()
        async with coordinator._commit_lock:
            await asyncio.shield(coordinator._do_commit_offsets(assignment, todo))
        return {tp.partition for tp in todo}

    async def seek_to_committed(self) -> Mapping[TP, int]:
        """Faust's seek to the committed offsets, with the lifecycle partitions that have
        none moved to their first offset (:func:`seek_to_committed`)."""
        untracked: frozenset[str] = getattr(self.app, "untracked_read_offsets", frozenset())
        consumer = self._ensure_consumer()
        result: Mapping[TP, int] = await self.call_thread(seek_to_committed, consumer, untracked)
        return result

    async def positions(self, topic: str) -> dict[int, tuple[int | None, bool]]:
        """Per assigned partition of ``topic``: the consumer's next fetch offset (None:
        not known yet) and whether it is paused; read on the consumer's thread, without
        waiting for a position (aiokafka's ``position`` waits for a reset)."""
        result: dict[int, tuple[int | None, bool]] = await self.call_thread(self._positions, topic)
        return result

    async def _positions(self, topic: str) -> dict[int, tuple[int | None, bool]]:
        subscription = self._ensure_consumer()._subscription.subscription
        assignment = subscription.assignment if subscription is not None else None
        if assignment is None:
            return {}
        out: dict[int, tuple[int | None, bool]] = {}
        for tp in assignment.tps:
            state = assignment.state_value(tp)
            if tp.topic == topic and state is not None:
                position = state.position if state.has_valid_position else None
                out[tp.partition] = (position, bool(state.paused))
        return out

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        wait_ms = getattr(self.app, "fetch_max_wait_ms", 1500)  # _App's (Faust's own: 1500)
        consumer._fetch_max_wait_ms = wait_ms  # read when its fetcher starts
        return consumer


async def seek_to_committed(consumer: Any, first_if_none: frozenset[str]) -> dict[Any, Any]:
    """Seek the aiokafka ``consumer``'s assigned partitions to their committed offsets (as
    its own ``seek_to_committed``, whose result this is), and those of the topics
    ``first_if_none`` without one (none, or 0; the gate drops another generation's) to
    their first offset, where a partition without a commit is read from.

    aiokafka leaves a partition without a committed offset where it is. Faust seeks to
    the committed offsets after an assignment, and after it dropped a batch it fetched
    while its flow was stopped (``Consumer.getmany``: "getmany called while flow not
    active"; aiokafka's ``fetched_records`` waits through a reassignment and returns
    the new assignment's messages, which Faust drops if they come before it resumes the
    flow). A lifecycle partition of a topic created again has no commit, so its position
    stayed past those messages: with nothing more produced to it the worker never read
    them and waited (issue 49: under CPU stress, the whole new generation of
    ``test_fault_topic_cycles.py``, 98-99 messages, fetched and dropped so; positions at
    the high watermark, nothing read until the test's ceiling)."""
    committed: dict[Any, Any] = await consumer.seek_to_committed()
    first = [tp for tp, offset in committed.items() if tp.topic in first_if_none and not offset]
    if first:
        try:
            await consumer.seek_to_beginning(*first)
        except aiokafka_errors.IllegalStateError as exc:  # reassigned meanwhile: its own reset
            log.info("seek to the first offsets of %s skipped: %s", first, exc)
    return committed


def _gate_committed_fetches(
    coordinator: Any, gate: Callable[[Any, dict[Any, Any]], Awaitable[dict[Any, Any]]]
) -> None:
    """Pass every fetch of committed offsets by ``coordinator`` (aiokafka's; the
    assignment's positions and seeks to committed all read them through
    ``_do_fetch_commit_offsets``) through ``gate``."""
    fetch = coordinator._do_fetch_commit_offsets

    async def gated(partitions: Any) -> dict[Any, Any]:
        return await gate(partitions, await fetch(partitions))

    coordinator._do_fetch_commit_offsets = gated


class _ReadOffsets(dict[Any, Any]):
    """Faust's last-delivered offset per partition (``Consumer._read_offset``), except
    for the topics in ``untracked``: for those, none is ever known.

    Faust drops a fetched message below that offset (a re-delivery after a seek). The
    worker tracks the lifecycle topic's offsets itself (acks disabled, its own commits)
    and seeks it back itself (``_reposition``, ``_skipped_at_start``): a delivery in
    flight sets Faust's value again after the seek cleared it, and Faust then dropped
    the very messages the seek went back for (without this class, 1 of 2 runs of
    ``test_fault_topic_cycles.py`` stalled that way). Messages delivered twice are
    duplicates to the join instead."""

    def __init__(self, untracked: frozenset[str]) -> None:
        super().__init__()
        self._untracked = untracked

    def __missing__(self, key: Any) -> None:
        return None

    def __getitem__(self, key: Any) -> Any:
        if getattr(key, "topic", None) in self._untracked:
            return None
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        if getattr(key, "topic", None) in self._untracked:
            return None
        return super().get(key, default)


class _Consumer(faust_aiokafka.Consumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        untracked: frozenset[str] = getattr(self.app, "untracked_read_offsets", frozenset())
        self._read_offset = _ReadOffsets(untracked)

    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class _App(faust.App):
    """The Faust app whose consumer sets the broker's fetch wait (see _ConsumerThread)."""

    fetch_max_wait_ms = 1500  # Faust's own; build_app sets the settings' value
    # build_app sets the shell's Commits.gate (see _ConsumerThread)
    untracked_read_offsets: frozenset[str] = frozenset()  # see _ReadOffsets
    commit_gate: Callable[[Any, dict[Any, Any]], Awaitable[dict[Any, Any]]] | None = None
    # Faust's data directory (its table dir; our tables are in memory), removed with the
    # app: Faust's default, "<app id>-data" in the working directory, left one empty
    # directory per consumer group wherever a worker ran
    faust_datadir: tempfile.TemporaryDirectory[str] | None = None

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)


def build_app(settings: Settings) -> tuple[faust.App, WorkerShell]:
    """Build the Faust app and its shell. Nothing runs until a faust.Worker starts it."""
    datadir = tempfile.TemporaryDirectory(prefix="tailguard-faust-")
    app = _App(
        settings.group_id,
        datadir=datadir.name,
        broker=[f"kafka://{hp.strip()}" for hp in settings.bootstrap_servers.split(",")],
        broker_credentials=_credentials(settings),
        store="memory://",
        autodiscover=False,
        web_enabled=settings.worker_web_port is not None,
        web_port=settings.worker_web_port or 6066,
        web_bind="127.0.0.1",
        topic_partitions=settings.topic_partitions,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_max_poll_records=5000,
        consumer_max_fetch_size=settings.fetch_max_partition_bytes,
        broker_session_timeout=settings.session_timeout_ms / 1000,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_ms / 3000),
        stream_buffer_maxsize=8192,
        # Faust's own commits (the controller's summaries, engine stats) every flush, as
        # the lifecycle's: what the controller took is committed as soon (not 2.8 s on)
        broker_commit_interval=settings.flush_interval_ms / 1000,
        # A recreated topic is seen at the next metadata refresh (see check_topic).
        consumer_metadata_max_age_ms=settings.topic_check_interval_ms * 5,
    )
    app.fetch_max_wait_ms = settings.fetch_max_wait_ms
    app.faust_datadir = datadir
    shell = build_shell(settings, app)
    app.commit_gate = shell.commits.gate
    app.untracked_read_offsets = frozenset({settings.lifecycle_topic})
    topic = app.topic(
        settings.lifecycle_topic, value_type=bytes, value_serializer="raw", acks=False
    )

    @app.agent(topic, name="tailguard-lifecycle")
    async def lifecycle(stream: faust.StreamT[bytes]) -> None:
        take = stream.take_events  # type: ignore[attr-defined]  # faust-streaming API, not in StreamT
        try:
            async for events in take(settings.take_max_messages, within=0.1):
                batch = [(e.message.partition, e.message.offset, e.message.value) for e in events]
                with shell.stall.batching():
                    await shell.on_batch(batch)
        finally:
            shell.abandon_flush()

    stats_topic = app.topic(settings.engine_stats_topic, value_type=bytes, value_serializer="raw")

    @app.agent(stats_topic, name="tailguard-engine-stats")
    async def engine_stats(stream: faust.StreamT[bytes]) -> None:
        take = stream.take_events  # type: ignore[attr-defined]
        async for events in take(settings.take_max_messages, within=0.2):
            try:
                await shell.on_stats(
                    [(ev.message.partition, ev.message.offset, ev.message.value) for ev in events]
                )
            except ShuttingDownError:  # stopping before the DLQ acknowledged: re-read later
                log.info("engine.stats batch abandoned at shutdown")
                return

    if settings.control_enabled:
        summaries_topic = app.topic(
            settings.summaries_topic, value_type=bytes, value_serializer="raw"
        )

        @app.agent(summaries_topic, name="tailguard-controller")
        async def controller(stream: faust.StreamT[bytes]) -> None:
            take = stream.take_events  # type: ignore[attr-defined]
            async for events in take(1000, within=0.05):  # decisions wait for this
                await shell.on_summaries([ev.message.value for ev in events])

        @app.timer(interval=1.0)  # type: ignore[untyped-decorator]
        async def heartbeat() -> None:
            await shell.on_heartbeat()

    if settings.control_enabled and settings.control_provisional_ms > 0:
        # Every worker snapshots its own partitions' ended windows for the controller.
        @app.timer(interval=settings.control_provisional_ms / 1000)  # type: ignore[untyped-decorator]
        async def provisional() -> None:
            await shell.send_provisional()

    @app.timer(interval=settings.flush_interval_ms / 1000)  # type: ignore[untyped-decorator]
    async def flush() -> None:
        try:
            await shell.flush_and_commit()
        except ShuttingDownError as exc:  # SIGTERM during a write: nothing committed
            log.info("flush abandoned, nothing committed: %s", exc)

    @app.timer(interval=settings.topic_check_interval_ms / 1000)  # type: ignore[untyped-decorator]
    async def check_topic() -> None:
        await shell.watch.check_topic()
        await shell.stall.check()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        await shell.watch.on_assigned()

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        try:
            await shell.on_revoked(revoked)
        except ShuttingDownError as exc:
            log.info("revocation flush abandoned, nothing committed: %s", exc)

    return app, shell


def tune_gc() -> None:
    """Collect cycles less often: the worker holds millions of long-lived objects
    (pending joins, open windows, buffered rows) and CPython's default thresholds
    re-scan them so often that collection took ~40 % of the processing time
    (``bench/``). Start-up objects are frozen out of collection; cycles are still
    collected, every 500,000 net allocations instead of 700. A processing batch and the
    buffers of one flush make ~50,000-200,000 short-lived tracked objects (kept-event
    tuples, heap items, lists) that die at the flush: a young generation smaller than that
    is collected at every peak, traversing objects about to be freed anyway (at 50,000:
    one collection per ~44,000 events, 0.5-0.85 µs/event; at 500,000: none)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(500_000, 20, 100)


# How long the event loop may hold the GIL while the writer thread waits for it (CPython's
# default is 5 ms; see tune_gil).
GIL_SWITCH_S = 0.0005


def tune_gil() -> None:
    """Hand the GIL over every 0.5 ms instead of every 5 ms.

    The writer thread's Python steps between its chDB calls (which release the GIL) each
    wait for the event loop to hand the GIL over, and a window's write has many: under a
    live load the closed windows took 130-350 ms to write against ~30 ms alone, and the
    controller's decision waits for them. The event loop computes either way, so the
    rate did not move (alternating catch-up runs, 20 instances, medians: 78.4k events/s
    at 0.5 ms against 75.8k at 5 ms, then 72.4k against 72.7k)."""
    sys.setswitchinterval(GIL_SWITCH_S)


def run_worker(settings: Settings, loglevel: str = "info") -> None:
    """Run one worker until SIGTERM/SIGINT (blocking)."""
    if not _wait_for_broker(settings):
        return
    app, shell = build_app(settings)
    open_ports(settings, shell)  # fail fast on a bad store, before joining the group
    tune_gc()
    tune_gil()

    class _Lifecycle(faust.Service):
        async def on_stop(self) -> None:  # runs after the app (and its consumer) stopped
            await shell.stop()

    worker = _Worker(
        app, _Lifecycle(), loglevel=loglevel, quiet=True, redirect_stdouts=False, shell=shell
    )
    worker.execute_from_commandline()


def _wait_for_broker(settings: KafkaSettings) -> bool:
    """Start-up before the broker: wait for it with backoff, as a service under a
    supervisor should (SIGTERM/SIGINT meanwhile: False, exit cleanly)."""
    stop = threading.Event()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in handlers:
        signal.signal(sig, lambda *_: stop.set())
    try:
        up = wait_for_broker(settings, stop)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if not up:
        log.warning("stopped while waiting for the Kafka broker")
    return up


class _Worker(faust.Worker):
    """Faust's worker, told to stop waiting the moment a stop signal arrives: a write
    retrying through a store outage or a DLQ flush waiting for the broker would
    otherwise hold the shutdown until it succeeds."""

    def __init__(self, *args: Any, shell: WorkerShell, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shell = shell

    def install_signal_handlers(self) -> None:
        super().install_signal_handlers()  # the event loop's (Faust stops through them)
        # ... and one acted on at once, even while a batch holds the loop (stop_signal).
        PromptStop(
            on_signal=lambda _sig: self._shell.begin_stop(),
            on_overdue=lambda: stop_overdue(self._shell),
            grace_s=STOP_GRACE_S,
        ).install()

    def _on_sigterm(self) -> None:
        self._shell.begin_stop()  # already done by PromptStop's thread, as a rule
        super()._on_sigterm()

    def _on_sigint(self) -> None:
        self._shell.begin_stop()
        super()._on_sigint()


def stop_overdue(shell: WorkerShell, close_grace_s: float = CLOSE_GRACE_S) -> None:
    """Still here ``STOP_GRACE_S`` after the stop signal: close and exit.

    Faust's stop can hang (its consumer thread can die inside its own shutdown when
    the broker is unreachable), and on a loaded machine a batch can hold the event
    loop for seconds. Exiting is safe: with ``stopping`` set nothing more is
    committed. Closing waits at most ``close_grace_s`` for a write in flight; after
    that the process exits without it, as a SIGKILL would (writes are idempotent and
    their offsets uncommitted: the next run writes them again)."""
    log.warning(
        "still stopping %.0fs after the signal: closing and exiting now; nothing more "
        "was committed",
        STOP_GRACE_S,
    )
    closer = threading.Thread(target=shell.close, name="tailguard-close", daemon=True)
    closer.start()
    closer.join(close_grace_s)
    if closer.is_alive():
        log.warning(
            "a store write still in flight %.0fs into closing: exiting without it "
            "(its offsets are not committed; the next run writes it again)",
            close_grace_s,
        )
    logging.shutdown()
    os._exit(0)
