"""The Faust worker: a thin shell around :class:`pipeline.core.processor.StreamProcessor`.

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
  rebuilds it from the committed offset.
* Each commit carries, in its metadata, the id of the topic generation it was
  read from (a topic deleted and created again is a new generation), is tried
  once and dropped when that generation is gone; a committed offset of another
  generation is ignored at assignment (the partition is read from its first
  offset). See ``check_topic``, ``_commit`` and ``gate_committed``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import logging
import os
import signal
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import faust
import msgspec
import orjson
from aiokafka import errors as aiokafka_errors
from aiokafka.structs import OffsetAndMetadata
from aiokafka.structs import TopicPartition as AioTopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from pipeline.adapters.controller import ControllerShell
from pipeline.adapters.kafka_admin import admin, topic_id, wait_for_broker
from pipeline.adapters.ledger import LedgerPublisher, read_topic_ledgers
from pipeline.adapters.prometheus import MetricsServer, MetricsState
from pipeline.adapters.queries.events import read_inflight
from pipeline.adapters.queries.windows import read_ledger
from pipeline.adapters.query_server import QueryServer, start_query_server
from pipeline.adapters.reliable import (
    DeadLetterSink,
    ReliableProducer,
    ShuttingDownError,
    read_dead_positions,
)
from pipeline.adapters.rollups import check_rollups, write_windows_repairing
from pipeline.adapters.stop_signal import PromptStop
from pipeline.adapters.store import (
    BudgetEventRow,
    Checkpoint,
    ClickHouseStore,
    ControlRow,
    KeptEvent,
    StoreError,
    is_data_error,
    migrate,
    open_store,
    with_retry,
    write_audit,
    write_checkpoints,
    write_isolating,
    write_raw_isolating,
    write_requests,
)
from pipeline.adapters.telemetry import WorkerTelemetry
from pipeline.contract.codec import DeadLetter, SourceRef, dead_subposition, decode_message
from pipeline.contract.events import EVENT_ADAPTER, EngineStats
from pipeline.contract.summary import Progress, StatsSample, encode_summary
from pipeline.core.dead_positions import DeadPositions
from pipeline.core.generation import (
    CommitMeta,
    commit_applies,
    commit_metadata,
    parse_commit_metadata,
)
from pipeline.core.ledger import merge_versions
from pipeline.core.processor import KeptMessage, Output, StreamProcessor
from pipeline.core.record import RequestRecord
from pipeline.core.slo_windows import slo_factory
from pipeline.core.summary import summarize
from pipeline.core.windows import ClosedWindow
from pipeline.settings import Settings
from pipeline.spec.slo import load_spec_file

log = logging.getLogger("tailguard.worker")

STOP_GRACE_S = 6.0  # a stop signal ends the process within this long, whatever Faust does
CLOSE_GRACE_S = 2.0  # ... plus at most this long waiting for a store write in flight
# While a flush runs, the buffer may grow to this many times flush_max_rows before a batch
# waits for a flush to take it: the writer then always has the next flush ready (a loop
# that waited on every full buffer spent ~20 % of a catch-up run idle, see _flush_behind).
BEHIND_BUFFERS = 3
# A worker taking a partition reads the DLQ back from this long before the time the last
# commit recorded (``dlq_since_ms``): the clocks of the worker that sent a letter and of
# the one reading it back may differ by up to this much.
DLQ_SCAN_MARGIN_MS = 60_000
# A worker whose partitions are of another generation of its lifecycle topic than the
# topic's for this many topic checks in a row logs an error (see
# WorkerShell._check_assigned_generation); the consumer's own metadata refresh period is
# five checks.
STALE_CHECKS = 10
# A flush writes its raw events in chunks of about this many events, so that a window
# closing meanwhile waits for one chunk, not for all of them (see _write's ``hurry``).
RAW_CHUNK_EVENTS = 16_384


class WorkerShell:
    """Holds the adapters; all logic lives in the processor."""

    def __init__(self, settings: Settings, app: faust.App) -> None:
        self.settings = settings
        self.app = app
        # the spec is loaded and validated once, here (a bad spec fails at start-up)
        self.slo_factory = slo_factory(
            load_spec_file(settings.slo_spec) if settings.slo_spec is not None else None
        )
        self.processor = StreamProcessor(
            settings.lifecycle_topic,
            settings.join_config(),
            max_message_bytes=settings.max_message_bytes,
            window_config=settings.window_config(),
            clock_config=settings.clock_config(),
            slo_factory=self.slo_factory,
            keep_events=settings.store_raw_events,
            max_pending=settings.max_pending,
        )
        self.telemetry = WorkerTelemetry(
            settings.group_id,
            exporter=settings.metrics_exporter,
            interval_ms=settings.metrics_interval_ms,
            metrics_file=settings.metrics_file,
            lag=self._lag,
            pending=self.processor.pending,
            host_offsets=self.processor.host_skew_ms,
        )
        # A bad policy, spec, rule file or key config fails here, at start-up.
        self.control = ControllerShell(settings) if settings.control_enabled else None
        self.store: ClickHouseStore | None = None
        self.query_server: QueryServer | None = None
        self.metrics_server: MetricsServer | None = None
        self.dlq: DeadLetterSink | None = None
        self.summaries: ReliableProducer | None = None
        self.ledger: LedgerPublisher | None = None
        self._records: list[RequestRecord] = []
        self._windows: list[ClosedWindow] = []
        # Windows (and corrections) taken by the flush being written: their summaries
        # are not sent yet, so they cap the clock sent to the controller too.
        self._writing: list[ClosedWindow] = []
        self._events: list[KeptMessage] = []  # lifecycle_events rows, one message each
        self._flush_lock = asyncio.Lock()
        # The flush a full buffer started (on_batch goes on meanwhile; see _flush_behind).
        self._behind: asyncio.Future[None] | None = None
        self._flush_again = False  # a closed window asked for a flush while one ran
        self._taken = asyncio.Event()  # a flush took the buffers (see _flush_behind)
        # Set when a batch closed a window, cleared as a flush starts: a live flush being
        # written leaves its remaining raw events and its commit to the next (see _write).
        self._hurry = threading.Event()
        self._yielded = False  # the last flush left its raw events to this one
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailguard-writer")
        self._committed: dict[int, int] = {}
        self._commit_floor: dict[int, int] = {}  # per partition: checkpointed at assignment
        self._progress_sent: dict[int, int] = {}
        self._timeouts_seen = (0, 0)
        self._conflicts_seen = (0, 0)  # join conflicts (before, after the record) counted
        self._seen_counts: dict[str, int] = {}
        self.write_retries = 0
        self.store_rejected = 0  # rows the store refused, sent to the DLQ
        self.rows_written = 0
        self._last_log = time.monotonic()
        # Back pressure: set while ClickHouse takes writes; while it fails, the
        # lifecycle partitions are paused and no new batch is processed.
        self._store_up = asyncio.Event()
        self._rollups_unchecked = False  # the start-up check of the rollups failed
        self._store_up.set()
        # The fetch pause wanted (store down) and the one the Kafka client has: applied
        # in order by one task (see _pause_input)
        self._fetch_paused_want = False
        self._fetch_paused_have = False
        self._fetch_task: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Set on SIGTERM/SIGINT: retry loops and waits give up at once (nothing after
        # that is committed), so the worker stops within seconds in every state.
        self.stopping = threading.Event()
        self._close_lock = threading.Lock()
        self._closed = False
        # Audit rows of published signals not yet written (control_signals, budget_events):
        # they leave only once written, so a write cancelled at stop is made by stop().
        self._audit_lock = threading.Lock()
        self._audit_control: list[ControlRow] = []
        self._audit_events: list[BudgetEventRow] = []
        self._topic_id: str | None = None  # the lifecycle topic's id, last seen (None: gone)
        self._topic_checked = False
        self._admin: Any = None
        # The lifecycle topic's id when the group last assigned partitions to this worker:
        # the generation its positions and state are of, and the only one it commits for
        # (None: unknown or gone; see _commit and check_topic).
        self._assigned_gen: str | None = None
        self._stale_checks = 0  # topic checks in a row that found another generation
        self._assignments = 0  # assignments seen (a reposition spanning one gives up)
        # Per lifecycle partition: the committed offset the last assignment resumed from
        # (set on the consumer's thread by gate_committed; absent: none, read from the
        # first offset). See _skipped_at_start.
        self._resume_at: dict[int, int] = {}
        # Per lifecycle partition being repositioned onto a new generation (see
        # _reposition): messages are dropped until the one at this offset (-1: not known
        # yet), the new generation's first, comes from the seek.
        self._barrier: dict[int, int] = {}
        self.commits_dropped = 0  # commits not made: their topic generation was gone
        # One dead letter per source position, across restarts: the positions at or after
        # the committed offset that have their letter on the DLQ (sent by this worker, or
        # found there when it took the partition); their letters are not sent again.
        self._dead_positions = DeadPositions()
        self._dead_lock = threading.Lock()  # the event loop's and the writer's letters
        self.dead_repeats = 0  # letters not sent again (their position had one)
        # Per lifecycle partition: the committed offset's metadata the assignment read
        # (set on the consumer's thread by gate_committed; None: none, or not applying).
        self._resume_meta: dict[int, CommitMeta | None] = {}

    def open(self) -> None:
        """Open the store (applying migrations) and the DLQ producer; before consuming."""
        self._admin = admin(self.settings)
        self.store = open_store(self.settings)
        migrate(self.store, self.settings.cluster, raw_ttl_days=self.settings.raw_events_ttl_days)
        # a write of windows cut short by a kill left its rollups short: set them right
        # (a store that cannot take the repair yet, full: after the first write of windows)
        try:
            check_rollups(self.store)
        except Exception as exc:
            if is_data_error(exc):
                raise
            log.warning("rollups not checked at start-up (%s): checked after a write", exc)
            self._rollups_unchecked = True
        # Tools read the embedded store through this port while the worker owns it.
        self.query_server = start_query_server(self.settings, self.store)
        self.dlq = DeadLetterSink(self.settings)
        self.summaries = ReliableProducer(self.settings, self.settings.summaries_topic, "summaries")
        self.ledger = LedgerPublisher(self.settings)
        if self.control is not None:
            self.control.load_history(self.store)
            self.control.start()
        if self.settings.prometheus_port is not None:
            state = self.control.metrics if self.control is not None else MetricsState()
            state.health = self.health
            self.metrics_server = MetricsServer(
                state, self.settings.prometheus_host, self.settings.prometheus_port
            )
        log.info(
            "worker started: %s",
            {k: v for k, v in self.settings.redacted().items() if "password" not in k},
        )

    def _lags(self, next_offsets: dict[int, int]) -> dict[int, int | None]:
        """Per partition: messages between our position and the high watermark (None: unknown)."""
        consumer = getattr(self.app, "_consumer", None)
        out: dict[int, int | None] = {}
        for p, nxt in next_offsets.items():
            hw = None
            if consumer is not None:
                try:
                    hw = consumer.highwater(TP(self.settings.lifecycle_topic, p))
                except Exception:  # not assigned any more, or not known yet
                    hw = None
            out[p] = None if hw is None else max(0, hw - nxt)
        return out

    def _lag(self) -> int:
        return sum(v or 0 for v in self._lags(self.processor.next_offsets()).values())

    def health(self) -> dict[str, float]:
        """The worker's own health for /metrics (``tailguard_worker_<name>``)."""
        c = self.processor.counters
        return {
            "consumer_lag_messages": self._lag(),
            "join_pending_requests": self.processor.pending(),
            "events_consumed": c.events,
            "rows_written": self.rows_written,
            "store_write_retries": self.write_retries,
            "store_rejected_rows": self.store_rejected,
            "store_up": 1.0 if self._store_up.is_set() else 0.0,
        }

    def _lagging(self, next_offsets: dict[int, int]) -> frozenset[int]:
        """Partitions with input still waiting (or not known to be caught up)."""
        return _lagging_of(self._lags(next_offsets))

    async def _init_partitions(self, first_offsets: dict[int, int]) -> None:
        """Start new partitions with the ledger of what the store already counts from
        the offset each resumes at (its first message here: the committed offset)."""
        assert self.store is not None
        loop = asyncio.get_running_loop()
        store, s = self.store, self.settings

        def counted() -> dict[int, dict[str, int]]:
            # this store's ledger, and the topic's (written by every worker of the group)
            memory = s.join_config().resolved_ttl_ms
            shared = read_topic_ledgers(s, first_offsets, memory)
            out = {}
            for p, first in first_offsets.items():
                out[p] = read_ledger(store, s.lifecycle_topic, p, first, memory)
                merge_versions(out[p], shared.get(p, {}))
            return out

        ledgers = await loop.run_in_executor(self._executor, counted)
        await self._read_dead_back(first_offsets)
        for p, first in first_offsets.items():
            ledger = ledgers[p]
            self.processor.init_partition(p, ledger)
            log.info(
                "partition %d: resuming at offset %d, %d requests already counted",
                p, first, len(ledger),
            )  # fmt: skip

    async def _read_dead_back(self, first_offsets: dict[int, int]) -> None:
        """New partitions, each read from ``first_offsets[p]`` on: the positions from there
        on that already have a dead letter on the DLQ (an earlier run's, sent before it
        stopped without committing them), so that re-reading them sends none again. The
        DLQ is read from the time the last commit recorded (less ``DLQ_SCAN_MARGIN_MS``);
        from its start when there is no such commit."""
        s = self.settings
        since: list[int | None] = []
        for p in first_offsets:
            meta = self._resume_meta.get(p)
            since.append(meta.dlq_since_ms if meta is not None else None)
        since_ms = None if None in since else min(x for x in since if x is not None)
        if since_ms is not None:
            since_ms = max(0, since_ms - DLQ_SCAN_MARGIN_MS)
        gen = self._topic_id
        try:
            found = await asyncio.get_running_loop().run_in_executor(
                self._executor,
                lambda: read_dead_positions(s, s.lifecycle_topic, gen, since_ms),
            )
        except Exception as exc:  # the DLQ unreadable: at worst a letter is sent twice
            log.warning("could not read the DLQ back (%s): a position may get a second letter", exc)
            return
        with self._dead_lock:
            for p in first_offsets:
                self._dead_positions.drop(p)
            for p, off, index, ts_ms in found:
                if p in first_offsets and off >= first_offsets[p]:
                    self._dead_positions.add(p, off, index, ts_ms)
        for p, first in first_offsets.items():
            n = self._dead_positions.count(p)
            if n:
                log.info(
                    "partition %d: %d positions from offset %d on already dead-lettered",
                    p, n, first,
                )  # fmt: skip

    def _send_dead(self, dead: list[DeadLetter]) -> int:
        """Send dead letters, but none for a lifecycle position that has one; the number
        sent (from the event loop and the writer thread)."""
        topic = self.settings.lifecycle_topic
        now_ms = int(time.time() * 1000)
        fresh: list[DeadLetter] = []
        with self._dead_lock:
            for d in dead:
                src = d.source
                if src.topic == topic and src.partition >= 0 and src.offset >= 0:
                    # (several events of one message may each be a letter: see
                    # dead_subposition)
                    sub = dead_subposition(d.index, d.raw)
                    if self._dead_positions.known(src.partition, src.offset, sub):
                        self.dead_repeats += 1
                        continue
                    self._dead_positions.add(src.partition, src.offset, sub, now_ms)
                fresh.append(d)
        if fresh:
            assert self.dlq is not None
            self.dlq.send_dead(fresh, topic_id=self._topic_id)
        return len(fresh)

    async def _restore_inflight(self, starts: dict[int, int]) -> None:
        """New partitions, each read from ``starts[p]`` on: the gateway.received events
        from before that offset (the commit does not wait for a lone received: it is in
        the raw events table), back into the join."""
        store, s = self.store, self.settings
        assert store is not None
        found = await asyncio.get_running_loop().run_in_executor(
            self._executor,
            lambda: read_inflight(store, s.lifecycle_topic, starts, s.inflight_ttl_ms),
        )
        for p, rows in found.items():
            events = [(off, EVENT_ADAPTER.validate_json(payload)) for off, payload in rows]
            n = self.processor.restore_inflight(p, events)
            log.info("partition %d: %d in-flight requests restored from the store", p, n)
        for p, off in starts.items():
            # A restored received that meets its partner would pull the commit back to
            # its own offset: it is durable, so commits never go below where reading began.
            self._commit_floor[p] = off

    def _collect(self, out: Output) -> None:
        self._records.extend(out.records)
        self._windows.extend(out.windows)
        # The payload is the event's bytes as the producer sent them (no re-encoding).
        self._events.extend(out.kept)
        if out.dead:
            self.telemetry.dead_letters.add(self._send_dead(out.dead))

    async def on_batch(self, messages: list[tuple[int, int, bytes]]) -> None:
        self._raise_failed_flush()
        await self._store_up.wait()  # back pressure: hold this batch while the store is down
        if self._barrier:
            messages = self._past_barrier(messages)
            if not messages:
                return
        new: dict[int, int] = {}
        for p, off, _ in messages:
            if not self.processor.has_partition(p) and p not in new:
                new[p] = off
        if new:
            skipped = await self._skipped_at_start(new)
            if skipped:
                messages = [m for m in messages if m[0] not in skipped]
                new = {p: o for p, o in new.items() if p not in skipped}
        if new:
            await self._init_partitions(new)
            if self.settings.store_raw_events:
                starts: dict[int, int] = {}
                for p, off, _ in messages:
                    if p in new:
                        starts.setdefault(p, off)
                await self._restore_inflight(starts)
        before = self.processor.counters.events
        last: dict[int, int] = {}
        for p, off, _ in messages:
            last[p] = off + 1
        out = self.processor.process(messages, int(time.time() * 1000), self._lagging(last))
        self.telemetry.messages.add(len(messages))
        self.telemetry.events.add(self.processor.counters.events - before)
        self._collect(out)
        # A window that closed is written now, not at the next timer flush: its final
        # summary and the close horizon after it are what let the controller decide on
        # the window ending now (DecisionClock: budgets read the final windows).
        closed = any(not w.correction for w in out.windows)
        if closed or len(self._records) >= self.settings.flush_max_rows:
            await self._flush_behind(closed)

    async def _flush_behind(self, closed: bool = False) -> None:
        """A full buffer (or a ``closed`` window): start its flush and return, so that the
        next batches are processed while the writer thread writes this one (the flush
        snapshots its rows and offsets before its first wait, so what it commits is what
        it writes, as with the timer's flush). One flush at a time: while one runs, a
        closed window or a full buffer asks for another right after it (the chain), and
        the batch goes on; only a buffer at ``BEHIND_BUFFERS`` x ``flush_max_rows`` waits,
        until a flush has taken it (memory stays bounded: that much buffered, plus the
        snapshot being written). A failed flush is raised by the next batch or flush.

        Measured (one worker catching up 3 M events, flush_max_rows 20,000): when every
        buffer that filled during a flush waited for it, the event loop waited 12-15 s of
        a ~75 s run (~20 %), the writer busy and one core idle meanwhile."""
        running = self._behind
        if closed:
            # A flush being written lets the one with this window go first (one follows:
            # the chain's next one, or the one started below; each clears it as it starts).
            self._hurry.set()
        if running is not None and not running.done():
            self._flush_again = True
            if len(self._records) < BEHIND_BUFFERS * self.settings.flush_max_rows:
                return
            self._taken.clear()
            taken: asyncio.Future[Any] = asyncio.ensure_future(self._taken.wait())
            try:
                await asyncio.wait((taken, running), return_when=asyncio.FIRST_COMPLETED)
            finally:
                taken.cancel()
            if not running.done():
                return  # a flush of the chain took the buffer; it writes it next
        if running is not None:
            self._behind = None
            await running  # (done: raises its failure)
            if len(self._records) < self.settings.flush_max_rows and not closed:
                return
        self._behind = task = asyncio.ensure_future(self._flush_chain())
        task.add_done_callback(_note_abandoned)

    async def _flush_chain(self) -> None:
        """A flush, and another right after it while a closed window or a full buffer
        asked for one."""
        self._flush_again = False
        await self.flush_and_commit()
        while self._flush_again:
            self._flush_again = False
            await self.flush_and_commit()

    def _raise_failed_flush(self) -> None:
        """A flush started by a full buffer that failed fails the next batch or flush
        (before anything else is committed), as when on_batch awaited it."""
        done = self._behind
        if done is not None and done.done():
            self._behind = None
            if not done.cancelled():
                done.result()

    def abandon_flush(self) -> None:
        """The lifecycle agent stops: a flush it started stops with it (as the timer's
        does when Faust stops the timer); what it had not committed is replayed."""
        if self._behind is not None:
            self._behind.cancel()
            self._behind = None

    def _write(
        self,
        records: list[RequestRecord],
        windows: list[ClosedWindow],
        events: list[KeptMessage],
        checkpoints: list[Checkpoint],
        through: dict[int, int],
        *,
        hurry: threading.Event | None = None,
    ) -> tuple[int, list[KeptMessage]]:
        """All writes of one flush, in order; runs on the writer thread. Returns the
        retries and the raw events left to the next flush (see ``hurry``).

        Request rows first, then the closed windows with their ledger, final summaries
        and close horizons, then the raw events (the largest write) and checkpoints.
        Rows before windows: the ledger a window publishes tells the next owner of the
        partition that its requests are counted, and a complete one is then taken for a
        duplicate when re-read (its record never comes out again), so its row must be
        in the store before the ledger says so (a stop between the two writes lost the
        rows otherwise). Windows before raw events: the controller decides on a window
        as soon as its summary is out. Nothing is committed before every write
        succeeded; a worker dying in between leaves rows that the next owner writes
        again (ReplacingMergeTree) and windows it counts once (the ledger).

        ``hurry`` (given to a live worker's flush; set by the event loop when a batch
        closed a window while the flush runs): the raw events are written in chunks
        (else in one write), and once it is set the rest of them and the checkpoints
        are left to the next flush, which writes them after its own windows and commits
        for both (this flush commits nothing). The controller's decision on the window
        ending now waits for the window closing now to be stored, and the raw events
        are most of a flush: the window waited for them, up to ~0.5 s, before. A flush
        that was left raw events does not leave them again.
        """
        assert self.store is not None
        store, s = self.store, self.settings
        retries = 0
        if records:
            retries += self._write_rows(
                lambda rows: write_requests(store, rows), records, "write of records",
                lambda rec, why: dataclasses.replace(
                    _record_dead_letter(rec, s.lifecycle_topic), reason=why
                ),
            )  # fmt: skip
        if windows:
            acc = s.window_config().relative_accuracy
            token = f"{s.group_id}/{s.lifecycle_topic}/{uuid.uuid4().hex}"  # same on every retry
            # a failed attempt may have landed in window_sketches and not in every view:
            # the rollups of its hours are set right once it succeeded
            retries += write_windows_repairing(
                store, windows, s.lifecycle_topic, acc, token, through_offsets=through,
                retry=self._retry,
            )  # fmt: skip
            if self._rollups_unchecked:  # the start-up check, put off (see open)
                retries += self._retry(lambda: check_rollups(store), "check of rollups")
                self._rollups_unchecked = False
            # Workers with their own stores learn from the topic what this one counted.
            assert self.ledger is not None
            self.ledger.publish(windows, through)  # acknowledged below, before the commit
        # The controller hears of a window once it is stored (at least once: it dedups).
        assert self.summaries is not None
        for win in windows:
            cid = uuid.uuid4().hex[:16] if win.correction else None
            summary = summarize(win, s.window_config().relative_accuracy, correction_id=cid)
            self.summaries.send(encode_summary(summary))
        for c in checkpoints:
            if self._progress_sent.get(c.partition) != c.close_horizon_ms:
                self.summaries.send(encode_summary(Progress(c.partition, c.close_horizon_ms)))
                self._progress_sent[c.partition] = c.close_horizon_ms
        self.summaries.flush(self.stopping)
        if windows:
            # The ledger went out with the summaries (one round trip for both, not two
            # in a row before the controller hears of the windows); it is acknowledged
            # before anything is committed.
            assert self.ledger is not None
            self.ledger.flush()
        # Their final summaries are out: they no longer cap the provisional clocks (see
        # send_provisional; one assignment, read on the event loop).
        self._writing = []
        if windows:
            self._provisional_soon()
        topic = s.lifecycle_topic
        # One write when nothing can hurry it (fewer parts to merge).
        per_write = RAW_CHUNK_EVENTS if hurry is not None else sys.maxsize
        for start, end in raw_chunks(events, per_write):
            if hurry is not None and hurry.is_set():
                return retries, events[start:]
            n, rejected = write_raw_isolating(store, topic, events[start:end], retry=self._retry)
            retries += n
            self._dead_rows([_event_dead_letter(topic, kept, why) for kept, why in rejected])
        # Only after the windows: a horizon never runs ahead of what is stored.
        retries += self._retry(
            lambda: write_checkpoints(store, s.group_id, s.lifecycle_topic, checkpoints),
            "write of checkpoints",
        )
        return retries, []

    # --- failures: outages retried, rejected rows dead-lettered, stop honoured ---------

    def _sleep(self, delay_s: float) -> None:
        """The retry backoff; gives up at once when the worker is stopping."""
        if self.stopping.wait(delay_s):
            raise ShuttingDownError("stopping during a write retry")

    def _retry(self, fn: Any, what: str) -> int:
        """One write, retried with backoff through an outage (input paused meanwhile);
        a data error is raised at once (see :meth:`_write_rows`)."""
        if self.stopping.is_set():
            raise ShuttingDownError(f"stopping before the {what}")
        return with_retry(
            fn, what, on_failure=self._on_write_failure, sleep=self._sleep, fatal=is_data_error
        )

    def _write_rows(self, write: Any, rows: list[Any], what: str, to_dead: Any) -> int:
        """Write rows; those the store rejects for their values are isolated (the batch is
        split) and sent to the DLQ with the store's reason; the rest is written."""
        retries, rejected = write_isolating(write, rows, what, retry=self._retry)
        self._dead_rows([to_dead(row, reason) for row, reason in rejected])
        return retries

    def _dead_rows(self, dead: list[DeadLetter]) -> None:
        """Rows the store refused, to the DLQ (counted)."""
        if dead:
            self.telemetry.dead_letters.add(self._send_dead(dead))
            self.store_rejected += len(dead)

    async def flush_and_commit(self, may_yield: bool = True) -> None:
        """Write what is buffered and commit the offsets it covers. ``may_yield``: the
        flush may leave its raw events and commit to the next flush when a window
        closes meanwhile (see :meth:`_write`); never twice in a row."""
        async with self._flush_lock:
            self._raise_failed_flush()
            lags = self._lags(self.processor.next_offsets())
            lagging = _lagging_of(lags)
            # Only live, within a batch of the input's end: catching up, windows close
            # at most batches and nobody waits on a decision yet (the chunks and the
            # extra flushes cost ~9 % of the rate there, measured).
            known = [lag for lag in lags.values() if lag is not None]
            live = len(known) == len(lags) and sum(known) <= self.settings.take_max_messages
            hurry = self._hurry if may_yield and live and not self._yielded else None
            self._hurry.clear()
            self._collect(self.processor.tick(int(time.time() * 1000), lagging))
            # Snapshot offsets, horizons and buffers together: nothing processed
            # after this point is covered by the commit below, which is made only for
            # the topic generation these offsets were read from.
            generation = self._assigned_gen
            offsets = self._floored(self.processor.safe_offsets())
            through = self.processor.next_offsets()
            horizons = self.processor.horizons()
            marks = self.processor.watermarks()
            late = self.processor.lateness_by_partition()
            checkpoints = [
                Checkpoint(p, horizons[p], marks.get(p, 0), o, *late.get(p, (0, 0, 0)))
                for p, o in offsets.items()
            ]
            records, self._records = self._records, []
            windows, self._windows = self._windows, []
            events, self._events = self._events, []
            self._taken.set()  # a batch waiting on a full buffer goes on
            loop = self._loop = asyncio.get_running_loop()
            left: list[KeptMessage] = []
            if records or windows or events or checkpoints:
                t0 = time.perf_counter()
                self._writing = windows
                try:
                    write = functools.partial(self._write, hurry=hurry)
                    retries, left = await loop.run_in_executor(
                        self._executor, write, records, windows, events, checkpoints, through
                    )
                finally:
                    self._writing = []
                self._resume_input()
                self.telemetry.write_duration.record((time.perf_counter() - t0) * 1000)
                self.telemetry.write_retries.add(retries)
                self.telemetry.records.add(len(records))
                self.telemetry.record_latencies(records)
                self.telemetry.windows_closed.add(len(windows))
                self.write_retries += retries
                self.rows_written += len(records)
            self._yielded = bool(left)
            if left:
                # A window closed meanwhile: the next flush (at once) writes its windows,
                # then these raw events before its own, and commits for both.
                self._events[:0] = left
                return
            assert self.dlq is not None
            await loop.run_in_executor(self._executor, self.dlq.flush, self.stopping)
            changed = {p: o for p, o in offsets.items() if self._committed.get(p) != o}
            if changed:
                await self._commit(changed, generation)
            self._count_timeouts()
            self._maybe_log()

    async def _commit(self, offsets: dict[int, int], generation: str | None) -> None:
        """Commit ``offsets`` of the lifecycle topic, read from its generation ``generation``
        (topic id; None: gone), once, with the id in the commit's metadata.

        Never for a generation that is gone: dropped when the topic's id is not
        ``generation`` (the one the group's last assignment was made on) just before the
        commit; and not retried when the broker does not know the topic (a
        retried commit of the old offsets was accepted once the topic existed again, and
        the group read the new topic from them). A commit that fails is not retried
        either: the next flush commits again, from its own snapshot. Should a commit
        still land on a new generation (deleted and created again within its round
        trip), its metadata names the old id and the assignment ignores it (see
        :meth:`gate_committed`)."""
        topic = self.settings.lifecycle_topic
        if generation is None:
            self._drop_commit(offsets, generation, self._topic_id)
            return
        try:
            current = await asyncio.to_thread(topic_id, self._admin, topic)
        except Exception as exc:
            log.warning("commit deferred: topic %s's id could not be read (%s)", topic, exc)
            return
        if current != generation:
            self._drop_commit(offsets, generation, current)
            return
        if self.stopping.is_set():
            return  # nothing is committed after a stop signal
        thread: _ConsumerThread = self.app.consumer._thread  # type: ignore[attr-defined]
        now_ms = int(time.time() * 1000)
        with self._dead_lock:
            since = {p: self._dead_positions.scan_from_ms(p, o, now_ms) for p, o in offsets.items()}
        tagged = {
            TP(topic, p): (o, commit_metadata(CommitMeta(generation, since[p])))
            for p, o in offsets.items()
        }
        try:
            done = await thread.commit_tagged(tagged)
        except aiokafka_errors.UnknownTopicOrPartitionError:
            self._drop_commit(offsets, generation, None)
            return
        except (aiokafka_errors.KafkaError, aiokafka_errors.IllegalStateError) as exc:
            log.warning("commit of %s failed (%r): the next flush commits again", offsets, exc)
            return
        self._committed.update({p: o for p, o in offsets.items() if p in done})
        with self._dead_lock:
            for p in done:
                self._dead_positions.committed(p, offsets[p])

    def _drop_commit(self, offsets: dict[int, int], was: str | None, now: str | None) -> None:
        self.commits_dropped += 1
        log.warning(
            "commit of %s dropped: read from topic %s's generation %s, which is gone "
            "(current: %s)",
            offsets, self.settings.lifecycle_topic, was, now,
        )  # fmt: skip

    async def gate_committed(self, asked: Any, offsets: dict[Any, Any]) -> dict[Any, Any]:
        """The committed offsets the consumer fetched (``{TopicPartition:
        OffsetAndMetadata}``), without those of the lifecycle topic made for another
        generation of it: such a partition is read from its first offset (the reset
        policy's ``earliest``). Runs on the consumer's thread, on every fetch of committed
        offsets (assignment, seek to committed)."""
        topic = self.settings.lifecycle_topic
        ours = {tp: om for tp, om in offsets.items() if tp.topic == topic}
        for tp in asked:  # those without a commit are read from the first offset
            if tp.topic == topic and tp not in ours:
                self._resume_at.pop(tp.partition, None)
        if not ours:
            return offsets
        loop = asyncio.get_running_loop()
        try:
            current = await loop.run_in_executor(None, topic_id, self._admin, topic)
        except Exception as exc:  # retriable: the consumer asks again
            raise aiokafka_errors.RequestTimedOutError(
                f"topic {topic}'s id could not be read: {exc}"
            ) from exc
        out = dict(offsets)
        for tp, om in ours.items():
            applies = commit_applies(om.metadata, current)
            self._resume_meta[tp.partition] = (
                parse_commit_metadata(om.metadata) if applies else None
            )
            if applies:
                self._resume_at[tp.partition] = om.offset
            else:
                self._resume_at.pop(tp.partition, None)
            if not applies:
                meta = parse_commit_metadata(om.metadata)
                log.warning(
                    "partition %d: committed offset %d belongs to topic %s's generation %s, "
                    "not to the current one (%s): reading it from its first offset",
                    tp.partition, om.offset, topic, meta.topic_id if meta else None, current,
                )  # fmt: skip
                del out[tp]
        return out

    def _floored(self, offsets: dict[int, int]) -> dict[int, int]:
        """Commits never move back: a request whose lone received was skipped by an earlier
        commit (durable in the raw events, restored on a restart) and has now met its
        partner must not pull the commit back to the received's offset."""
        floor = self._commit_floor
        for p, o in offsets.items():
            f = max(floor.get(p, 0), self._committed.get(p, 0))
            if o < f:
                offsets[p] = f
        return offsets

    def _on_write_failure(self, _exc: Exception) -> None:
        """A write failed (on the writer thread; it retries with backoff): pause the input."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._pause_input)

    def _lifecycle_tps(self) -> set[TP]:
        topic = self.settings.lifecycle_topic
        return {tp for tp in self.app.consumer.assignment() if tp.topic == topic}

    def _pause_input(self) -> None:
        """Store down: stop fetching the lifecycle partitions and hold new batches, so that
        memory stays at what was in flight; the offsets stay at what was written.

        The fetch is paused in the Kafka client (aiokafka's ``pause``), not in Faust's set
        of active partitions: Faust drops the records of a partition it no longer counts
        active from a fetch it is handing over, after the client has moved its position
        past them, so a pause and resume in quick succession lost messages whose offsets
        a later commit covered (a store failing on and off: 5,276 of 45,000 requests), or
        left the input stalled. The client's pause returns nothing more of a paused
        partition and refetches from its position on resume."""
        if not self._store_up.is_set():
            return
        self._store_up.clear()
        self._want_fetch_paused(True)
        log.warning("ClickHouse writes failing: lifecycle input paused until a write succeeds")

    def _resume_input(self) -> None:
        if self._store_up.is_set():
            return
        self._want_fetch_paused(False)
        self._store_up.set()
        log.warning("ClickHouse writes succeed again: lifecycle input resumed")

    def _want_fetch_paused(self, paused: bool) -> None:
        self._fetch_paused_want = paused
        if self._fetch_task is None or self._fetch_task.done():
            self._fetch_task = asyncio.ensure_future(self._apply_fetch_pause())
            self._fetch_task.add_done_callback(_log_fetch_pause_failure)

    async def _apply_fetch_pause(self) -> None:
        """Bring the Kafka client's pause to what is wanted, in order (one task)."""
        thread = getattr(self.app.consumer, "_thread", None)
        while self._fetch_paused_have != self._fetch_paused_want:
            want = self._fetch_paused_want
            tps = self._lifecycle_tps()
            if thread is not None:

                async def apply(pause: bool = want, tps: set[TP] = tps) -> None:
                    from aiokafka.structs import TopicPartition

                    client = thread._ensure_consumer()
                    if pause:
                        owned = client.assignment()
                        parts = [TopicPartition(tp.topic, tp.partition) for tp in tps]
                        client.pause(*[p for p in parts if p in owned])
                    else:  # every paused one: an assignment may have changed meanwhile
                        client.resume(*client.paused())

                await thread.call_thread(apply)
            self._fetch_paused_have = want

    def _count_timeouts(self) -> None:
        j = self.processor.join_counters()
        gw, en = self._timeouts_seen
        if j.gateway_only > gw:
            self.telemetry.join_timeouts.add(j.gateway_only - gw, {"side": "gateway_only"})
        if j.engine_only > en:
            self.telemetry.join_timeouts.add(j.engine_only - en, {"side": "engine_only"})
        self._timeouts_seen = (j.gateway_only, j.engine_only)
        before, after = j.conflicts - j.conflicts_corrected, j.conflicts_corrected
        seen_before, seen_after = self._conflicts_seen
        if before > seen_before:
            self.telemetry.join_conflicts.add(before - seen_before, {"when": "before_record"})
        if after > seen_after:
            self.telemetry.join_conflicts.add(after - seen_after, {"when": "after_record"})
        self._conflicts_seen = (before, after)
        w = self.processor.window_counters()
        c = self.processor.counters
        for name, value in (
            ("corrected", w.corrected),
            ("retracted", w.retracted),
            ("quarantined", c.quarantined),
            ("replayed", c.replayed),
            ("counted_before", c.beyond_memory),
        ):
            seen = self._seen_counts.get(name, 0)
            if value > seen:
                self.telemetry.lateness.add(value - seen, {"kind": name})
                self._seen_counts[name] = value

    def _maybe_log(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_log < 10 and not force:
            return
        self._last_log = now
        c = self.processor.counters
        j = self.processor.join_counters()
        w = self.processor.window_counters()
        log.info(
            "messages=%d events=%d records=%d rows_written=%d dead_letters=%d pending=%d "
            "joined=%d gateway_only=%d engine_only=%d duplicates=%d conflicts=%d "
            "windows_closed=%d "
            "corrected=%d retracted=%d quarantined=%d replayed=%d counted_before=%d flagged=%d "
            "write_retries=%d",
            c.messages, c.events, c.records, self.rows_written, c.dead_letters,
            self.processor.pending(), j.joined, j.gateway_only, j.engine_only, j.duplicates,
            j.conflicts, w.windows_closed, w.corrected, w.retracted, c.quarantined, c.replayed,
            c.beyond_memory, c.flagged, self.write_retries,
        )  # fmt: skip
        skew = {h: d for h, d in self.processor.host_skew_ms().items() if abs(d) >= 60_000}
        if skew:
            log.warning("hosts whose clocks stand apart from their partitions (ms): %s", skew)

    async def on_stats(self, messages: list[tuple[int, int, bytes]]) -> None:
        """Forward engine.stats to the controller (one topic for all it needs)."""
        assert self.summaries is not None
        dead = False
        for p, off, raw in messages:
            decoded = decode_message(
                raw,
                SourceRef(self.settings.engine_stats_topic, p, off),
                max_bytes=self.settings.max_message_bytes,
            )
            for ev in decoded.events:
                if isinstance(ev, EngineStats):
                    self.summaries.send(encode_summary(StatsSample.of(ev)))
            if decoded.dead:
                assert self.dlq is not None
                self.dlq.send_dead(decoded.dead)
                self.telemetry.dead_letters.add(len(decoded.dead))
                dead = True
        if dead:
            # Faust commits this topic's offsets once the batch returns: the dead letters
            # must be acknowledged by the DLQ first (not on the writer thread, which a
            # store outage may hold).
            assert self.dlq is not None
            await asyncio.get_running_loop().run_in_executor(None, self.dlq.flush, self.stopping)

    def _provisional_soon(self) -> None:
        """From the writer thread, once closed windows are stored and summarized: the
        controller gets the clocks they were capping at once (on the event loop, in
        order with the timer's snapshots), not at the next ``control_provisional_ms``
        tick, which added up to that long to every decision."""
        loop = self._loop
        s = self.settings
        if loop is not None and s.control_enabled and s.control_provisional_ms > 0:
            loop.call_soon_threadsafe(self._send_provisional)

    async def send_provisional(self) -> None:
        """The ``control_provisional_ms`` timer's call (see :meth:`_send_provisional`)."""
        self._send_provisional()

    def _send_provisional(self) -> None:
        """Snapshots of ended, still-open windows + each partition's clock, to the controller.

        Lets it decide a few hundred ms after a window ends instead of after the grace
        period (``control_provisional_ms``). A partition's clock is capped at the start
        of its earliest window (or correction) that is closed but not yet written,
        including those of the write in progress (its summary follows the write), so
        the controller never decides past a window or a correction it lacks.
        """
        if self.summaries is None:
            return
        acc = self.settings.window_config().relative_accuracy
        snaps, clocks = self.processor.provisional()
        for win in snaps:
            self.summaries.send(encode_summary(summarize(win, acc, final=False)))
        unwritten: dict[int, int] = {}
        for win in (*self._windows, *self._writing):
            unwritten[win.partition] = min(unwritten.get(win.partition, win.start_ms), win.start_ms)
        for p, clock in clocks.items():
            capped = min(clock, unwritten.get(p, clock))
            self.summaries.send(encode_summary(Progress(p, self._progress_sent.get(p, 0), capped)))

    async def on_summaries(self, raws: list[bytes]) -> None:
        """The controller's input (this worker owns the summaries partition)."""
        if self.control is None:
            return
        control_rows, event_rows = self.control.on_summaries(raws)
        await self._audit(control_rows, event_rows)

    async def on_heartbeat(self) -> None:
        if self.control is not None:
            await self._audit(self.control.heartbeats(), [])

    async def _audit(
        self, control_rows: list[ControlRow], event_rows: list[BudgetEventRow]
    ) -> None:
        if not control_rows and not event_rows:
            return
        assert self.control is not None
        control = self.control
        with self._audit_lock:
            self._audit_control.extend(control_rows)
            self._audit_events.extend(event_rows)

        def write() -> int:
            control.flush()  # the audit says what was delivered
            return self._write_audit()

        retries = await asyncio.get_running_loop().run_in_executor(self._executor, write)
        self.telemetry.write_retries.add(retries)

    def _write_audit(self, attempts: int | None = None) -> int:
        """Write the pending audit rows (every signal published so far whose rows are not
        written). A write that fails, gives up at stop, or is cancelled before it ran
        (the controller agent stopped while the write waited for the writer thread)
        leaves its rows pending: :meth:`stop` writes them."""
        assert self.store is not None
        store = self.store
        with self._audit_lock:
            control_rows, event_rows = self._audit_control, self._audit_events
            self._audit_control, self._audit_events = [], []
        if not control_rows and not event_rows:
            return 0
        try:
            return with_retry(
                lambda: write_audit(store, control_rows, event_rows),
                "write of the control audit",
                attempts=attempts,
                sleep=self._sleep,
            )
        except BaseException:
            with self._audit_lock:
                self._audit_control[:0] = control_rows
                self._audit_events[:0] = event_rows
            raise

    async def check_topic(self) -> None:
        """Notice the lifecycle topic being deleted, or deleted and created again (its id
        changes): log an error, drop the state built from the old topic (its offsets mean
        nothing in the new one) and make the consumer fetch metadata again, so that the
        group rebalances onto the new topic and reads it from its first offset."""
        topic = self.settings.lifecycle_topic
        if self._admin is None:
            self._admin = admin(self.settings)
        try:
            now = await asyncio.to_thread(topic_id, self._admin, topic)
        except Exception:  # broker unreachable: nothing to conclude
            return
        before, self._topic_id = self._topic_id, now
        first, self._topic_checked = not self._topic_checked, True
        self._check_assigned_generation(now)
        if first or before == now:
            return
        parts = sorted(self.processor.next_offsets())
        if now is None:
            log.error(
                "lifecycle topic %s was deleted: dropped the state of partitions %s; "
                "waiting for it to be created again",
                topic, parts,
            )  # fmt: skip
        else:
            log.error(
                "lifecycle topic %s was created again (id %s -> %s): resubscribing, "
                "reading it from its first offset",
                topic, before, now,
            )  # fmt: skip
        if now is not None and now == self._assigned_gen:
            # The consumer saw it first: the group was assigned the new topic (the state
            # of the old one dropped at the revocation before, the positions from the
            # gated committed offsets), and reads it from its first offset already.
            return
        # Records completed from the old topic are kept (written at the next flush);
        # pending joins and open windows of it are dropped. Nothing is committed until
        # the worker reads the new topic (the commits name the generation of the last
        # assignment, see _commit): the rebalance the metadata change makes fetches the
        # committed offsets again (the gate drops the old generation's), and Faust
        # discards what was fetched before it; a consumer that saw no change is moved
        # to the new topic's first offsets (_reposition).
        self._drop_topic_state(parts)
        self._refresh_metadata()
        if now is not None:
            await self._reposition(now, parts)

    def _drop_topic_state(self, parts: list[int]) -> None:
        self._resume_at.clear()  # the old generation's commits
        self.processor.revoke(parts)
        for p in parts:
            self._committed.pop(p, None)
        self._commit_floor.clear()
        with self._dead_lock:  # positions of the old generation (the new one's: read back)
            self._dead_positions.clear()

    async def _skipped_at_start(self, first: dict[int, int]) -> set[int]:
        """Partitions whose first message read (``first[p]``, as this worker starts them)
        lies past where reading starts: the committed offset the assignment resumed from
        (``_resume_at``, set by the gate), else the partition's first offset. Those are
        moved back there (their messages until then dropped, see ``_barrier``).

        Faust's fetch loop drops records it fetched while the group's generation changed
        (``Consumer.getmany``: "Cancelling getmany"), and seeks back only to a committed
        offset: a partition without one (a topic created again) lost its first messages
        that way (1 of 2 runs of ``test_fault_topic_cycles.py``: 3-4 messages)."""
        topic = self.settings.lifecycle_topic
        tps = [TP(topic, p) for p in first]
        try:
            earliest = await self.app.consumer.earliest_offsets(*tps)
        except Exception as exc:  # nothing to compare with: go on
            log.warning("could not read the first offsets of %s: %s", sorted(first), exc)
            return set()
        back: dict[Any, int] = {}
        for tp in tps:
            p = tp.partition
            start = max(self._resume_at.get(p) or 0, int(earliest.get(tp) or 0))
            if first[p] > start:
                back[tp] = start
        if not back:
            return set()
        log.warning(
            "messages skipped by the consumer at the start of partitions %s (first read "
            "%s): reading them again from %s",
            sorted(tp.partition for tp in back), {tp.partition: first[tp.partition] for tp in back},
            {tp.partition: o for tp, o in back.items()},
        )  # fmt: skip
        self._barrier.update({tp.partition: o for tp, o in back.items()})
        try:
            await self.app.consumer.seek_wait(back)
        except Exception:
            log.exception("could not seek back: restart the worker to read them")
            for tp in back:
                self._barrier.pop(tp.partition, None)
            return set()
        return {tp.partition for tp in back}

    def _past_barrier(self, messages: list[tuple[int, int, bytes]]) -> list[tuple[int, int, bytes]]:
        """``messages`` without those of partitions being repositioned that came before
        the one at the new generation's first offset (fetched from the old positions)."""
        barrier = self._barrier
        out = []
        for m in messages:
            p, off = m[0], m[1]
            if p in barrier:
                if off != barrier[p]:
                    continue
                del barrier[p]
            out.append(m)
        return out

    async def _reposition(self, gen: str, parts: list[int]) -> None:
        """The topic is the generation ``gen`` and the consumer still holds its partitions
        from the old one, at the old positions (it did not notice: deleted and created
        again between two of its metadata refreshes, as many partitions). Seek them to
        the new generation's first offsets; messages fetched from the old positions are
        dropped until the seek's first one comes (``_barrier``); the generation is then
        the one commits are made for. The state was dropped before (``parts``). A
        rebalance meanwhile does all this itself: this gives up."""
        tps = sorted(self._lifecycle_tps())
        if not tps:
            return
        self._barrier.update(dict.fromkeys((tp.partition for tp in tps), -1))
        self._drop_topic_state(sorted(set(parts) | set(self.processor.next_offsets())))
        assignments = self._assignments
        consumer = self.app.consumer
        try:
            first = await consumer.earliest_offsets(*tps)
            if self._assignments != assignments:
                return
            targets = {tp: int(first.get(tp) or 0) for tp in tps}
            self._barrier.update({tp.partition: o for tp, o in targets.items()})
            await consumer.seek_wait(targets)
        except Exception:
            log.exception(
                "could not seek to the new topic's first offsets: nothing is committed; "
                "restart the worker to read the topic from its first offset"
            )
            self._barrier.clear()
            return
        if self._assignments != assignments:
            return
        self._assigned_gen = gen
        log.error(
            "lifecycle topic %s: the consumer had not noticed generation %s; its partitions "
            "are read from their first offsets %s",
            self.settings.lifecycle_topic, gen, {tp.partition: o for tp, o in targets.items()},
        )  # fmt: skip

    def _check_assigned_generation(self, now: str | None) -> None:
        """The consumer holds lifecycle partitions of a generation that is not the topic's
        (it did not notice the change: the topic deleted and created again between two
        of its metadata refreshes, with as many partitions) for ``STALE_CHECKS`` checks
        in a row, although check_topic moved it (_reposition failed): log an error.
        Nothing is committed meanwhile (the commits name the assigned generation), so a
        restart reads the new topic from its first offset.

        (Forcing a rejoin at every change was tried instead of _reposition: in one of
        two 10-cycle runs of ``test_fault_topic_cycles.py``, 16 requests of a new
        generation were taken for duplicates and never stored; not understood yet.)"""
        held = now is not None and self._assigned_gen != now and bool(self._lifecycle_tps())
        self._stale_checks = self._stale_checks + 1 if held else 0
        if self._stale_checks == STALE_CHECKS:
            log.error(
                "lifecycle topic %s is generation %s, but this worker's partitions were "
                "assigned on %s and no rebalance came: nothing is committed; restart the "
                "worker to read the topic from its first offset",
                self.settings.lifecycle_topic, now, self._assigned_gen,
            )  # fmt: skip

    async def on_assigned(self) -> None:
        """The group assigned partitions (positions from the committed offsets, through
        :meth:`gate_committed`): they are of the topic's generation now, the one the
        commits name from here on."""
        try:
            gen = await asyncio.to_thread(topic_id, self._admin, self.settings.lifecycle_topic)
        except Exception as exc:  # nothing committed until the next assignment
            log.warning("could not read the lifecycle topic's id at the assignment: %s", exc)
            gen = None
        if gen != self._assigned_gen:
            log.info("partitions assigned on the lifecycle topic's generation %s", gen)
        self._assigned_gen = gen
        self._stale_checks = 0
        self._assignments += 1
        self._barrier.clear()  # Faust dropped what was fetched before the assignment

    def _refresh_metadata(self) -> None:
        """Ask the consumer for fresh metadata now (a changed topic makes it rejoin)."""
        try:
            thread = self.app.consumer._thread  # type: ignore[attr-defined]  # faust's aiokafka driver
            consumer = thread._ensure_consumer()
            thread.thread_loop.call_soon_threadsafe(consumer._client.force_metadata_update)
        except Exception as exc:  # a newer Faust: the metadata refresh period still applies
            log.warning("could not refresh the consumer's metadata (%s)", exc)

    async def on_revoked(self, revoked: set[TP]) -> None:
        parts = [tp.partition for tp in revoked if tp.topic == self.settings.lifecycle_topic]
        # Write what is complete (idempotent), then forget the handed-away state.
        await self.flush_and_commit(may_yield=False)
        self.processor.revoke(parts)
        for p in parts:
            self._committed.pop(p, None)
            self._commit_floor.pop(p, None)
        with self._dead_lock:  # the next owner reads them back from the DLQ
            for p in parts:
                self._dead_positions.drop(p)
        for p in parts:
            self._barrier.pop(p, None)

    async def stop(self) -> None:
        """Write buffered records (idempotent) and the audit rows of the signals
        published. No commit and no windows: the consumer is gone by now; the next
        owner replays from the committed offset."""
        self.stopping.set()
        self.abandon_flush()
        try:
            self._final_writes()
        finally:
            self._close()

    def _final_writes(self) -> None:
        try:
            batch, self._records = self._records, []
            if batch and self.store is not None:
                store = self.store
                write_isolating(
                    lambda rows: write_requests(store, rows), batch, "final write of records",
                    retry=lambda fn, what: with_retry(fn, what, attempts=1, fatal=is_data_error),
                )  # fmt: skip
                self.rows_written += len(batch)
        except (StoreError, ShuttingDownError) as exc:
            log.warning("buffered records not written at stop (the next owner replays): %s", exc)
        try:
            if self.store is not None:
                # The audit of signals already published (their write may have been
                # cancelled with the controller agent, or given up at the signal).
                self._write_audit(attempts=1)
        except (StoreError, ShuttingDownError) as exc:
            log.warning("control audit rows not written at stop: %s", exc)

    def _close(self) -> None:
        """Release everything (once: the stop watchdog may get here first)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._executor.shutdown(wait=True)
            for producer in (self.dlq, self.summaries):
                if producer is not None:
                    producer.abandon()
            if self.query_server is not None:
                self.query_server.stop()
            if self.metrics_server is not None:
                self.metrics_server.close()
            if self.control is not None:
                self.control.close()
            if self.store is not None:
                self.store.close()
            self._maybe_log(force=True)
            self.telemetry.shutdown()

    def begin_stop(self) -> None:
        """A stop signal arrived: retry loops and waits give up at once, nothing more is
        committed (from the stop thread, the moment the signal arrives; idempotent)."""
        if not self.stopping.is_set():
            self.stopping.set()
            log.info(
                "stop signal: stopping (writes in progress give up; nothing more is committed)"
            )

    def stop_overdue(self, close_grace_s: float = CLOSE_GRACE_S) -> None:
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
        closer = threading.Thread(target=self._close, name="tailguard-close", daemon=True)
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


def _lagging_of(lags: dict[int, int | None]) -> frozenset[int]:
    return frozenset(p for p, lag in lags.items() if lag is None or lag > 0)


def raw_chunks(kept: Sequence[KeptMessage], events: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` slices of ``kept``, each of whole messages holding about ``events``
    events (at least one message each)."""
    start = n = 0
    for i, message in enumerate(kept):
        n += len(message.events)
        if n >= events:
            yield start, i + 1
            start, n = i + 1, 0
    if start < len(kept):
        yield start, len(kept)


def _log_fetch_pause_failure(task: asyncio.Future[None]) -> None:
    """The Kafka client could not be paused or resumed (the consumer stopping): logged;
    the next pause or resume tries again."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("lifecycle fetch pause/resume failed: %r", task.exception())


def _note_abandoned(task: asyncio.Future[None]) -> None:
    """A flush started by a full buffer gave up at a stop signal (nothing committed): log
    it like the timer's; any failure is raised by the next batch or flush
    (``WorkerShell._raise_failed_flush``)."""
    if not task.cancelled() and isinstance(task.exception(), ShuttingDownError):
        log.info("flush abandoned, nothing committed: %s", task.exception())


def _record_dead_letter(rec: RequestRecord, topic: str) -> DeadLetter:
    """A record the store refused, as a dead letter (the record as JSON; its events are
    spread over several offsets, so the source names the topic only)."""
    return DeadLetter(orjson.dumps(msgspec.structs.asdict(rec)), "", SourceRef(topic, -1, -1), None)


def _event_dead_letter(topic: str, kept: KeptEvent, reason: str) -> DeadLetter:
    """A raw event the store refused (see ``WorkerShell._collect``), as a dead letter."""
    partition, offset, _ev, raw = kept
    return DeadLetter(bytes(raw), reason, SourceRef(topic, partition, offset), None)


def _credentials(settings: Settings) -> Any:
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

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        wait_ms = getattr(self.app, "fetch_max_wait_ms", 1500)  # _App's (Faust's own: 1500)
        consumer._fetch_max_wait_ms = wait_ms  # read when its fetcher starts
        return consumer


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
    # build_app sets the shell's WorkerShell.gate_committed (see _ConsumerThread)
    untracked_read_offsets: frozenset[str] = frozenset()  # see _ReadOffsets
    commit_gate: Callable[[Any, dict[Any, Any]], Awaitable[dict[Any, Any]]] | None = None

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)


def build_app(settings: Settings) -> tuple[faust.App, WorkerShell]:
    """Build the Faust app and its shell. Nothing runs until a faust.Worker starts it."""
    app = _App(
        settings.group_id,
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
        # A recreated topic is seen at the next metadata refresh (see check_topic).
        consumer_metadata_max_age_ms=settings.topic_check_interval_ms * 5,
    )
    app.fetch_max_wait_ms = settings.fetch_max_wait_ms
    shell = WorkerShell(settings, app)
    app.commit_gate = shell.gate_committed
    app.untracked_read_offsets = frozenset({settings.lifecycle_topic})
    topic = app.topic(
        settings.lifecycle_topic, value_type=bytes, value_serializer="raw", acks=False
    )

    @app.agent(topic, name="tailguard-lifecycle")
    async def lifecycle(stream: faust.StreamT[bytes]) -> None:
        take = stream.take_events  # type: ignore[attr-defined]  # faust-streaming API, not in StreamT
        try:
            async for events in take(settings.take_max_messages, within=0.1):
                await shell.on_batch(
                    [(ev.message.partition, ev.message.offset, ev.message.value) for ev in events]
                )
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
        await shell.check_topic()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        await shell.on_assigned()

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
    shell.open()  # fail fast on a bad store, before joining the group
    tune_gc()
    tune_gil()

    class _Lifecycle(faust.Service):
        async def on_stop(self) -> None:  # runs after the app (and its consumer) stopped
            await shell.stop()

    worker = _Worker(
        app, _Lifecycle(), loglevel=loglevel, quiet=True, redirect_stdouts=False, shell=shell
    )
    worker.execute_from_commandline()


def _wait_for_broker(settings: Settings) -> bool:
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
            on_overdue=self._shell.stop_overdue,
            grace_s=STOP_GRACE_S,
        ).install()

    def _on_sigterm(self) -> None:
        self._shell.begin_stop()  # already done by PromptStop's thread, as a rule
        super()._on_sigterm()

    def _on_sigint(self) -> None:
        self._shell.begin_stop()
        super()._on_sigint()
