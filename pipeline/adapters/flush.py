"""One flush: what it writes (:class:`Flush`), the one writer of it and its order
(:class:`FlushWriter`, used by the worker and by ``tailguard replay --store``), and the
flush-behind chain a live worker runs it in (:class:`FlushBehind`).

The write order (:meth:`FlushWriter.write`) is what the worker's crash and restart
guarantees rest on: request rows, then the closed windows with their ledger, then their
final summaries and the partitions' close horizons (what the controller is told), then
the raw events, then the checkpoints; the control audit is written by
:meth:`FlushWriter.write_audit`, after the windows it was decided on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import orjson

from pipeline.adapters.reliable import ShuttingDownError
from pipeline.adapters.store import (
    BudgetEventRow,
    Checkpoint,
    ControlRow,
    KeptEvent,
    check_rollups,
    write_audit,
    write_checkpoints,
    write_isolating,
    write_raw_isolating,
    write_requests,
    write_windows_repairing,
)
from pipeline.contract.codec import DeadLetter, SourceRef
from pipeline.core.processor import KeptMessage
from pipeline.core.record import RequestRecord
from pipeline.core.windows import ClosedWindow

if TYPE_CHECKING:
    from pipeline.adapters.store import ClickHouseStore
    from pipeline.settings import Settings

log = logging.getLogger("tailguard.worker")

# While a flush runs, the buffer may grow to this many times flush_max_rows before a batch
# waits for a flush to take it: the writer then always has the next flush ready (a loop
# that waited on every full buffer spent ~20 % of a catch-up run idle, see FlushBehind).
BEHIND_BUFFERS = 3
# A flush writes its raw events in chunks of about this many events, so that a window
# closing meanwhile waits for one chunk, not for all of them (see FlushWriter.write's
# ``hurry``).
RAW_CHUNK_EVENTS = 16_384

# One write, retried as its caller's policy says (returns the retries it took).
Retry = Callable[[Callable[[], Any], str], int]


@dataclass(frozen=True, slots=True)
class FlushSettings:
    """What the flush needs of the settings (built once from :class:`Settings`)."""

    group_id: str
    lifecycle_topic: str
    relative_accuracy: float
    flush_max_rows: int
    take_max_messages: int

    @classmethod
    def of(cls, s: Settings) -> FlushSettings:
        return s.narrowed(cls, relative_accuracy=s.window_config().relative_accuracy)


@dataclass(frozen=True, slots=True)
class Flush:
    """What one flush writes: a worker's snapshot of its buffers, or a replay's output.
    ``through``: per partition, the next offset the windows' ledger covers."""

    records: Sequence[RequestRecord]
    windows: Sequence[ClosedWindow]
    events: Sequence[KeptMessage] = ()
    checkpoints: Sequence[Checkpoint] = ()
    through: Mapping[int, int] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.records or self.windows or self.events or self.checkpoints)


class WindowsTold(Protocol):
    """What the controller is told of a flush (``control_feed.ControlFeed``)."""

    def windows_stored(
        self, windows: Sequence[ClosedWindow], checkpoints: Sequence[Checkpoint]
    ) -> None: ...

    def flush(self, stop: threading.Event | None) -> None: ...


class LedgerPort(Protocol):
    """The ledger topic (:class:`pipeline.adapters.ledger.LedgerPublisher`)."""

    def publish(
        self,
        windows: Sequence[ClosedWindow],
        through: dict[int, int],
        stop: threading.Event | None = None,
    ) -> None: ...

    def flush(self, stop: threading.Event | None = None) -> None: ...


