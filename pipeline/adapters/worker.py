"""The worker's loop: a thin shell around :class:`pipeline.core.processor.StreamProcessor`.

Delivery guarantee: at-least-once with idempotent writes.

* The lifecycle topic is consumed with Faust acks disabled; the worker
  commits offsets itself, per partition, only up to
  ``StreamProcessor.safe_offsets()``: the oldest offset whose events are
  still held in memory (pending joins), and only after every record built
  from earlier offsets has been written to ClickHouse and every dead letter
  has been delivered to the DLQ. A crash therefore replays from the oldest
  open state and rebuilds it; rows are keyed by request_id (ReplacingMergeTree)
  so the replay writes nothing twice.
* (Faust's own out-of-order ack tracking commits past an un-acked head offset
  — ``Consumer._new_offset`` — so holding messages un-acked is not safe; hence
  our own commit.)
* On a rebalance the state of revoked partitions is dropped; the new owner
  rebuilds it from the committed offset. Unless the topic generation it was read from
  is gone (the topic deleted, or deleted and created again): nobody can rebuild it then,
  so it is finished (``StreamProcessor.finish``: open windows closed and written,
  pending requests written as partial records) and written before the new generation
  is read; see :meth:`WorkerShell.on_revoked` and ``docs/reliability.md``.
* Each commit carries, in its metadata, the id of the topic generation it was
  read from, is tried once and dropped when that generation is gone; a committed
  offset of another generation is ignored at assignment. See
  :mod:`pipeline.adapters.generations`.

The pieces: the flush's writer, its order and the flush-behind chain in
:mod:`pipeline.adapters.flush`; what the controller is told in
:mod:`pipeline.adapters.control_feed`; the control host in
:mod:`pipeline.adapters.controller`; the dead letters in
:mod:`pipeline.adapters.dead_letters`; the Faust app, its consumer and the process in
:mod:`pipeline.adapters.faust_wiring`. :class:`WorkerShell` keeps the loop's state
machine: batches in, flushes and commits out, assignments, revocations and the stop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from faust.types import TP

from pipeline.adapters.control_feed import ControlFeed
from pipeline.adapters.controller import ControlHost, ControllerShell
from pipeline.adapters.dead_letters import DeadLetters
from pipeline.adapters.flush import Flush, FlushBehind, FlushSettings, FlushWriter, LedgerPort
from pipeline.adapters.generations import Commits, GenerationFinish, TopicWatch
from pipeline.adapters.lifecycle_input import LifecycleInput, lagging_of
from pipeline.adapters.queries.events import read_inflight
from pipeline.adapters.queries.windows import read_ledger, read_window_horizons
from pipeline.adapters.reliable import ShuttingDownError
from pipeline.adapters.stall_guard import StallGuard
from pipeline.adapters.store import (
    Checkpoint,
    StoreError,
    is_data_error,
    with_retry,
)
from pipeline.adapters.worker_counts import WorkerCounts
from pipeline.contract.codec import DeadLetter
from pipeline.contract.events import EVENT_ADAPTER
from pipeline.core.ledger import ENDED_THROUGH, merge_versions
from pipeline.core.processor import KeptMessage, Output, StreamProcessor
from pipeline.core.record import RequestRecord
from pipeline.core.windows import ClosedWindow

if TYPE_CHECKING:
    from pipeline.adapters.store import ClickHouseStore
    from pipeline.adapters.telemetry import WorkerTelemetry
    from pipeline.settings import Settings

log = logging.getLogger("tailguard.worker")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What the worker's loop needs of the settings (built once from :class:`Settings`)."""

    flush: FlushSettings
    engine_stats_topic: str
    max_message_bytes: int
    store_raw_events: bool
    inflight_ttl_ms: int
    join_memory_ms: int  # how far back the join remembers requests (its resolved TTL)
    provisional: bool  # the controller gets provisional snapshots (control_provisional_ms)

    @property
    def lifecycle_topic(self) -> str:
        return self.flush.lifecycle_topic

    @classmethod
    def of(cls, s: Settings) -> WorkerSettings:
        return s.narrowed(
            cls,
            flush=FlushSettings.of(s),
            join_memory_ms=s.join_config().resolved_ttl_ms,
            provisional=s.control_enabled and s.control_provisional_ms > 0,
        )


