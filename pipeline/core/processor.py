"""Partitioned stream processor: raw messages in, request records and dead letters out.

The one piece of logic both the Faust worker and ``tailguard replay`` run.
Plain Python over bytes, offsets and integer milliseconds (wall time passed
in); no Kafka, Faust or ClickHouse.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pipeline.contract.codec import DEFAULT_MAX_MESSAGE_BYTES, DeadLetter, SourceRef, decode_message
from pipeline.core.join import EventClock, JoinConfig, JoinCounters, Joiner
from pipeline.core.record import RequestRecord


@dataclass(slots=True)
class ProcessorCounters:
    messages: int = 0
    events: int = 0
    dead_letters: int = 0
    stats_events: int = 0
    records: int = 0


@dataclass(slots=True)
class _PartitionState:
    joiner: Joiner
    clock: EventClock = field(default_factory=EventClock)
    next_offset: int = 0


@dataclass(slots=True)
class Output:
    records: list[RequestRecord] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)


class StreamProcessor:
    """Joins one topic's partitions independently; tracks committable offsets."""

    def __init__(
        self,
        topic: str,
        join_config: JoinConfig | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.topic = topic
        self.join_config = join_config or JoinConfig()
        self.max_message_bytes = max_message_bytes
        self.counters = ProcessorCounters()
        self._parts: dict[int, _PartitionState] = {}
        self._retired = JoinCounters()  # counters of partitions handed away

    def _part(self, partition: int) -> _PartitionState:
        st = self._parts.get(partition)
        if st is None:
            st = self._parts[partition] = _PartitionState(Joiner(self.join_config))
        return st

    def process(self, messages: Iterable[tuple[int, int, bytes]], wall_ms: int | None) -> Output:
        """Process ``(partition, offset, value)`` messages in order.

        ``wall_ms`` is the processing time (None for a replay: event time only).
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
            for ev in decoded.events:
                counters.events += 1
                if ev.kind == "engine.stats":
                    counters.stats_events += 1
                    continue
                clock.observe(ev.ts_unix_ns // 1_000_000, wall_ms or 0)
                rec = joiner.add(ev, offset, wall_ms)
                if rec is not None:
                    out.records.append(rec)
            st.next_offset = offset + 1
            touched.add(partition)
        for p in touched:
            st = self._parts[p]
            out.records.extend(st.joiner.advance(st.clock.now(wall_ms or 0), wall_ms))
        counters.records += len(out.records)
        return out

    def tick(self, wall_ms: int) -> list[RequestRecord]:
        """Advance every partition's clock (resolves timeouts while input is idle)."""
        out: list[RequestRecord] = []
        for st in self._parts.values():
            out.extend(st.joiner.advance(st.clock.now(wall_ms), wall_ms))
        self.counters.records += len(out)
        return out

    def drain(self) -> list[RequestRecord]:
        """End of input: resolve everything still pending."""
        out: list[RequestRecord] = []
        for st in self._parts.values():
            out.extend(st.joiner.drain())
        self.counters.records += len(out)
        return out

    def safe_offsets(self) -> dict[int, int]:
        """Per partition, the offset that may be committed with nothing lost."""
        return {
            p: st.joiner.safe_offset(st.next_offset)
            for p, st in self._parts.items()
            if st.next_offset
        }

    def revoke(self, partitions: Iterable[int]) -> None:
        """Forget partitions handed to another worker (it rebuilds from the committed offset)."""
        for p in partitions:
            st = self._parts.pop(p, None)
            if st is not None:
                self._retired.add(st.joiner.counters)

    def pending(self) -> int:
        return sum(st.joiner.pending_count for st in self._parts.values())

    def join_counters(self) -> JoinCounters:
        total = JoinCounters()
        total.add(self._retired)
        for st in self._parts.values():
            total.add(st.joiner.counters)
        return total