class FlushWriter:
    """All writes of a flush, in order, on one thread. Its collaborators are given:
    ``group`` (the consumer group whose checkpoints these are), ``retry`` (how one write
    is retried), ``dead_rows`` (rows the store refused, as dead
    letters), and for a worker the ``ledger`` topic, the ``told`` controller feed and
    ``on_told`` (called once the windows' summaries are acknowledged); a replay has none
    of those, and writes the same rows in the same order."""

    def __init__(
        self,
        store: ClickHouseStore,
        group: str,
        topic: str,
        relative_accuracy: float,
        *,
        retry: Retry,
        dead_rows: Callable[[list[DeadLetter]], None],
        ledger: LedgerPort | None = None,
        told: WindowsTold | None = None,
        on_told: Callable[[Sequence[ClosedWindow]], None] | None = None,
        stopping: threading.Event | None = None,
        rollups_unchecked: bool = False,
    ) -> None:
        self.store = store
        self.group = group
        self.topic = topic
        self.relative_accuracy = relative_accuracy
        self.retry = retry
        self.dead_rows = dead_rows
        self.ledger = ledger
        self.told = told
        self.on_told = on_told
        self.stopping = stopping
        # the start-up check of the rollups failed: made after the next write of windows
        self.rollups_unchecked = rollups_unchecked

    def write(
        self, flush: Flush, *, hurry: threading.Event | None = None
    ) -> tuple[int, list[KeptMessage]]:
        """All writes of one flush, in order. Returns the retries and the raw events left
        to the next flush (see ``hurry``).

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
        store, topic = self.store, self.topic
        records, windows, events = list(flush.records), list(flush.windows), list(flush.events)
        retries = 0
        if records:
            retries += self.write_records(records)
        if windows:
            token = f"{self.group}/{topic}/{uuid.uuid4().hex}"  # the same on every retry
            # a failed attempt may have landed in window_sketches and not in every view:
            # the rollups of its hours are set right once it succeeded
            retries += write_windows_repairing(
                store, windows, topic, self.relative_accuracy, token,
                through_offsets=dict(flush.through), retry=self.retry,
            )  # fmt: skip
            if self.rollups_unchecked:  # the start-up check, put off
                retries += self.retry(lambda: check_rollups(store), "check of rollups")
                self.rollups_unchecked = False
            # Workers with their own stores learn from the topic what this one counted.
            if self.ledger is not None:
                # acknowledged below; both wait for the broker, and give up at a stop signal
                self.ledger.publish(windows, dict(flush.through), self.stopping)
        if self.told is not None:
            # The controller hears of a window once it is stored (at least once: it dedups).
            self.told.windows_stored(windows, flush.checkpoints)
            self.told.flush(self.stopping)
        if windows and self.ledger is not None:
            # The ledger went out with the summaries (one round trip for both, not two
            # in a row before the controller hears of the windows); it is acknowledged
            # before anything is committed.
            self.ledger.flush(self.stopping)
        if self.on_told is not None:
            self.on_told(windows)  # their final summaries are out (see ControlFeed.provisional)
        # One write when nothing can hurry it (fewer parts to merge).
        per_write = RAW_CHUNK_EVENTS if hurry is not None else sys.maxsize
        for start, end in raw_chunks(events, per_write):
            if hurry is not None and hurry.is_set():
                return retries, events[start:]
            n, rejected = write_raw_isolating(store, topic, events[start:end], retry=self.retry)
            retries += n
            self.dead_rows([event_dead_letter(topic, kept, why) for kept, why in rejected])
        # Only after the windows: a horizon never runs ahead of what is stored.
        checkpoints = list(flush.checkpoints)
        group = self.group
        retries += self.retry(
            lambda: write_checkpoints(store, group, topic, checkpoints), "write of checkpoints"
        )
        return retries, []

    def write_records(self, records: Sequence[RequestRecord], retry: Retry | None = None) -> int:
        """Write request rows; those the store rejects for their values are isolated (the
        batch is split) and sent to the DLQ with the store's reason; the rest is written.
        ``retry``: this write's own policy (default: the writer's)."""
        store, topic = self.store, self.topic
        retries, rejected = write_isolating(
            lambda rows: write_requests(store, rows), records, "write of records",
            retry=retry or self.retry,
        )  # fmt: skip
        self.dead_rows(
            [dataclasses.replace(record_dead_letter(r, topic), reason=why) for r, why in rejected]
        )
        return retries

    def write_audit(
        self,
        control_rows: Sequence[ControlRow],
        event_rows: Sequence[BudgetEventRow],
        retry: Retry | None = None,
    ) -> int:
        """The control audit (the signals published, the budget events), after the windows
        it was decided on; ``retry``: this write's own policy (default: the writer's)."""
        if not control_rows and not event_rows:
            return 0
        store = self.store
        return (retry or self.retry)(
            lambda: write_audit(store, control_rows, event_rows), "write of the control audit"
        )


class FlushBehind:
    """The flush-behind chain: a full buffer (or a closed window) starts a flush and the
    event loop goes on processing batches while the writer thread writes it.

    ``flush`` is the worker's flush (it snapshots the buffers and calls :meth:`took`
    before its first wait); ``buffered`` counts the records buffered; ``max_rows`` is
    ``flush_max_rows``."""

    def __init__(
        self, flush: Callable[[], Awaitable[None]], buffered: Callable[[], int], max_rows: int
    ) -> None:
        self._flush = flush
        self._buffered = buffered
        self._max_rows = max_rows
        self._behind: asyncio.Future[None] | None = None
        self._again = False  # a closed window asked for a flush while one ran
        self._taken = asyncio.Event()  # a flush took the buffers
        # Set when a batch closed a window, cleared as a flush starts: a live flush being
        # written leaves its remaining raw events and its commit to the next (see
        # FlushWriter.write).
        self.hurry = threading.Event()

    @property
    def running(self) -> asyncio.Future[None] | None:
        return self._behind

    @property
    def again(self) -> bool:
        return self._again

    def took(self) -> None:
        """A flush took the buffers: a batch waiting on a full buffer goes on."""
        self._taken.set()

    async def after_batch(self, closed: bool = False) -> None:
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
            self.hurry.set()
        if running is not None and not running.done():
            self._again = True
            if self._buffered() < BEHIND_BUFFERS * self._max_rows:
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
            if self._buffered() < self._max_rows and not closed:
                return
        self._behind = task = asyncio.ensure_future(self._chain())
        task.add_done_callback(_note_abandoned)

    async def _chain(self) -> None:
        """A flush, and another right after it while a closed window or a full buffer
        asked for one."""
        self._again = False
        await self._flush()
        while self._again:
            self._again = False
            await self._flush()

    def raise_failed(self) -> None:
        """A flush started by a full buffer that failed fails the next batch or flush
        (before anything else is committed), as when the batch awaited it."""
        done = self._behind
        if done is not None and done.done():
            self._behind = None
            if not done.cancelled():
                done.result()

    def abandon(self) -> None:
        """The lifecycle agent stops: a flush it started stops with it (as the timer's
        does when Faust stops the timer); what it had not committed is replayed."""
        if self._behind is not None:
            self._behind.cancel()
            self._behind = None


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


def _note_abandoned(task: asyncio.Future[None]) -> None:
    """A flush started by a full buffer gave up at a stop signal (nothing committed): log
    it like the timer's; any failure is raised by the next batch or flush
    (:meth:`FlushBehind.raise_failed`)."""
    if not task.cancelled() and isinstance(task.exception(), ShuttingDownError):
        log.info("flush abandoned, nothing committed: %s", task.exception())


def record_dead_letter(rec: RequestRecord, topic: str) -> DeadLetter:
    """A record the store refused, as a dead letter (the record as JSON; its events are
    spread over several offsets, so the source names the topic only)."""
    return DeadLetter(orjson.dumps(msgspec.structs.asdict(rec)), "", SourceRef(topic, -1, -1), None)


def event_dead_letter(topic: str, kept: KeptEvent, reason: str) -> DeadLetter:
    """A raw event the store refused, as a dead letter."""
    partition, offset, _ev, raw = kept
    return DeadLetter(bytes(raw), reason, SourceRef(topic, partition, offset), None)
