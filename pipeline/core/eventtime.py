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

import bisect
from dataclasses import dataclass, field
from heapq import heappush, heapreplace


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


_NO_LIMIT = 1 << 62  # ahead_limit_ms of a clock not yet established (beyond any event time)


@dataclass(slots=True)
class PartitionClock:
    config: ClockConfig = field(default_factory=ClockConfig)
    watermark_ms: int = 0
    wall_at_advance_ms: int = 0
    events: int = 0
    # host -> min-heap of its `quorum` largest event times (its mark is heap[0])
    _tops: dict[str, list[int]] = field(default_factory=dict)
    # The watermark the counts below were taken at (None: take them again). While it
    # stands, ``_active`` is the number of active marks (at or above the watermark less
    # ``host_idle_ms``) and ``_below`` the number of those at or below the watermark. The
    # lower median of the active marks passes the watermark exactly when ``_below <=
    # (_active - 1) // 2``, so observe keeps the two counts as marks move (O(1)) and
    # recomputes only then: the same watermark, event by event, as recomputing whenever a
    # mark moves. Invariant while it stands: the median does not pass the watermark.
    _settled_ms: int | None = None
    _active: int = 0
    _below: int = 0

    @property
    def bootstrapping(self) -> bool:
        """True until the partition has seen ``quorum`` events (see :meth:`establish`)."""
        return self.events < self.config.quorum and self.watermark_ms == 0

    @property
    def newest_ms(self) -> dict[str, int]:
        """Per host, the largest event time it has sent (the largest of its top ones)."""
        return {h: max(t) for h, t in self._tops.items()}

    def in_range(self, ts_ms: int, now_ms: int = 0) -> bool:
        """False for an event too far ahead of the clock to be trusted (``now_ms``: the
        clock with idle wall time, see :meth:`now`, when larger than the watermark)."""
        return ts_ms <= self.ahead_limit_ms(now_ms)

    def ahead_limit_ms(self, now_ms: int = 0) -> int:
        """The latest event time :meth:`in_range` accepts while the watermark stands (no
        limit before the clock is established)."""
        wm = self.watermark_ms
        if wm == 0:
            return _NO_LIMIT
        return max(wm, now_ms) + self.config.max_ahead_ms

    def jump(self, to_ms: int, wall_ms: int = 0) -> None:
        """Move the watermark forward across a gap that several hosts agree on."""
        if to_ms > self.watermark_ms:
            self.watermark_ms = to_ms
            self.wall_at_advance_ms = wall_ms

    def observe(self, host: str, ts_ms: int, wall_ms: int = 0) -> int:
        """Count one in-range event of ``host``; may advance the watermark, which it
        returns. O(1) unless the watermark moves (then O(hosts log hosts))."""
        self.events += 1
        top = self._tops.get(host)
        if top is None or len(top) < self.config.quorum:
            return self._grow(host, top, ts_ms, wall_ms)
        old = top[0]
        if ts_ms <= old:
            return self.watermark_ms  # this host's mark did not move
        heapreplace(top, ts_ms)
        wm = self.watermark_ms
        if self._settled_ms == wm and (
            old > wm or (top[0] <= wm and old >= wm - self.config.host_idle_ms)
        ):
            return wm  # above the watermark, or active at or below it, before and after
        return self._moved(old, top[0], wall_ms)

    def _grow(self, host: str, top: list[int] | None, ts_ms: int, wall_ms: int) -> int:
        """One of a host's first ``quorum`` events (its mark is its smallest so far)."""
        if top is None:
            self._tops[host] = [ts_ms]
            return self._moved(None, ts_ms, wall_ms)
        old = top[0]
        heappush(top, ts_ms)
        return self._moved(old, top[0], wall_ms)

    def _moved(self, old: int | None, new: int, wall_ms: int) -> int:
        """A host's mark moved from ``old`` (None: a new host) to ``new``."""
        wm = self.watermark_ms
        boot = self.events < self.config.quorum and wm == 0
        if self._settled_ms != wm:
            if not boot:
                self._recompute(wall_ms)
            return self.watermark_ms
        floor = wm - self.config.host_idle_ms
        if old is not None and old >= floor:
            self._active -= 1
            if old <= wm:
                self._below -= 1
        if new >= floor:
            self._active += 1
            if new <= wm:
                self._below += 1
        if self._active and self._below <= (self._active - 1) // 2:
            if boot:
                self._settled_ms = None  # no recompute while bootstrapping
            else:
                self._recompute(wall_ms)
        return self.watermark_ms

    def establish(self, wall_ms: int = 0) -> None:
        """End the bootstrap with what has been seen (a quiet partition, end of input)."""
        if self._tops:
            self._recompute(wall_ms, force=True)

    def _recompute(self, wall_ms: int, force: bool = False) -> None:
        wm = self.watermark_ms
        idle = self.config.host_idle_ms
        marks = sorted([t[0] for t in self._tops.values()])
        marks = marks[bisect.bisect_left(marks, wm - idle) :]  # the active ones
        if marks:
            median = marks[(len(marks) - 1) // 2]
            if median > wm or (force and wm == 0):
                self.watermark_ms = wm = median
                self.wall_at_advance_ms = wall_ms
                marks = marks[bisect.bisect_left(marks, wm - idle) :]
        # The counts at the (new) watermark; a floor that rose with it may have left the
        # median past it already: then the next move of any mark recomputes (None).
        below = bisect.bisect_right(marks, wm)
        self._active, self._below = len(marks), below
        self._settled_ms = None if marks and below <= (len(marks) - 1) // 2 else wm

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
