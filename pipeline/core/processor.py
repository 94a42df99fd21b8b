"""Partitioned stream processor: raw messages in, request records and dead letters out.

The one piece of logic both the Faust worker and ``tailguard replay`` run.
Plain Python over bytes, offsets and integer milliseconds (wall time passed
in); no Kafka, Faust or ClickHouse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

from pipeline.contract.codec import DEFAULT_MAX_MESSAGE_BYTES, DeadLetter, SourceRef
from pipeline.contract.events import Event
from pipeline.contract.wire import (
    AnyLifecycle,
    EventBytes,
    StatsWire,
    WireEvent,
    decode_clean,
    decode_fast,
    event_bytes,
)
from pipeline.core.counted import CountedArchive
from pipeline.core.eventtime import ClockConfig, PartitionClock
from pipeline.core.join import Emitted, JoinConfig, JoinCounters, Joiner
from pipeline.core.ledger import RETRACTED, code_order, unpack
from pipeline.core.record import RequestRecord
from pipeline.core.windows import (
    ALL_KEY,
    ClosedWindow,
    WindowAggregator,
    WindowConfig,
    WindowCounters,
    WindowSLOs,
    ledger_code,
    ledger_key,
)


@dataclass(slots=True)
class ProcessorCounters:
    messages: int = 0
    events: int = 0
    dead_letters: int = 0  # every dead letter (bad input and quarantined events)
    quarantined: int = 0  # events out of range of the partition's clock (ts_out_of_range)
    stats_events: int = 0
    records: int = 0
    replayed: int = 0  # records a worker taking a partition over found counted already
    replay_conflicts: int = 0  # replayed partials that disagree with the counted one
    replayed_events: int = 0  # gateway.received of requests counted complete, re-read
    # records of requests the join had forgotten, found counted already by the archive
    beyond_memory: int = 0
    flagged: int = 0  # records whose events contradict each other (RequestRecord.flags)
    by_flag: dict[str, int] = field(default_factory=dict)


class KeptMessage(NamedTuple):
    """A message's valid events with their bytes as received (``keep_events``): what the
    raw events table stores, one per message, not one tuple per event."""

    partition: int
    offset: int
    events: list[WireEvent]  # its valid events (engine.stats included), as decoded
    # The message itself when it is a JSON array of exactly these events, in order (the
    # decoder accepted it whole: its elements are their bytes); else each event's bytes.
    payload: bytes | list[EventBytes]


@dataclass(slots=True)
class Output:
    records: list[RequestRecord] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    windows: list[ClosedWindow] = field(default_factory=list)  # closed ones and corrections
    # the messages with valid events and those events' bytes, when keep_events is on
    kept: list[KeptMessage] = field(default_factory=list)
    stats: list[StatsWire] = field(default_factory=list)  # engine.stats events seen


@dataclass(slots=True)
class Finished:
    """What :meth:`StreamProcessor.finish` wrote out of partitions whose input ended."""

    partitions: list[int] = field(default_factory=list)  # those that had state
    requests: int = 0  # requests the closed windows (and corrections) count
    windows: int = 0  # windows closed
    partials: int = 0  # partial records of requests that waited for their partner


class StreamProcessor:
    """Joins one topic's partitions independently; tracks committable offsets."""

    def __init__(
        self,
        topic: str,
        join_config: JoinConfig | None = None,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        window_config: WindowConfig | None = None,
        clock_config: ClockConfig | None = None,
        slo_factory: Callable[[], WindowSLOs] | None = None,
        keep_events: bool = False,
        max_pending: int | None = None,
    ) -> None:
        self.topic = topic
        self.keep_events = keep_events
        # Pending joins of all partitions together (the join's own bound is per partition).
        self.max_pending = max_pending
        self.join_config = join_config or JoinConfig()
        self.window_config = window_config or WindowConfig()
        self.clock_config = clock_config or ClockConfig()
        self.slo_factory = slo_factory
        self.max_message_bytes = max_message_bytes
        self.counters = ProcessorCounters()
        self._parts: dict[int, _PartitionState] = {}
        self._retired = JoinCounters()  # counters of partitions handed away
        self._retired_windows = WindowCounters()
        # per partition: the end of the windows of its finished generation (see finish)
        self._ended: dict[int, int] = {}
        self._context = _Context(
            topic, self.counters, self.clock_config, self.join_config.resolved_ttl_ms
        )

    def has_partition(self, partition: int) -> bool:
        return partition in self._parts

    def init_partition(
        self,
        partition: int,
        ledger: dict[str, int] | None = None,
        *,
        seed_join: bool = True,
        horizon_ms: int = 0,
    ) -> None:
        """Start a partition's state. ``ledger``: request id -> ledger code (packed with
        the end of its window, ``pipeline.core.ledger.pack``) of the requests the store
        already counts that this worker may meet again: re-read from the offset it resumes
        at, or repeated (duplicates) within the join's memory. They are not counted again:
        complete ones are remembered by the join as resolved (a repeat is a duplicate),
        partial ones are checked when their record comes out (``_PartitionState.window``).
        ``seed_join=False`` (a replay of a whole file, which re-reads every event): all are
        checked when their record comes out, so the replay still reports them.
        ``horizon_ms``: windows ending at or before it are written already (a finished
        generation of the partition, :meth:`finish`; the later of it and this
        processor's own :meth:`ended_horizon`): records for them go to corrections, so a
        window is never written twice as a closed window."""
        joiner = Joiner(self.join_config)
        ttl = self.join_config.resolved_ttl_ms
        led = dict(ledger or {})
        for rid, packed in sorted(led.items(), key=lambda kv: unpack(kv[1])[1]):
            # (a take-back as the furthest version: the store counts nothing of it)
            if packed & (2 | RETRACTED) == 2 and seed_join:
                joiner.seed_resolved(rid, unpack(packed)[1] + ttl)
        self._parts[partition] = _PartitionState(
            self._context,
            partition,
            joiner,
            WindowAggregator(
                partition,
                self.window_config,
                self.slo_factory,
                horizon_ms=max(horizon_ms, self._ended.get(partition, 0)),
            ),
            PartitionClock(self.clock_config),
            ledger={rid: unpack(packed)[0] for rid, packed in led.items()},
            counted=CountedArchive(self.join_config.counted_ttl_ms, self.join_config.max_counted),
        )

    def restore_inflight(self, partition: int, received: Iterable[tuple[int, Event]]) -> int:
        """Give back the lone ``gateway.received`` events of a partition from before its
        committed offset (see :meth:`safe_offsets`); returns how many were taken."""
        joiner = self._part(partition).joiner
        n = 0
        for offset, ev in received:
            if ev.kind == "gateway.received":
                joiner.add_emitted(ev, offset, None)
                n += 1
        return n

    def _part(self, partition: int) -> _PartitionState:
        st = self._parts.get(partition)
        if st is None:
            self.init_partition(partition)
            st = self._parts[partition]
        return st

    def process(
        self,
        messages: Iterable[tuple[int, int, bytes]],
        wall_ms: int | None,
        lagging: frozenset[int] = frozenset(),
    ) -> Output:
        """Process ``(partition, offset, value)`` messages in order.

        ``wall_ms`` is the processing time (None for a replay: event time only);
        ``lagging`` names partitions with more input waiting (their clocks do not
        advance on wall time, see :class:`PartitionClock`).
        """
        out = Output()
        touched: set[int] = set()
        counters = self.counters
        keep = self.keep_events
        max_bytes = self.max_message_bytes
        for partition, offset, raw in messages:
            counters.messages += 1
            st = self._parts.get(partition) or self._part(partition)
            # (no slices of the events' bytes: an array message is kept whole, see
            # KeptMessage; a single event comes with its bytes, the message)
            clean = decode_clean(raw, max_bytes=max_bytes, raws=False)
            if clean is None:  # a bad event in it, or a bad message: the reference decoder
                decoded = decode_fast(
                    raw, SourceRef(self.topic, partition, offset), max_bytes=max_bytes
                )
                evs, raws = decoded.events, decoded.raws
                out.dead.extend(decoded.dead)
                counters.dead_letters += len(decoded.dead)
                if keep and evs:
                    out.kept.append(KeptMessage(partition, offset, evs, raws))
            else:
                evs, raws = clean
                if keep and evs:
                    # raws is empty for an array (raws=False): the message is their bytes
                    out.kept.append(KeptMessage(partition, offset, evs, raws or raw))
            counters.events += len(evs)
            if st.ahead or st.clock.bootstrapping:
                st.events(offset, iter(evs), wall_ms, out)
            else:
                st.events_fast(offset, evs, wall_ms, out)
            # never back: an offset below it is a new topic generation's, fetched at the
            # old positions before the worker noticed (its state is finished with where
            # the old generation's reading stood: test_fault_topic_gone_midstream.py)
            st.next_offset = max(st.next_offset, offset + 1)
            touched.add(partition)
        if self.max_pending is not None:
            self._bound_pending(self.max_pending)
        for p in touched:
            self._parts[p].advance(wall_ms, out, p not in lagging)
        if self.max_pending is not None and self.pending() > self.max_pending:
            # events held while a clock bootstrapped joined in the advance above
            self._bound_pending(self.max_pending)
            for p in touched:
                self._parts[p].advance(wall_ms, out, p not in lagging)
        counters.records += len(out.records)
        return out

    def _bound_pending(self, limit: int) -> None:
        """Over ``limit`` pending joins in all: evict the oldest of the fullest partitions
        (each down to its share, then further) until the total is back at ``limit``."""
        excess = self.pending() - limit
        while excess > 0:
            st = max(self._parts.values(), key=lambda st: st.joiner.pending_count)
            share = limit // len(self._parts)
            n = min(excess, max(1, st.joiner.pending_count - share))
            st.joiner.evict(n)
            excess -= n

    def tick(self, wall_ms: int, lagging: frozenset[int] = frozenset()) -> Output:
        """Advance every partition's clock (resolves timeouts, closes windows while idle)."""
        out = Output()
        for p, st in self._parts.items():
            st.advance(wall_ms, out, p not in lagging)
        self.counters.records += len(out.records)
        return out

    def provisional(self) -> tuple[list[ClosedWindow], dict[int, int]]:
        """Snapshots of ended-but-open windows, and each partition's watermark.

        For the controller, which decides on windows as soon as they end instead of
        after the grace period (see :meth:`WindowAggregator.provisional`). The clock
        reported is the partition's event-time watermark (the newest event time it
        has processed), never the wall-clock extension the close horizon uses: a
        partition whose input is late or slow (a loaded machine, a producer still
        flushing) then holds decisions back instead of letting them run ahead of its
        data; a quiet partition falls back to the close horizon (window + grace).
        Every window ending at or before the watermark is closed (and summarized) or
        in the returned snapshots (or unchanged since its last snapshot).
        """
        snaps: list[ClosedWindow] = []
        clocks: dict[int, int] = {}
        for p, st in self._parts.items():
            watermark = st.clock.watermark_ms
            if watermark == 0:
                continue
            snaps.extend(st.windows.provisional(watermark))
            clocks[p] = watermark
        return snaps, clocks

    def drain(self) -> Output:
        """End of input: resolve everything still pending and close every window."""
        out = Output()
        for st in self._parts.values():
            if st.boot:
                st.clock.establish()
                st.release_boot(None, out)
            if st.ahead:
                st.quarantine_ahead(out)
            for emitted in st.joiner.drain_emitted():
                st.window(emitted, out)
            st.closed(st.windows.drain(), st.clock.watermark_ms, out)
        self.counters.records += len(out.records)
        return out

    def finish(self, partitions: Iterable[int]) -> tuple[Output, Finished]:
        """The input of ``partitions`` ended for good (their topic generation is gone:
        nobody can read it again, so nobody rebuilds their state): write out what was
        read instead of forgetting it. Every pending join is resolved as its timeout
        would resolve it (a partial record; a lone ``gateway.received`` is dropped, as at
        its TTL), every open window is closed with what it holds (and pending
        corrections emitted), events held while the clock bootstrapped are processed
        and events held ahead of it quarantined (as :meth:`drain`). The partitions are
        then forgotten; the end of their windows is kept (:meth:`ended_horizon`) so that
        a later generation of the same partition never emits those windows again as
        closed windows (its records for them become corrections: see
        :meth:`init_partition`)."""
        out = Output()
        done = Finished()
        for p in sorted(set(partitions)):
            st = self._parts.get(p)
            if st is None:
                continue
            if st.boot:
                st.clock.establish()
                st.release_boot(None, out)
            if st.ahead:
                st.quarantine_ahead(out)
            n = len(out.records)
            for emitted in st.joiner.drain_emitted():
                st.window(emitted, out)
            done.partials += sum(1 for r in out.records[n:] if r.source != "joined")
            closed = st.windows.drain()
            st.closed(closed, st.clock.watermark_ms, out)
            for w in closed:
                done.requests += w.records.get(ALL_KEY, 0)
                done.windows += 0 if w.correction else 1
            done.partitions.append(p)
            self._ended[p] = max(self._ended.get(p, 0), st.windows.horizon_ms)
            self.revoke([p])
        self.counters.records += len(out.records)
        return out, done

    def ended_horizon(self, partition: int) -> int:
        """Where the windows of a finished generation of ``partition`` ended (0: none)."""
        return self._ended.get(partition, 0)

    def safe_offsets(self) -> dict[int, int]:
        """Per partition, the offset that may be committed with nothing lost:
        the oldest event of an open join, of a record in an open window, or held
        while the partition's clock bootstraps."""
        out = {}
        for p, st in self._parts.items():
            if not st.next_offset:
                continue
            # Raw events are written before the commit (keep_events): a lone
            # gateway.received is then durable and restored on a restart.
            safe = st.joiner.safe_offset(st.next_offset, lone_received_durable=self.keep_events)
            win = st.windows.min_open_offset()
            if win is not None:
                safe = min(safe, win)
            for held in (st.boot, st.ahead):
                if held:
                    safe = min(safe, held[0][0])
            out[p] = safe
        return out

    def next_offsets(self) -> dict[int, int]:
        return {p: st.next_offset for p, st in self._parts.items()}

    def horizons(self) -> dict[int, int]:
        """Per partition, the close horizon of its windows (telemetry)."""
        return {p: st.windows.horizon_ms for p, st in self._parts.items()}

    def watermarks(self) -> dict[int, int]:
        return {p: st.clock.watermark_ms for p, st in self._parts.items()}

    def lateness_by_partition(self) -> dict[int, tuple[int, int, int]]:
        """Per partition: (corrected records, quarantined events, replayed records)."""
        return {
            p: (st.windows.counters.corrected, st.quarantined, st.replayed)
            for p, st in self._parts.items()
        }

    def host_skew_ms(self) -> dict[str, int]:
        """Per host, how far its robust mark is ahead (+) of its partition's watermark,
        worst over partitions (a host whose clock is off shows here)."""
        out: dict[str, int] = {}
        for st in self._parts.values():
            wm = st.clock.watermark_ms
            if not wm:
                continue
            for host, mark in st.clock.host_marks().items():
                d = mark - wm
                if abs(d) > abs(out.get(host, 0)):
                    out[host] = d
                else:
                    out.setdefault(host, d)
        return out

    def revoke(self, partitions: Iterable[int]) -> None:
        """Forget partitions handed to another worker (it rebuilds from the committed offset)."""
        for p in partitions:
            st = self._parts.pop(p, None)
            if st is not None:
                self._retired.add(st.joiner.counters)
                for name in WindowCounters.__slots__:
                    setattr(
                        self._retired_windows,
                        name,
                        getattr(self._retired_windows, name) + getattr(st.windows.counters, name),
                    )

    def pending(self) -> int:
        return sum(st.joiner.pending_count for st in self._parts.values())

    def window_counters(self) -> WindowCounters:
        total = WindowCounters()
        for c in [self._retired_windows, *(st.windows.counters for st in self._parts.values())]:
            for name in WindowCounters.__slots__:
                setattr(total, name, getattr(total, name) + getattr(c, name))
        return total

    def join_counters(self) -> JoinCounters:
        total = JoinCounters()
        total.add(self._retired)
        for st in self._parts.values():
            total.add(st.joiner.counters)
        return total


