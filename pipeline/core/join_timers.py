"""When the join looks at a pending request again: its deadlines (see :mod:`pipeline.core.join`).

A pending request has one deadline: its in-flight TTL (``gateway.received`` alone) or
its partner's timeout (a first terminal event), in event time and, live, in processing
time (``wall_deadline_ms``). :class:`JoinTimers` keeps them, and the first terminal
events (the windows stay open until those are resolved), cheaply for the common case:
most requests are joined long before either, so they wait in time buckets (one list
slot a request) and reach the heaps only when event time nears them; a request that
moved on is dropped there with one dict lookup.

State of the requests is the join's (``pending``, shared): a timer is checked against
it when it fires, never updated when the request moves on (stale items are skipped and
compacted away).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Final

from pipeline.core.join_state import M64, NS_PER_MS, TS_SHIFT, WALL_SHIFT, Pending

# A heap or the buckets are compacted once they hold twice the live state and this.
_COMPACT_SLACK: Final = 1024
# In-flight deadlines wait in buckets of 2**_BUCKET_BITS ms (one list slot per request)
# and move to the deadline heap when event time reaches their bucket.
_BUCKET_BITS: Final = 14
# A first terminal event waits likewise, by its time, in buckets of 2**_TERMINAL_BITS ms
# (4 s): one list slot per request for both its partner's deadline (its time +
# timeout_ms) and the oldest-terminal lookup (``JoinTimers.oldest_terminal_before``). A
# bucket moves to the two heaps, its requests still waiting, when event time nears
# either; by then (11 s or more after the event) nearly all are joined: dropped with
# one dict lookup instead of pushed through two heaps of tuples and popped (or
# compacted) from them again (~17 tuple comparisons on scattered memory a pop).
_TERMINAL_BITS: Final = 12


class _Buckets:
    """Request ids by bucket (a time ``>>`` some bits), each checked against the live
    state when its bucket is taken; ``frontier``: buckets up to here are taken."""

    __slots__ = ("by_key", "frontier", "items", "keys")

    def __init__(self) -> None:
        self.by_key: dict[int, list[str]] = {}
        self.keys: list[int] = []  # a heap of by_key's keys
        self.items = 0
        self.frontier = -1

    def put(self, key: int, rid: str) -> None:
        """Add a request id to a bucket."""
        bucket = self.by_key.get(key)
        if bucket is None:
            self.by_key[key] = [rid]
            heapq.heappush(self.keys, key)
        else:
            bucket.append(rid)
        self.items += 1

    def take(self, frontier: int) -> Iterator[tuple[int, list[str]]]:
        """Remove and yield the buckets up to ``frontier``, in key order."""
        self.frontier = frontier
        keys, by_key = self.keys, self.by_key
        while keys and keys[0] <= frontier:
            key = heapq.heappop(keys)
            bucket = by_key.pop(key)
            self.items -= len(bucket)
            yield key, bucket

    def compact(
        self, pending: dict[str, Pending | int], key_of: Callable[[Pending | int], int | None]
    ) -> None:
        """Keep in each bucket the ids of pending requests whose bucket it still is
        (``key_of`` their state)."""
        n = 0
        buckets = self.by_key
        for key, bucket in list(buckets.items()):
            live = [
                rid for rid in bucket if (e := pending.get(rid)) is not None and key_of(e) == key
            ]
            if live:
                buckets[key] = live
                n += len(live)
            else:
                del buckets[key]
        self.keys = list(buckets)
        heapq.heapify(self.keys)
        self.items = n

    def clear(self) -> None:
        self.by_key.clear()
        self.keys.clear()
        self.items = 0


def _terminal_key(entry: Pending | int) -> int | None:
    """The bucket of a pending request's first terminal event (None: none yet)."""
    return entry.terminal_ms >> _TERMINAL_BITS if isinstance(entry, Pending) else None


