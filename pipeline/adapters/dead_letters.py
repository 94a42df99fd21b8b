"""A worker's dead letters: one per source position, across restarts.

The positions at or after the committed offset that have their letter on the DLQ (sent
by this worker, or found there when it took the partition) are remembered; their
letters are not sent again (:class:`pipeline.core.dead_positions.DeadPositions`)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Protocol

from pipeline.contract.codec import DeadLetter, dead_subposition
from pipeline.core.dead_positions import DeadPositions
from pipeline.core.generation import CommitMeta

log = logging.getLogger("tailguard.worker")

# A worker taking a partition reads the DLQ back from this long before the time the last
# commit recorded (``dlq_since_ms``): the clocks of the worker that sent a letter and of
# the one reading it back may differ by up to this much.
DLQ_SCAN_MARGIN_MS = 60_000

# (partition, offset, sub-position, sent at ms) of the letters on the DLQ of one topic
# generation, sent since a time (None: from the DLQ's start); see read_dead_positions.
ReadPositions = Callable[[str | None, int | None], list[tuple[int, int, int, int]]]


class DeadLetterPort(Protocol):
    """The DLQ's producer (:class:`pipeline.adapters.reliable.DeadLetterSink`)."""

    def send_dead(self, dead: list[DeadLetter], topic_id: str | None = None) -> None: ...

    def flush(self, stop: threading.Event | None = None) -> None: ...

    def abandon(self) -> None: ...


class DeadLetters:
    """The DLQ sink of the lifecycle ``topic``, sending each position's letter once (from
    the event loop and the writer thread)."""

    def __init__(self, topic: str, sink: DeadLetterPort, read_positions: ReadPositions) -> None:
        self.topic = topic
        self.sink = sink
        self._read_positions = read_positions
        self._positions = DeadPositions()
        self._lock = threading.Lock()  # the event loop's and the writer's letters
        self.repeats = 0  # letters not sent again (their position had one)

    def send(self, dead: list[DeadLetter], topic_id: str | None) -> int:
        """Send dead letters, but none for a lifecycle position that has one; the number
        sent. ``topic_id``: the generation of the topic they were read from."""
        now_ms = int(time.time() * 1000)
        fresh: list[DeadLetter] = []
        with self._lock:
            for d in dead:
                src = d.source
                if src.topic == self.topic and src.partition >= 0 and src.offset >= 0:
                    # (several events of one message may each be a letter: see
                    # dead_subposition)
                    sub = dead_subposition(d.index, d.raw)
                    if self._positions.known(src.partition, src.offset, sub):
                        self.repeats += 1
                        continue
                    self._positions.add(src.partition, src.offset, sub, now_ms)
                fresh.append(d)
        if fresh:
            self.sink.send_dead(fresh, topic_id=topic_id)
        return len(fresh)

    async def read_back(
        self,
        first_offsets: Mapping[int, int],
        resume_meta: Mapping[int, CommitMeta | None],
        topic_id: str | None,
        executor: Executor,
    ) -> None:
        """New partitions, each read from ``first_offsets[p]`` on: the positions from there
        on that already have a dead letter on the DLQ (an earlier run's, sent before it
        stopped without committing them), so that re-reading them sends none again. The
        DLQ is read from the time the last commit recorded (less ``DLQ_SCAN_MARGIN_MS``);
        from its start when there is no such commit."""
        since: list[int | None] = []
        for p in first_offsets:
            meta = resume_meta.get(p)
            since.append(meta.dlq_since_ms if meta is not None else None)
        since_ms = None if None in since else min(x for x in since if x is not None)
        if since_ms is not None:
            since_ms = max(0, since_ms - DLQ_SCAN_MARGIN_MS)
        try:
            found = await asyncio.get_running_loop().run_in_executor(
                executor, lambda: self._read_positions(topic_id, since_ms)
            )
        except Exception as exc:  # the DLQ unreadable: at worst a letter is sent twice
            log.warning("could not read the DLQ back (%s): a position may get a second letter", exc)
            return
        with self._lock:
            for p in first_offsets:
                self._positions.drop(p)
            for p, off, index, ts_ms in found:
                if p in first_offsets and off >= first_offsets[p]:
                    self._positions.add(p, off, index, ts_ms)
        for p, first in first_offsets.items():
            n = self._positions.count(p)
            if n:
                log.info(
                    "partition %d: %d positions from offset %d on already dead-lettered",
                    p, n, first,
                )  # fmt: skip

    def scan_from_ms(self, offsets: Mapping[int, int], now_ms: int) -> dict[int, int]:
        """Per partition: from when a reader of the DLQ must scan to find the letters of
        the positions at or after ``offsets[p]`` (the commit's ``dlq_since_ms``)."""
        with self._lock:
            return {p: self._positions.scan_from_ms(p, o, now_ms) for p, o in offsets.items()}

    def committed(self, offsets: Mapping[int, int]) -> None:
        """Offsets committed: the positions before them need no memory."""
        with self._lock:
            for p, o in offsets.items():
                self._positions.committed(p, o)

    def drop(self, parts: list[int]) -> None:
        """Partitions handed away: the next owner reads their positions back."""
        with self._lock:
            for p in parts:
                self._positions.drop(p)

    def clear(self) -> None:
        """The topic's generation changed: the new one's positions are read back."""
        with self._lock:
            self._positions.clear()