@dataclass(frozen=True, slots=True)
class _Context:
    """What every partition of a processor shares."""

    topic: str
    counters: ProcessorCounters  # the processor's, counted into by every partition
    clock_config: ClockConfig
    resolved_ttl_ms: int  # JoinConfig.resolved_ttl_ms


@dataclass(slots=True)
class _PartitionState:
    """One partition's state and the path of its events: clock -> join -> windows.

    The processor decodes each message and hands its events to :meth:`events_fast`
    (the clock runs and nothing is held ahead of it) or :meth:`events` (one
    :meth:`event` at a time: the clock bootstraps, or events ahead of it are held).
    """

    ctx: _Context
    partition: int
    joiner: Joiner
    windows: WindowAggregator
    clock: PartitionClock
    next_offset: int = 0
    # request_id -> ledger code of requests counted before this worker took the partition
    ledger: dict[str, int] = field(default_factory=dict)
    # events held while the clock bootstraps (offset, event)
    boot: list[tuple[int, AnyLifecycle]] = field(default_factory=list)
    # events out of range of the clock, held until a quorum confirms a jump (offset, event)
    ahead: list[tuple[int, AnyLifecycle]] = field(default_factory=list)
    since_ahead: int = 0  # events in range processed since the first held one
    now_ms: int = 0  # the clock at the last advance (with idle wall time)
    quarantined: int = 0
    replayed: int = 0
    advanced_at_ms: int = -1  # watermark at the last per-event advance
    # what closed windows counted, after the join forgets it (pipeline/core/counted.py)
    counted: CountedArchive | None = None

    def window(self, emitted: Emitted, out: Output) -> None:
        """A record the join emitted: to the windows (its previous version taken back),
        unless an earlier owner of the partition counted it (the takeover ledger)."""
        rec = emitted.record
        previous = emitted.previous
        written = False  # previous was counted by an earlier owner (the store has it)
        if (
            previous is None
            and rec.end_unix_ns // 1_000_000 <= self.clock.watermark_ms - self.ctx.resolved_ttl_ms
            and self.counted is not None
        ):
            # Old enough that the join may have forgotten it: counted before?
            key = ledger_key(rec)
            if key not in self.ledger:
                code = self.counted.get(key)
                if code is not None:
                    self.ctx.counters.beyond_memory += 1
                    self.ledger[key] = code
        if self.ledger:
            key = ledger_key(rec)
            code = self.ledger.get(key)
            if code is not None:
                mine = ledger_code(rec)
                if code & RETRACTED:
                    # The furthest version written is a take-back: its replacement was
                    # never written (a written one ranks higher), so the store holds the
                    # add and its take-back, net nothing. Count this record, whatever
                    # its version, and take nothing back.
                    previous = None
                elif code_order(mine) <= code_order(code):
                    # Counted before this worker took the partition (a replayed input).
                    if code_order(mine) == code_order(code) and mine != code:
                        # The other side's partial: the store holds this request's first
                        # side, which this worker never saw; keep the stored row.
                        self.ctx.counters.replay_conflicts += 1
                    else:
                        self.ctx.counters.replayed += 1
                        self.replayed += 1
                        out.records.append(rec)  # the same row again (or an older one)
                    return
                else:
                    # An upgrade of what was counted: take that version back.
                    previous = emitted.version(code)
                    if previous is None:
                        self.ctx.counters.replay_conflicts += 1
                        return
                    # A version an earlier owner wrote: its take-back goes out with the
                    # next write, never after this add (see WindowAggregator.add).
                    written = True
                self.ledger[key] = mine
        out.records.append(rec)
        if rec.flags:
            self.count_flags(rec)
        if previous is not None:
            self.windows.add(previous, -1, sign=-1, written=written)
        self.windows.add(rec, emitted.first_offset)

    def closed(self, closed: list[ClosedWindow], now_ms: int, out: Output) -> None:
        """Windows going out: their ledgers are what the archive remembers."""
        counted = self.counted
        if closed and counted is not None and counted.enabled:
            for w in closed:
                counted.add(w.ledger, w.start_ms + w.size_ms)
            counted.expire(now_ms)
        out.windows.extend(closed)

    def count_flags(self, rec: RequestRecord) -> None:
        c = self.ctx.counters
        c.flagged += 1
        for f in rec.flags:
            c.by_flag[f] = c.by_flag.get(f, 0) + 1

    def quarantine(self, offset: int, ev: AnyLifecycle, out: Output) -> None:
        wm = self.clock.watermark_ms
        ts_ms = ev.ts_unix_ns // 1_000_000
        out.dead.append(
            DeadLetter(
                event_bytes(ev),
                f"ts_out_of_range: {ev.host} stamped {ev.kind} {ts_ms - wm} ms ahead of the "
                f"partition clock {wm} (max {self.ctx.clock_config.max_ahead_ms})",
                SourceRef(self.ctx.topic, self.partition, offset),
                None,
            )
        )
        self.ctx.counters.quarantined += 1
        self.ctx.counters.dead_letters += 1
        self.quarantined += 1

    def event(self, offset: int, ev: AnyLifecycle, wall_ms: int | None, out: Output) -> None:
        """One event, the clock running (see :meth:`events`)."""
        clock = self.clock
        ts_ms = ev.ts_unix_ns // 1_000_000
        if not clock.in_range(ts_ms, self.now_ms):
            self.ahead.append((offset, ev))
            self.check_jump(wall_ms, out)
            return
        if self.ahead:
            self.since_ahead += 1
            if self.since_ahead >= self.ctx.clock_config.hold_events:
                self.quarantine_ahead(out)
        clock.observe(ev.host, ts_ms, wall_ms or 0)
        if self.ledger and ev.kind == "gateway.received":
            code = self.ledger.get(ev.request_id)
            if code is not None and code & (3 | RETRACTED) == 3:
                # Re-read after a takeover, of a request counted complete: a lone received
                # here would only wait out the in-flight TTL (holding the commit back).
                self.ctx.counters.replayed_events += 1
                return
        emitted = self.joiner.add_emitted(ev, offset, wall_ms, clock.watermark_ms)
        if emitted is not None:
            self.window(emitted, out)
        wm = clock.watermark_ms
        if wm != self.advanced_at_ms:
            # Per event, so that what is late depends on the order of events only.
            self.advanced_at_ms = wm
            self.advance_to(wm, wall_ms, out)

    def check_jump(self, wall_ms: int | None, out: Output) -> None:
        """Held events ahead of the clock: the traffic jumped (a gap, another day) when
        ``quorum`` of them from three hosts or more fall within ``max_ahead_ms`` of each
        other, or when ``hold_events`` are held with nothing in range between them. Then
        the clock moves there and they are processed; a stray request (two hosts) or one
        host's wrong clock never moves it."""
        held = self.ahead
        cfg = self.ctx.clock_config
        if len(held) < cfg.quorum:
            return
        times = sorted((ev.ts_unix_ns // 1_000_000, ev.host) for _, ev in held)
        target = None
        if len(held) >= cfg.hold_events:
            target = times[(len(times) - 1) // 2][0]
        else:
            lo = 0
            for hi in range(len(times)):
                while times[hi][0] - times[lo][0] > cfg.max_ahead_ms:
                    lo += 1
                span = times[lo : hi + 1]
                if len(span) >= cfg.quorum and len({h for _, h in span}) >= 3:
                    target = span[0][0]
                    break
        if target is None:
            return
        self.clock.jump(target, wall_ms or 0)
        self.ahead, self.since_ahead = [], 0
        for offset, ev in held:
            self.event(offset, ev, wall_ms, out)

    def quarantine_ahead(self, out: Output) -> None:
        """Nothing confirmed the held events' time: they go to the DLQ."""
        for offset, ev in self.ahead:
            self.quarantine(offset, ev, out)
        self.ahead, self.since_ahead = [], 0

    def release_boot(self, wall_ms: int | None, out: Output) -> None:
        """The clock is established: process the events held while it bootstrapped."""
        held, self.boot = self.boot, []
        clock = self.clock
        for offset, ev in held:
            if not clock.in_range(ev.ts_unix_ns // 1_000_000, self.now_ms):
                self.ahead.append((offset, ev))
                self.check_jump(wall_ms, out)
                continue
            emitted = self.joiner.add_emitted(ev, offset, wall_ms, clock.watermark_ms)
            if emitted is not None:
                self.window(emitted, out)
        self.advanced_at_ms = clock.watermark_ms
        self.advance_to(clock.watermark_ms, wall_ms, out)

    def events(
        self, offset: int, evs: Iterator[WireEvent], wall_ms: int | None, out: Output
    ) -> None:
        """One message's events, one :meth:`event` at a time (the clock bootstraps, or
        events ahead of it are held)."""
        for ev in evs:
            if ev.kind == "engine.stats":
                self.ctx.counters.stats_events += 1
                out.stats.append(ev)
                continue
            if self.clock.bootstrapping:
                self.boot.append((offset, ev))
                self.clock.observe(ev.host, ev.ts_unix_ns // 1_000_000, wall_ms or 0)
                if not self.clock.bootstrapping:
                    self.release_boot(wall_ms, out)
                continue
            self.event(offset, ev, wall_ms, out)

    def events_fast(  # (the hot path: one call per message)
        self, offset: int, evs: list[WireEvent], wall_ms: int | None, out: Output
    ) -> None:
        """:meth:`events` of a partition whose clock runs and holds nothing ahead: the
        same steps as :meth:`event`, inlined, until an event falls out of range (it and
        the rest of the message then take :meth:`events`)."""
        clock = self.clock
        observe = clock.observe
        add = self.joiner.add_emitted
        ledger = self.ledger
        wall = wall_ms or 0
        limit = clock.ahead_limit_ms(self.now_ms)
        advanced = self.advanced_at_ms
        it = iter(evs)
        for ev in it:
            kind = ev.kind
            if kind == "engine.stats":
                self.ctx.counters.stats_events += 1
                out.stats.append(ev)  # type: ignore[arg-type]
                continue
            ts_ms = ev.ts_unix_ns // 1_000_000
            if ts_ms > limit:
                self.events(offset, chain((ev,), it), wall_ms, out)
                return
            wm = observe(ev.host, ts_ms, wall)
            if ledger and kind == "gateway.received":
                code = ledger.get(ev.request_id)
                if code is not None and code & (3 | RETRACTED) == 3:
                    # see event (a watermark it moved: ``limit`` stays lower, which only
                    # sends an event to events, which judges it again)
                    self.ctx.counters.replayed_events += 1
                    continue
            emitted = add(ev, offset, wall_ms, wm)  # type: ignore[arg-type]
            if emitted is not None:
                self.window(emitted, out)
            if wm != advanced:
                self.advanced_at_ms = advanced = wm
                self.advance_to(wm, wall_ms, out)
                limit = clock.ahead_limit_ms(self.now_ms)

    def advance_to(self, now: int, wall_ms: int | None, out: Output) -> None:
        joiner = self.joiner
        for emitted in joiner.advance_emitted(now, wall_ms):
            self.window(emitted, out)
        windows = self.windows
        cfg = windows.config
        horizon = now - cfg.grace_ms
        if horizon > windows.horizon_ms:
            # A terminal event at or after horizon + size_ms holds no window the horizon
            # reaches (see WindowAggregator.close): only older ones are looked up.
            hold = joiner.oldest_terminal_before(horizon + cfg.size_ms)
            self.closed(windows.close(now, hold), now, out)

    def advance(self, wall_ms: int | None, out: Output, caught_up: bool = True) -> None:
        """Advance the clock (wall time too, when ``caught_up``): resolve timeouts, close
        windows, release or quarantine held events."""
        if self.boot and wall_ms is not None and caught_up:
            # A quiet partition in a live worker: establish the clock with what it has.
            self.clock.establish(wall_ms)
            self.release_boot(wall_ms, out)
        if self.ahead and wall_ms is not None and caught_up:
            # A live partition that has caught up: its clock runs on wall time too, so
            # events still ahead of it at the end of what was sent are not a jump.
            self.quarantine_ahead(out)
        now = self.clock.now(wall_ms, caught_up)
        self.now_ms = max(self.now_ms, now)
        self.advance_to(now, wall_ms, out)
        self.closed(self.windows.take_corrections(), now, out)