class JoinTimers:
    """The deadlines of a joiner's pending requests and their first terminal events."""

    __slots__ = (
        "_inflight",
        "_inflight_ttl_ms",
        "_pending",
        "_terminal",
        "_timeout_ms",
        "deadlines",
        "terminals",
        "wall_waits",
    )

    def __init__(
        self, pending: dict[str, Pending | int], inflight_ttl_ms: int, timeout_ms: int
    ) -> None:
        self._pending = pending
        self._inflight_ttl_ms = inflight_ttl_ms
        self._timeout_ms = timeout_ms
        self.deadlines: list[tuple[int, str]] = []  # heap of (deadline ms, request key)
        self.wall_waits: list[tuple[int, int, str]] = []  # (wall deadline, deadline, key)
        self.terminals: list[tuple[int, str]] = []  # heap of (first terminal ms, key)
        # In-flight deadlines by bucket (deadline_ms >> _BUCKET_BITS), moved to
        # ``deadlines`` when event time reaches them.
        self._inflight = _Buckets()
        # Pending requests by their first terminal event (terminal_ms >> _TERMINAL_BITS)
        self._terminal = _Buckets()

    def deadline(self, entry: Pending | int) -> int:
        if isinstance(entry, int):
            return ((entry >> TS_SHIFT) & M64) // NS_PER_MS + self._inflight_ttl_ms
        return entry.deadline_ms

    def wall_deadline(self, entry: Pending | int) -> int:
        if isinstance(entry, int):
            wall = (entry >> WALL_SHIFT) & 0xFFFFFFFFFFF
            return wall - 1 + self._inflight_ttl_ms if wall else 0
        return entry.wall_deadline_ms

    def push_deadline(self, deadline_ms: int, rid: str) -> None:
        heapq.heappush(self.deadlines, (deadline_ms, rid))
        if len(self.deadlines) > 2 * len(self._pending) + _COMPACT_SLACK:
            self._compact()

    def push_terminal(self, terminal_ms: int, rid: str) -> None:
        heapq.heappush(self.terminals, (terminal_ms, rid))

    def arm(self, rid: str, deadline_ms: int, terminal_ms: int | None = None) -> None:
        """Arm a pending request's deadline: an in-flight one (``terminal_ms`` None), or
        its first terminal event and its partner's deadline (``terminal_ms +
        timeout_ms``): into its bucket, or the heaps when their frontier passed it."""
        if terminal_ms is None:
            b, key = self._inflight, deadline_ms >> _BUCKET_BITS
        else:
            b, key = self._terminal, terminal_ms >> _TERMINAL_BITS
        if key <= b.frontier:
            if terminal_ms is not None:
                heapq.heappush(self.terminals, (terminal_ms, rid))
            self.push_deadline(deadline_ms, rid)
            return
        bucket = b.by_key.get(key)  # (_Buckets.put inlined: once per request)
        if bucket is None:
            b.put(key, rid)
        else:
            bucket.append(rid)
            b.items += 1
        if b.items > 2 * len(self._pending) + _COMPACT_SLACK:
            b.compact(self._pending, self._inflight_key if terminal_ms is None else _terminal_key)

    def _inflight_key(self, entry: Pending | int) -> int | None:
        """The bucket of an in-flight request's deadline (None: not in flight)."""
        return self.deadline(entry) >> _BUCKET_BITS if isinstance(entry, int) else None

    def _move_inflight(self, now_ms: int) -> None:
        """Move the in-flight deadlines of buckets event time reached to the heap."""
        frontier = now_ms >> _BUCKET_BITS
        if frontier <= self._inflight.frontier:
            return
        pending = self._pending
        heap = self.deadlines
        for key, bucket in self._inflight.take(frontier):
            for rid in bucket:
                e = pending.get(rid)
                if isinstance(e, int):
                    d = self.deadline(e)
                    if d >> _BUCKET_BITS == key:
                        heapq.heappush(heap, (d, rid))

    def _move_terminals(self, frontier: int) -> None:
        """Move the first terminal events (and their partners' deadlines) of the buckets
        up to ``frontier`` whose requests still wait to the heaps."""
        if frontier <= self._terminal.frontier:
            return
        pending = self._pending
        terminals, deadlines = self.terminals, self.deadlines
        for key, bucket in self._terminal.take(frontier):
            for rid in bucket:
                e = pending.get(rid)
                if isinstance(e, Pending) and e.terminal_ms >> _TERMINAL_BITS == key:
                    heapq.heappush(terminals, (e.terminal_ms, rid))
                    heapq.heappush(deadlines, (e.deadline_ms, rid))
        if len(deadlines) > 2 * len(pending) + _COMPACT_SLACK:
            self._compact()

    def due(self, now_ms: int, wall_ms: int | None) -> Iterator[tuple[str, Pending | int]]:
        """The pending requests whose deadline passed, in deadline order: ``now_ms`` in
        event time and, when ``wall_ms`` is given, ``wall_ms`` in processing time (see
        ``Joiner.advance_emitted``). Lazily: each is checked against the state when it
        comes up, after the caller resolved the ones before it."""
        self._move_inflight(now_ms)
        # (a terminal event's deadline is its time + timeout_ms: see arm)
        self._move_terminals((now_ms - self._timeout_ms) >> _TERMINAL_BITS)
        heap = self.deadlines
        waits = self.wall_waits
        pending = self._pending
        while heap and heap[0][0] <= now_ms:
            deadline, rid = heapq.heappop(heap)
            entry = pending.get(rid)
            if entry is None or self.deadline(entry) != deadline:
                continue  # stale heap item: resolved already, or deadline moved
            if wall_ms is not None and (wall_deadline := self.wall_deadline(entry)) > wall_ms:
                heapq.heappush(waits, (wall_deadline, deadline, rid))
                continue
            yield rid, entry
        while waits and (wall_ms is None or waits[0][0] <= wall_ms):
            _, deadline, rid = heapq.heappop(waits)
            entry = pending.get(rid)
            if entry is None or self.deadline(entry) != deadline:
                continue
            yield rid, entry

    def clear(self) -> None:
        """End of input: every pending request was resolved."""
        self.deadlines.clear()
        self.wall_waits.clear()
        self.terminals.clear()
        self._inflight.clear()
        self._terminal.clear()

    def oldest_terminal_ms(self) -> int | None:
        """Event time of the oldest terminal event still waiting for its partner."""
        oldest = self._oldest_moved()
        pending = self._pending
        buckets = self._terminal.by_key
        for key in sorted(buckets):  # (not moved: the processor's frontier stays)
            times = [
                e.terminal_ms
                for rid in buckets[key]
                if isinstance(e := pending.get(rid), Pending)
                and e.terminal_ms >> _TERMINAL_BITS == key
            ]
            if times:
                return min(times) if oldest is None else min(oldest, *times)
        return oldest

    def oldest_terminal_before(self, bound_ms: int) -> int | None:
        """:meth:`oldest_terminal_ms` if it is earlier than ``bound_ms``, else None.

        Only terminal events before the bound are looked at: later ones wait in their
        buckets, where most are joined (and dropped unseen) before the bound, which
        follows the watermark, reaches them.
        """
        self._move_terminals(bound_ms >> _TERMINAL_BITS)
        oldest = self._oldest_moved()
        return oldest if oldest is not None and oldest < bound_ms else None

    def _oldest_moved(self) -> int | None:
        """The oldest terminal event still waiting among those moved to the heap."""
        heap = self.terminals
        pending = self._pending
        while heap:
            ts, rid = heap[0]
            entry = pending.get(rid)
            if isinstance(entry, Pending) and entry.terminal_ms == ts:
                return ts
            heapq.heappop(heap)
        return None

    def _compact(self) -> None:
        """Drop the heaps' stale items (requests resolved, deadlines moved).

        They would only be skipped when they reach the top, but a joined request's
        in-flight deadline (``inflight_ttl_ms``, 10 min) would hold its id that long:
        at 17k requests/s, gigabytes. Rebuilding once the heap is twice the live
        state keeps it bounded at amortised O(1) per push; the order of what is
        resolved is unchanged.
        """
        pending = self._pending
        self.deadlines = [
            (d, rid)
            for d, rid in self.deadlines
            if (e := pending.get(rid)) is not None and self.deadline(e) == d
        ]
        heapq.heapify(self.deadlines)
        self.terminals = [
            (t, rid)
            for t, rid in self.terminals
            if isinstance(e := pending.get(rid), Pending) and e.terminal_ms == t
        ]
        heapq.heapify(self.terminals)