# Per new partition: the ledger of what the topic's ledger counts from an offset on
# (read_topic_ledgers: ``{partition: first offset}``, memory_ms -> ``{partition: ledger}``).
ReadLedgers = Callable[[dict[int, int], int], Mapping[int, dict[str, int]]]


@dataclass
class WorkerPorts:
    """What :meth:`WorkerShell.open` is given (made by ``faust_wiring.open_ports``, where
    the store is opened and migrated and the producers made; fakes in unit tests)."""

    store: ClickHouseStore
    dead: DeadLetters
    feed: ControlFeed | None
    ledger: LedgerPort | None
    read_ledgers: ReadLedgers
    closers: list[Callable[[], None]] = field(default_factory=list)  # servers, producers
    rollups_unchecked: bool = False  # the start-up check of the rollups failed
    writer: Any = None  # a writer given instead of a FlushWriter over the store (tests)


class WorkerShell:
    """The loop's state machine; its adapters are given (see ``faust_wiring.build_shell``)."""

    def __init__(
        self,
        settings: WorkerSettings,
        app: Any,
        processor: StreamProcessor,
        telemetry: WorkerTelemetry,
        *,
        topic_ids: Callable[[], str | None],
        lifecycle_input: LifecycleInput | None = None,
        commits: Commits | None = None,
        controller: ControllerShell | None = None,
    ) -> None:
        topic = settings.lifecycle_topic
        self.settings = settings
        self.processor = processor
        self.telemetry = telemetry
        self.topic_ids = topic_ids
        self.input = lifecycle_input or LifecycleInput(topic, app)
        self.commits = commits or Commits(topic, app, topic_ids)
        self.watch = TopicWatch(
            topic, app, topic_ids, self.commits,
            partitions=lambda: list(self.processor.next_offsets()),
            drop_state=functools.partial(drop_topic_state, processor, self.commits),
            finish_state=self._finish_topic_state,
        )  # fmt: skip
        self.stall = StallGuard(self.watch, processor.next_offsets, self.input.store_up.is_set)
        self.counts = WorkerCounts(processor, telemetry, self.stall)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailguard-writer")
        # Set on SIGTERM/SIGINT: retry loops and waits give up at once (nothing after
        # that is committed), so the worker stops within seconds in every state.
        self.stopping = threading.Event()
        self.writes = WritePolicy(self.stopping, self.input.pause)
        self.control = (
            ControlHost(controller, self._executor, self.writes.sleep)
            if controller is not None
            else None
        )
        self.behind = FlushBehind(
            self.flush_and_commit, lambda: len(self._records), settings.flush.flush_max_rows
        )
        self.ports: WorkerPorts | None = None
        self.writer: Any = None
        self._records: list[RequestRecord] = []
        self._windows: list[ClosedWindow] = []
        # Windows (and corrections) taken by the flush being written: their summaries
        # are not sent yet, so they cap the clock sent to the controller too.
        self._writing: list[ClosedWindow] = []
        self._events: list[KeptMessage] = []  # lifecycle_events rows, one message each
        self.finish = GenerationFinish(
            processor, self.counts, self.commits,
            dead=lambda: self.dead, collect=self._collect, topic=topic,
        )  # fmt: skip
        self._flush_lock = asyncio.Lock()
        self._yielded = False  # the last flush left its raw events to this one
        self._close_lock = threading.Lock()
        self._closed = False

    @property
    def dead(self) -> DeadLetters:
        assert self.ports is not None
        return self.ports.dead

    def open(self, ports: WorkerPorts) -> None:
        """Take the opened store and producers (before consuming)."""
        self.ports = ports
        s = self.settings.flush
        self.writer = ports.writer or FlushWriter(
            ports.store, s.group_id, s.lifecycle_topic, s.relative_accuracy,
            retry=self.writes.retry, dead_rows=self._dead_rows, ledger=ports.ledger,
            told=ports.feed, on_told=self._told, stopping=self.stopping,
            rollups_unchecked=ports.rollups_unchecked,
        )  # fmt: skip
        if self.control is not None:
            self.control.open(ports.store, self.writer)

    def health(self) -> dict[str, float]:
        """The worker's own health for /metrics (``tailguard_worker_<name>``)."""
        return self.counts.health(self.input.lag(self.processor.next_offsets()), self.input)

    def _collect(self, out: Output) -> None:
        self._records.extend(out.records)
        self._windows.extend(out.windows)
        # The payload is the event's bytes as the producer sent them (no re-encoding).
        self._events.extend(out.kept)
        if out.dead:
            self.telemetry.dead_letters.add(self.dead.send(out.dead, self.watch.topic_id))

    async def on_batch(self, messages: list[tuple[int, int, bytes]]) -> None:
        self.behind.raise_failed()
        await self.input.store_up.wait()  # back pressure: hold this batch while the store is down
        if self.watch.barrier:
            messages = self.watch.past_barrier(messages)
        if not (messages := self.counts.not_handled(messages)):  # (handled already)
            return
        new: dict[int, int] = {}
        for p, off, _ in messages:
            if not self.processor.has_partition(p) and p not in new:
                new[p] = off
        if new:
            skipped = await self.watch.skipped_at_start(new)
            if skipped:
                messages = [m for m in messages if m[0] not in skipped]
                new = {p: o for p, o in new.items() if p not in skipped}
        if new:
            await self._start_partitions(new, messages)
        before = self.processor.counters.events
        last: dict[int, int] = {}
        for p, off, _ in messages:
            last[p] = off + 1
        lagging = lagging_of(self.input.lags(last))
        out = self.processor.process(messages, int(time.time() * 1000), lagging)
        self.telemetry.messages.add(len(messages))
        self.telemetry.events.add(self.processor.counters.events - before)
        self._collect(out)
        # A window that closed is written now, not at the next timer flush: its final
        # summary and the close horizon after it are what let the controller decide on
        # the window ending now (DecisionClock: budgets read the final windows).
        closed = any(not w.correction for w in out.windows)
        if closed or len(self._records) >= self.settings.flush.flush_max_rows:
            await self.behind.after_batch(closed)

    async def _start_partitions(
        self, new: dict[int, int], messages: list[tuple[int, int, bytes]]
    ) -> None:
        """Partitions this worker starts (``new``: each one's first offset read)."""
        assert self.ports is not None
        s, loop = self.settings, asyncio.get_running_loop()
        ledgers = await loop.run_in_executor(
            self._executor, counted_ledgers, self.ports, s.lifecycle_topic, new, s.join_memory_ms
        )
        # Read from its first offset (no commit of this generation: a topic created
        # again, or new): windows already written for the partition (a finished
        # generation's) are not closed again, its records for them are corrections.
        fresh = [p for p in new if p not in self.commits.resume_at]
        horizons = await loop.run_in_executor(
            self._executor, read_window_horizons, self.ports.store, s.lifecycle_topic, fresh
        )
        meta = self.commits.resume_meta
        await self.dead.read_back(new, meta, self.watch.topic_id, self._executor)
        for p, first in new.items():
            self.processor.init_partition(p, ledgers[p], horizon_ms=horizons.get(p, 0))
            log.info(
                "partition %d: resuming at offset %d, %d requests already counted",
                p, first, len(ledgers[p]),
            )  # fmt: skip
        if s.store_raw_events:
            starts: dict[int, int] = {}
            for p, off, _ in messages:
                if p in new:
                    starts.setdefault(p, off)
            await restore_inflight(self.processor, self.ports.store, s, starts, self._executor)
            for p, off in starts.items():
                # A restored received that meets its partner would pull the commit back to
                # its own offset: it is durable, so commits never go below where reading
                # began.
                self.commits.floor[p] = off

    def abandon_flush(self) -> None:
        """The lifecycle agent stops: a flush it started stops with it."""
        self.behind.abandon()

    async def flush_and_commit(self, may_yield: bool = True) -> None:
        """Write what is buffered and commit the offsets it covers. ``may_yield``: the
        flush may leave its raw events and commit to the next flush when a window
        closes meanwhile (see :meth:`FlushWriter.write`); never twice in a row."""
        async with self._flush_lock:
            self.behind.raise_failed()
            lags = self.input.lags(self.processor.next_offsets())
            # Only live, within a batch of the input's end: catching up, windows close
            # at most batches and nobody waits on a decision yet (the chunks and the
            # extra flushes cost ~9 % of the rate there, measured).
            known = [lag for lag in lags.values() if lag is not None]
            live = len(known) == len(lags) and sum(known) <= self.settings.flush.take_max_messages
            hurry = self.behind.hurry if may_yield and live and not self._yielded else None
            self.behind.hurry.clear()
            self._collect(self.processor.tick(int(time.time() * 1000), lagging_of(lags)))
            # Snapshot offsets, horizons and buffers together: nothing processed
            # after this point is covered by the commit below, which is made only for
            # the topic generation these offsets were read from.
            generation = self.watch.assigned_gen
            offsets = self.commits.floored(self.processor.safe_offsets())
            # The windows of a finished generation carry its end mark as their ledger's
            # ``through`` (pipeline.core.ledger.ENDED_THROUGH).
            through = self.processor.next_offsets()
            through.update(dict.fromkeys(self.finish.take_ended(), ENDED_THROUGH))
            flush = Flush(
                self._records, self._windows, self._events,
                checkpoints_of(self.processor, offsets), through,
            )  # fmt: skip
            self._records, self._windows, self._events = [], [], []
            self.behind.took()  # a batch waiting on a full buffer goes on
            loop = self.writes.loop = asyncio.get_running_loop()
            left: list[KeptMessage] = []
            if flush:
                t0 = time.perf_counter()
                self._writing = list(flush.windows)
                try:
                    write = functools.partial(self.writer.write, flush, hurry=hurry)
                    retries, left = await loop.run_in_executor(self._executor, write)
                finally:
                    self._writing = []
                self.input.resume()
                t = self.telemetry
                t.write_duration.record((time.perf_counter() - t0) * 1000)
                t.write_retries.add(retries)
                t.records.add(len(flush.records))
                t.record_latencies(flush.records)
                t.windows_closed.add(len(flush.windows))
                self.counts.written(len(flush.records), retries)
            self._yielded = bool(left)
            if left:
                # A window closed meanwhile: the next flush (at once) writes its windows,
                # then these raw events before its own, and commits for both.
                self._events[:0] = left
                return
            await loop.run_in_executor(self._executor, self.dead.sink.flush, self.stopping)
            changed = self.commits.changed(offsets)
            if changed:
                await self.commits.commit(
                    changed, generation, self.dead, self.stopping, self.watch.topic_id
                )
            self.counts.count()
            self.counts.maybe_log()

    # --- failures: outages retried, rejected rows dead-lettered, stop honoured ---------

    def _dead_rows(self, dead: list[DeadLetter]) -> None:
        """Rows the store refused, to the DLQ (counted)."""
        if dead:
            self.telemetry.dead_letters.add(self.dead.send(dead, self.watch.topic_id))
            self.counts.store_rejected += len(dead)

    def _told(self, windows: Sequence[ClosedWindow]) -> None:
        """From the writer thread, once the flush's windows are stored and their final
        summaries acknowledged: they no longer cap the provisional clocks (one
        assignment, read on the event loop), and the controller gets the clocks they
        were capping at once (on the event loop, in order with the timer's snapshots),
        not at the next ``control_provisional_ms`` tick, which added up to that long to
        every decision."""
        self._writing = []
        loop = self.writes.loop
        if windows and loop is not None and self.settings.provisional:
            loop.call_soon_threadsafe(self._send_provisional)

    # --- the controller's input ----------------------------------------------------------

    async def on_stats(self, messages: list[tuple[int, int, bytes]]) -> None:
        """Forward engine.stats to the controller (one topic for all it needs)."""
        s, ports = self.settings, self.ports
        assert ports is not None
        assert ports.feed is not None
        dead = ports.feed.stats(messages, s.engine_stats_topic, s.max_message_bytes)
        if dead:
            ports.dead.sink.send_dead(dead)
            self.telemetry.dead_letters.add(len(dead))
            # Faust commits this topic's offsets once the batch returns: the dead letters
            # must be acknowledged by the DLQ first (not on the writer thread, which a
            # store outage may hold).
            flush = ports.dead.sink.flush
            await asyncio.get_running_loop().run_in_executor(None, flush, self.stopping)

    async def send_provisional(self) -> None:
        """The ``control_provisional_ms`` timer's call (see :meth:`ControlFeed.provisional`)."""
        self._send_provisional()

    def _send_provisional(self) -> None:
        feed = self.ports.feed if self.ports is not None else None
        if feed is None:
            return
        snaps, clocks = self.processor.provisional()
        feed.provisional(snaps, clocks, (*self._windows, *self._writing))

    async def on_summaries(self, raws: list[bytes]) -> None:
        """The controller's input (this worker owns the summaries partition)."""
        if self.control is not None:
            self.telemetry.write_retries.add(await self.control.on_summaries(raws))

    async def on_heartbeat(self) -> None:
        if self.control is not None:
            self.telemetry.write_retries.add(await self.control.on_heartbeat())

    # --- the group: topic generations, assignments, revocations --------------------------

    async def _finish_topic_state(self, parts: list[int], gen: str | None) -> None:
        """TopicWatch noticed the generation ``gen`` gone: finish its state and write it
        (before the watch moves the consumer, and the commits, to the new generation)."""
        self.finish.finish(parts, gen)
        await self.flush_and_commit(may_yield=False)

    async def on_revoked(self, revoked: set[TP]) -> None:
        parts = [tp.partition for tp in revoked if tp.topic == self.settings.lifecycle_topic]
        held = [p for p in parts if self.processor.has_partition(p)]
        # An ordinary rebalance: the next owner rebuilds the state from the committed
        # offset, so it is dropped here (finishing it would count it twice). The topic's
        # generation gone (deleted, or deleted and created again): nobody rebuilds it,
        # so it is finished and written before the group assigns the new generation.
        gen = self.watch.assigned_gen
        gone = bool(held) and await self.watch.generation_gone()
        if gone:
            self.finish.finish(held, gen)
        # Write what is complete (idempotent), then forget the handed-away state.
        await self.flush_and_commit(may_yield=False)
        self.processor.revoke(parts)
        self.commits.revoked(parts)
        self.dead.drop(parts)  # the next owner reads them back from the DLQ
        for p in parts:
            self.watch.barrier.pop(p, None)

    # --- the stop ---------------------------------------------------------------------------

    async def stop(self) -> None:
        """Write buffered records (idempotent) and the audit rows of the signals
        published. No commit and no windows: the consumer is gone by now; the next
        owner replays from the committed offset."""
        self.stopping.set()
        self.abandon_flush()
        try:
            batch, self._records = self._records, []
            final_writes(batch, self.writer, self.control, self.counts)
        finally:
            self.close()

    def close(self) -> None:
        """Release everything (once: the stop watchdog may get here first)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._executor.shutdown(wait=True)
            if self.ports is not None:
                for close in self.ports.closers:
                    close()
            if self.control is not None:
                self.control.close()
            if self.ports is not None:
                self.ports.store.close()
            self.counts.maybe_log(force=True)
            self.telemetry.shutdown()

    def begin_stop(self) -> None:
        """A stop signal arrived: retry loops and waits give up at once, nothing more is
        committed (from the stop thread, the moment the signal arrives; idempotent)."""
        if not self.stopping.is_set():
            self.stopping.set()
            log.info(
                "stop signal: stopping (writes in progress give up; nothing more is committed)"
            )


def drop_topic_state(processor: StreamProcessor, commits: Commits, parts: list[int]) -> None:
    """State built from messages fetched at the old positions of a topic created again
    (the consumer had not noticed): they are the new generation's, read again from its
    first offset, so this state is dropped (see TopicWatch._reposition)."""
    processor.revoke(parts)
    commits.generation_gone(parts)


def final_writes(
    batch: list[RequestRecord],
    writer: FlushWriter | None,
    control: ControlHost | None,
    counts: WorkerCounts,
) -> None:
    """At stop: the buffered records (idempotent) and the audit rows of the signals
    published, each tried once."""
    once = functools.partial(with_retry, attempts=1, fatal=is_data_error)
    try:
        if batch and writer is not None:
            writer.write_records(batch, retry=once)
            counts.written(len(batch), 0)
    except (StoreError, ShuttingDownError) as exc:
        log.warning("buffered records not written at stop (the next owner replays): %s", exc)
    try:
        if control is not None:
            # The audit of signals already published (their write may have been
            # cancelled with the controller agent, or given up at the signal).
            control.write_audit(attempts=1)
    except (StoreError, ShuttingDownError) as exc:
        log.warning("control audit rows not written at stop: %s", exc)


def checkpoints_of(processor: StreamProcessor, offsets: Mapping[int, int]) -> list[Checkpoint]:
    """The checkpoint rows of a flush committing ``offsets``."""
    horizons, marks = processor.horizons(), processor.watermarks()
    late = processor.lateness_by_partition()
    return [
        Checkpoint(p, horizons[p], marks.get(p, 0), o, *late.get(p, (0, 0, 0)))
        for p, o in offsets.items()
    ]


class WritePolicy:
    """How the worker's writes meet failures: an outage is retried with backoff, the
    lifecycle input paused meanwhile (``pause``, on the event loop ``loop``); a data
    error is raised at once (the writer isolates the rows it names); a stop signal
    (``stopping``) gives up at once."""

    def __init__(self, stopping: threading.Event, pause: Callable[[], None]) -> None:
        self.stopping = stopping
        self.pause = pause
        self.loop: asyncio.AbstractEventLoop | None = None  # the flush's, once one ran

    def sleep(self, delay_s: float) -> None:
        """The retry backoff; gives up at once when the worker is stopping."""
        if self.stopping.wait(delay_s):
            raise ShuttingDownError("stopping during a write retry")

    def retry(self, fn: Any, what: str) -> int:
        """One write, retried (on the writer thread); the retries it took."""
        if self.stopping.is_set():
            raise ShuttingDownError(f"stopping before the {what}")
        return with_retry(fn, what, on_failure=self._failed, sleep=self.sleep, fatal=is_data_error)

    def _failed(self, _exc: Exception) -> None:
        """A write failed (on the writer thread; it retries with backoff): pause the input."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.pause)


