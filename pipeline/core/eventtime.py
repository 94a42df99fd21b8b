"""Event time of one partition: a clock that no single host, and no few events, can move.

Event timestamps are evidence, not authority: any host's wall clock can be off by
seconds or by a year. The clock that closes windows and times out joins is built so
that an outlier cannot move it for everyone (pure; time passed in):

* **Per host, a robust mark.** Each host's mark is the ``quorum``-th largest event
  time it has sent (its smallest while it has sent fewer): up to ``quorum - 1``
  events stamped far ahead by one host do not move its mark.
* **Across hosts, the lower median.** The partition's watermark is the lower median
  of the marks of the hosts that are active (a mark no more than ``host_idle_ms``
  behind the watermark): one host whose clock runs ahead (or behind) cannot move it
  while other hosts report. The watermark never goes back.
* **Out of range.** An event more than ``max_ahead_ms`` ahead of the clock is not
  trusted: the processor holds it aside (it reaches neither the join nor the windows).
  If ``quorum`` such events from at least two hosts agree on a later time, the data
  jumped (a gap in traffic, or a replay of another day): the clock :meth:`jump`s there
  and the held events are processed. Otherwise, after ``hold_events`` more events in
  range, they are quarantined (dead letter ``ts_out_of_range``). Events *behind* the
  clock are ordinary late data: they are corrected, not dropped.
* **Bootstrap.** A partition's first ``quorum`` events are held (:meth:`bootstrapping`)
  until the clock has a median to judge them by, so a poison event that happens to be
  the first one read (after a restart, say) is judged like any other.
* **Idle partitions.** In a live worker, a caught-up partition whose watermark has
  not moved lets wall time pass on top of it (:meth:`now`) so the last requests of a
  burst still resolve and the last windows close; a partition with input waiting
  (consumer lag) holds still.

Every step is O(log quorum + hosts) per event and independent of the size of a time
gap; the result depends on the order of events only, never on how they were batched.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ClockConfig:
    max_ahead_ms: int = 300_000
    quorum: int = 5
    host_idle_ms: int = 60_000
    hold_events: int = 1_000

    def __post_init__(self) -> None:
        if self.max_ahead_ms <= 0:
            raise ValueError(f"clock.max_ahead_ms must be > 0, got {self.max_ahead_ms}")
        if self.quorum < 1:
            raise ValueError(f"clock.quorum must be >= 1, got {self.quorum}")
        if self.host_idle_ms <= 0:
            raise ValueError(f"clock.host_idle_ms must be > 0, got {self.host_idle_ms}")
        if self.hold_events < 1:
            raise ValueError(f"clock.hold_events must be >= 1, got {self.hold_events}")


@dataclass(slots=True)
class PartitionClock:
    config: ClockConfig = field(default_factory=ClockConfig)
    watermark_ms: int = 0
    wall_at_advance_ms: int = 0
    events: int = 0
    # host -> min-heap of its `quorum` largest event times (its mark is heap[0])
    _tops: dict[str, list[int]] = field(default_factory=dict)
    # host -> largest event time seen (skew telemetry; never used for the clock)
    newest_ms: dict[str, int] = field(default_factory=dict)
    # The watermark as the last full recompute left it unmoved (None: it moved since).
    # While it stands, a mark that rises without crossing it (staying at or below it, or
    # above it already) changes neither how many active marks lie above it nor, unless a
    # mark at most it joins, how many lie below: the lower median cannot pass it, so
    # observe skips the recompute (the same watermark, event by event, for less work).
    # A mark that falls (a host's first events) always recomputes.
    _settled_ms: int | None = None

    @property
    def bootstrapping(self) -> bool:
        """True until the partition has seen ``quorum`` events (see :meth:`establish`)."""
        return self.events < self.config.quorum and self.watermark_ms == 0

    def in_range(self, ts_ms: int, now_ms: int = 0) -> bool:
        """False for an event too far ahead of the clock to be trusted (``now_ms``: the
        clock with idle wall time, see :meth:`now`, when larger than the watermark)."""
        ref = max(self.watermark_ms, now_ms)
        return self.watermark_ms == 0 or ts_ms <= ref + self.config.max_ahead_ms

    def jump(self, to_ms: int, wall_ms: int = 0) -> None:
        """Move the watermark forward across a gap that several hosts agree on."""
        if to_ms > self.watermark_ms:
            self.watermark_ms = to_ms
            self.wall_at_advance_ms = wall_ms

    def observe(self, host: str, ts_ms: int, wall_ms: int = 0) -> None:
        """Count one in-range event of ``host``; may advance the watermark."""
        self.events += 1
        top = self._tops.get(host)
        if top is None:
            top = self._tops[host] = []
        old = top[0] if top else None
        newest = self.newest_ms.get(host)
        if newest is None or ts_ms > newest:
            self.newest_ms[host] = ts_ms
        if len(top) < self.config.quorum:
            heapq.heappush(top, ts_ms)
        elif ts_ms > top[0]:
            heapq.heapreplace(top, ts_ms)
        else:
            return  # this host's mark did not move
        if not self.bootstrapping:
            wm = self.watermark_ms
            new = top[0]
            if self._settled_ms == wm and (
                new <= wm if old is None else old <= new and (new <= wm or old > wm)
            ):
                return
            self._recompute(wall_ms)

    def establish(self, wall_ms: int = 0) -> None:
        """End the bootstrap with what has been seen (a quiet partition, end of input)."""
        if self._tops:
            self._recompute(wall_ms, force=True)

    def _recompute(self, wall_ms: int, force: bool = False) -> None:
        wm = self.watermark_ms
        floor = wm - self.config.host_idle_ms
        marks = sorted(t[0] for t in self._tops.values() if t[0] >= floor)
        self._settled_ms = wm
        if not marks:
            return
        median = marks[(len(marks) - 1) // 2]
        if median > wm or (force and wm == 0):
            self.watermark_ms = median
            self.wall_at_advance_ms = wall_ms
            self._settled_ms = None

    def now(self, wall_ms: int | None, caught_up: bool = True) -> int:
        """The partition's clock: the watermark, plus idle wall time when caught up."""
        if self.watermark_ms == 0:
            return 0
        if wall_ms is None:
            return self.watermark_ms
        if not caught_up:
            # Quiet time only counts from the last moment input was known to be waiting.
            self.wall_at_advance_ms = max(self.wall_at_advance_ms, wall_ms)
            return self.watermark_ms
        return self.watermark_ms + max(0, wall_ms - self.wall_at_advance_ms)

    def host_marks(self) -> dict[str, int]:
        """Per host, its robust mark (telemetry: how far each host is from the watermark)."""
        return {h: t[0] for h, t in self._tops.items()}
