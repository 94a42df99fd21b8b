"""Partitioned stream processor: raw messages in, request records and dead letters out.

The one piece of logic both the Faust worker and ``tailguard replay`` run.
Plain Python over bytes, offsets and integer milliseconds (wall time passed
in); no Kafka, Faust or ClickHouse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pipeline.contract.codec import DEFAULT_MAX_MESSAGE_BYTES, DeadLetter, SourceRef, decode_message
from pipeline.contract.events import EngineStats, Event, GatewayReceived
from pipeline.core.join import Emitted, EventClock, JoinConfig, JoinCounters, Joiner
from pipeline.core.record import RequestRecord
from pipeline.core.windows import (
    ClosedWindow,
    WindowAggregator,
    WindowConfig,
    WindowCounters,
    WindowSLOs,
)


@dataclass(slots=True)
class ProcessorCounters:
    messages: int = 0
    events: int = 0
    dead_letters: int = 0
    stats_events: int = 0
    records: int = 0
    upgrades_not_windowed: int = 0


@dataclass(slots=True)
class _PartitionState:
    joiner: Joiner
    windows: WindowAggregator
    clock: EventClock = field(default_factory=EventClock)
    next_offset: int = 0


@dataclass(slots=True)
class Output:
    records: list[RequestRecord] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    windows: list[ClosedWindow] = field(default_factory=list)
    # (partition, offset, event) of every valid event, when keep_events is on
    events: list[tuple[int, int, Event]] = field(default_factory=list)
    stats: list[EngineStats] = field(default_factory=list)  # engine.stats events seen


class StreamProcessor:
    """Joins one topic's partitions independently; tracks committable offsets."""

    def __init__(
        self,
        topic: str,
        join_config: JoinConfig | None = None,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        window_config: WindowConfig | None = None,
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
        self.slo_factory = slo_factory
        self.max_message_bytes = max_message_bytes
        self.counters = ProcessorCounters()
        self._parts: dict[int, _PartitionState] = {}
        self._retired = JoinCounters()  # counters of partitions handed away
        self._retired_windows = WindowCounters()

    def has_partition(self, partition: int) -> bool:
        return partition in self._parts

    def init_partition(self, partition: int, horizon_ms: int = 0) -> None:
        """Start a partition's state; ``horizon_ms`` is its checkpointed close horizon."""
        self._parts[partition] = _PartitionState(
            Joiner(self.join_config),
            WindowAggregator(partition, self.window_config, self.slo_factory, horizon_ms),
        )

    def restore_inflight(self, partition: int, received: Iterable[tuple[int, Event]]) -> int:
        """Give back the lone ``gateway.received`` events of a partition from before its
        committed offset (see :meth:`safe_offsets`); returns how many were taken."""
        joiner = self._part(partition).joiner
        n = 0
        for offset, ev in received:
            if isinstance(ev, GatewayReceived):
                joiner.add_emitted(ev, offset, None)
                n += 1
        return n

    def _part(self, partition: int) -> _PartitionState:
        st = self._parts.get(partition)
        if st is None:
            self.init_partition(partition)
            st = self._parts[partition]
        return st

    def _window(self, st: _PartitionState, emitted: Emitted, out: Output) -> None:
        out.records.append(emitted.record)
        if emitted.upgrade:
            # Windows take a request once, at its first emission (a sketch cannot
            # take a value back); the requests table gets the upgrade.
            self.counters.upgrades_not_windowed += 1
            return
        st.windows.add(emitted.record, emitted.first_offset)

    def process(
        self,
        messages: Iterable[tuple[int, int, bytes]],
        wall_ms: int | None,
        lagging: frozenset[int] = frozenset(),
    ) -> Output:
        """Process ``(partition, offset, value)`` messages in order.

        ``wall_ms`` is the processing time (None for a replay: event time only);
        ``lagging`` names partitions with more input waiting (their clocks do not
        advance on wall time, see :class:`EventClock`).
        """
        out = Output()
        touched: set[int] = set()
        counters = self.counters
        for partition, offset, raw in messages:
            counters.messages += 1
            st = self._part(partition)
            decoded = decode_message(
                raw, SourceRef(self.topic, partition, offset), max_bytes=self.max_message_bytes
            )
            if decoded.dead:
                out.dead.extend(decoded.dead)
                counters.dead_letters += len(decoded.dead)
            joiner = st.joiner
            clock = st.clock
            if self.keep_events:
                out.events.extend((partition, offset, ev) for ev in decoded.events)
            for ev in decoded.events:
                counters.events += 1
                if ev.kind == "engine.stats":
                    counters.stats_events += 1
                    out.stats.append(ev)
                    continue
                clock.observe(ev.ts_unix_ns // 1_000_000, wall_ms or 0)
                emitted = joiner.add_emitted(ev, offset, wall_ms)
                if emitted is not None:
                    self._window(st, emitted, out)
            st.next_offset = offset + 1
            touched.add(partition)
        if self.max_pending is not None:
            self._bound_pending(self.max_pending)
        for p in touched:
            self._advance(self._parts[p], wall_ms, out, p not in lagging)
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

    def _advance(
        self, st: _PartitionState, wall_ms: int | None, out: Output, caught_up: bool = True
    ) -> None:
        now = st.clock.now(wall_ms or 0, caught_up)
        for emitted in st.joiner.advance_emitted(now, wall_ms):
            self._window(st, emitted, out)
        out.windows.extend(st.windows.close(now, st.joiner.oldest_terminal_ms()))

    def tick(self, wall_ms: int, lagging: frozenset[int] = frozenset()) -> Output:
        """Advance every partition's clock (resolves timeouts, closes windows while idle)."""
        out = Output()
        for p, st in self._parts.items():
            self._advance(st, wall_ms, out, p not in lagging)
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
            for emitted in st.joiner.drain_emitted():
                self._window(st, emitted, out)
            out.windows.extend(st.windows.drain())
        self.counters.records += len(out.records)
        return out

    def safe_offsets(self) -> dict[int, int]:
        """Per partition, the offset that may be committed with nothing lost:
        the oldest event of an open join or of a record in an open window."""
        out = {}
        for p, st in self._parts.items():
            if not st.next_offset:
                continue
            # Raw events are written before the commit (keep_events): a lone
            # gateway.received is then durable and restored on a restart.
            safe = st.joiner.safe_offset(st.next_offset, lone_received_durable=self.keep_events)
            win = st.windows.min_open_offset()
            out[p] = safe if win is None else min(safe, win)
        return out

    def next_offsets(self) -> dict[int, int]:
        return {p: st.next_offset for p, st in self._parts.items()}

    def late_by_partition(self) -> dict[int, int]:
        return {p: st.windows.counters.late for p, st in self._parts.items()}

    def horizons(self) -> dict[int, int]:
        """Per partition, the close horizon of its windows (checkpointed with the offsets)."""
        return {p: st.windows.horizon_ms for p, st in self._parts.items()}

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