def counted_ledgers(
    ports: WorkerPorts, topic: str, first_offsets: dict[int, int], memory_ms: int
) -> dict[int, dict[str, int]]:
    """New partitions: the ledger of what the store already counts from the offset each
    resumes at (its first message here: the committed offset): this store's ledger, and
    the topic's (written by every worker of the group). Blocking (the writer thread)."""
    shared = ports.read_ledgers(first_offsets, memory_ms)
    out = {}
    for p, first in first_offsets.items():
        out[p] = read_ledger(ports.store, topic, p, first, memory_ms, since_end=True)
        merge_versions(out[p], shared.get(p, {}))
    return out


async def restore_inflight(
    processor: StreamProcessor,
    store: ClickHouseStore,
    s: WorkerSettings,
    starts: dict[int, int],
    executor: Executor,
) -> None:
    """New partitions, each read from ``starts[p]`` on: the gateway.received events from
    before that offset (the commit does not wait for a lone received: it is in the raw
    events table), back into the join."""
    found = await asyncio.get_running_loop().run_in_executor(
        executor, lambda: read_inflight(store, s.lifecycle_topic, starts, s.inflight_ttl_ms)
    )
    for p, rows in found.items():
        events = [(off, EVENT_ADAPTER.validate_json(payload)) for off, payload in rows]
        n = processor.restore_inflight(p, events)
        log.info("partition %d: %d in-flight requests restored from the store", p, n)
