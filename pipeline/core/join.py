"""Join state machine: lifecycle events -> one request record per request_id.

One :class:`Joiner` holds the state of one source partition (every event of a
request lands on the same partition, so partitions join independently and a
rebalance moves whole states). Time is passed in: ``advance(now_ms)`` takes
the partition's event-time clock, which the adapter derives from event
timestamps (see :class:`pipeline.core.eventtime.PartitionClock`).

Rules
-----
* A record is complete when ``gateway.completed`` and ``engine.finished`` have
  both arrived, in any order; it is emitted at once (revision 1).
* ``gateway.received`` only gives in-flight visibility (priority, tenant).
* When the first terminal event of a request arrives, its partner has
  ``timeout_ms`` to follow, counted in event time and (in a live worker) also
  in processing time (see :meth:`Joiner.advance`); then a partial record is emitted
  (revision 0): gateway-only (engine fields null; client aborts are only
  visible here) or engine-only (flagged as direct traffic). A ``gateway.completed`` of
  a request the gateway's enforcement refused before any engine saw it
  (:func:`~pipeline.core.join_rules.refused_before_engine`) has no partner to wait for:
  its partial record comes at once.
* A partner arriving after its partial record was emitted, while the request
  id is still remembered, upgrades it to a joined record (revision 1; the
  store keeps the highest revision).
* A repeated ``event_id`` is a duplicate and is ignored, and so is a terminal event
  with another id but the same content (every field but ``event_id`` equal: a producer
  that re-sent it under a new id). A repeated id whose content differs from the event
  the join holds under it is counted apart too (``JoinCounters.duplicate_ids_changed``:
  a producer reusing ids); the first event stays. Where the join no longer holds the
  event (a fully joined request past ``conflict_ttl_ms``) nothing tells.
* **Conflicts.** A second terminal event of the same kind with another id and other
  content (two ``gateway.completed`` for one request, ok then error 500) is a conflict:
  counted (``JoinCounters.conflicts``), flagged on the record (``RequestRecord.conflicts``,
  the ``requests.conflicts`` column) and resolved to the *worse* event of the two, kept
  whole (fields of two events are never mixed): a failure beats a client abort, which
  beats ok; then the longer gateway total (engine: end-to-end), then the longer first
  byte (engine: inference, then queue), then the larger event id (so the result does not
  depend on the order the events arrive in). A conflict after the record was emitted
  corrects it like a late partner upgrades a partial (``Emitted.previous`` taken back,
  counted in ``JoinCounters.conflicts_corrected``): the join keeps a fully joined
  request's events ``conflict_ttl_ms`` after its record (a failed or partial one: as long
  as it is remembered). Later than that, nothing tells a conflict from a duplicate (the
  join holds only the request id): it counts as a duplicate.
* **Attempts.** A client that retries with the same ``X-Request-Id`` sends another
  ``gateway.received`` (another ``event_id``): that starts attempt 2 (3, ...) of the
  request, joined and recorded on its own (``RequestRecord.attempt``). A terminal
  event goes to the oldest attempt still missing that side (an ``engine.finished``
  only to an attempt whose gateway waited at least the engine's end-to-end time: a
  fast 502 that never reached the engine cannot hold a long engine run; durations of
  one host each, compared, never timestamps of two). A failed attempt (outcome not
  ``ok``) followed by another is *superseded*: its record says so (and is re-emitted
  when the retry comes after it was windowed), so an SLO counting only each
  request's last attempt (``attempts: last``) skips it.
* A ``gateway.received`` with nothing else is dropped after ``inflight_ttl_ms``
  (counted as orphaned). State is bounded by ``max_pending``: beyond it the
  oldest requests are resolved early (counted as evicted).

Offsets: every pending request remembers the smallest source offset of its
events; :meth:`Joiner.safe_offset` is the offset a consumer may commit

The parts: what the join holds and gives out (:mod:`pipeline.core.join_state`: the
packed in-flight int, the resolved memory, the joined requests kept for conflicts), its
rules for an event of a request it holds and the record builder
(:mod:`pipeline.core.join_rules`), its deadlines (:mod:`pipeline.core.join_timers`);
:class:`Joiner` composes them, with the common sequence of a request inlined.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pipeline.contract.wire import AnyLifecycle, AnyReceived
from pipeline.core.join_rules import (
    DUPLICATE,
    RETRY,
    after_resolved,
    count_duplicate,
    count_repeat,
    holds_received,
    partial_record,
    received_kind,
    refused_before_engine,
    rid_of,
    route,
    store_event,
    supersede_resolved,
    worse_terminal,
)
from pipeline.core.join_state import (
    NS_PER_MS,
    OFF_SHIFT,
    RECENT_BITS,
    RESOLVED_HASH_SHIFT,
    Emitted,
    InflightCodec,
    JoinCounters,
    Pending,
    Received,
    RecentJoins,
    Resolved,
    ResolvedMemory,
    event_id_hash,
    resolved_from,
)
from pipeline.core.join_timers import JoinTimers
from pipeline.core.record import ATTEMPT_SEP, RequestRecord, attempt_key, record_of

__all__ = ["Emitted", "JoinConfig", "JoinCounters", "Joiner", "ResolvedMemory", "worse_terminal"]


@dataclass(frozen=True, slots=True)
class JoinConfig:
    timeout_ms: int = 15_000
    inflight_ttl_ms: int = 600_000
    resolved_ttl_ms: int = 600_000
    max_pending: int = 1_000_000
    max_resolved: int = 2_000_000
    # How long a fully joined request's events are kept for a conflicting terminal event
    # to correct its record (see "Conflicts"); 0: not kept (such a conflict then counts
    # as a duplicate); at most resolved_ttl_ms. Memory: a request's record and events per
    # request joined in it; CPU: ~0.4 µs/event (docs/measurement.md, "Duplicates and
    # conflicting ...").
    conflict_ttl_ms: int = 15_000
    # After the join forgets a request, what the windows counted of it is remembered
    # this long (event time), for at most max_counted requests per partition, ~9 bytes
    # each: a repeat that late is then not counted twice (pipeline/core/counted.py).
    # 0 in either: not remembered past resolved_ttl_ms.
    counted_ttl_ms: int = 86_400_000
    max_counted: int = 1_000_000

    @property
    def conflict_keep_ms(self) -> int:
        """How long joined requests' events are kept (conflict_ttl_ms, at most
        resolved_ttl_ms: a request forgotten has no record left to correct)."""
        return min(self.conflict_ttl_ms, self.resolved_ttl_ms)

    def __post_init__(self) -> None:
        for name in (
            "timeout_ms",
            "inflight_ttl_ms",
            "resolved_ttl_ms",
            "max_pending",
            "max_resolved",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"join.{name} must be > 0, got {getattr(self, name)}")
        for name in ("counted_ttl_ms", "max_counted"):
            if getattr(self, name) < 0:
                raise ValueError(f"join.{name} must be >= 0, got {getattr(self, name)}")
        if self.conflict_ttl_ms < 0:
            raise ValueError(f"join.conflict_ttl_ms must be >= 0, got {self.conflict_ttl_ms}")


@dataclass(slots=True)
class Joiner:
    config: JoinConfig = field(default_factory=JoinConfig)
    counters: JoinCounters = field(default_factory=JoinCounters)
    # A request in flight is a packed int (see join_state.InflightCodec), any other a
    # Pending.
    _pending: dict[str, Pending | int] = field(default_factory=dict)
    # A fully joined request is remembered by its expiry alone (an int: ~3x smaller
    # than a Resolved); requests whose events are kept hold a Resolved.
    _resolved: ResolvedMemory = field(init=False)
    # Fully joined requests' records and events, for conflict_keep_ms after their record.
    _recent: RecentJoins = field(init=False)
    _conflict_ms: int = 0  # JoinConfig.conflict_keep_ms
    _timers: JoinTimers = field(init=False)
    _codec: InflightCodec = field(default_factory=InflightCodec)
    _evicted: list[Emitted] = field(default_factory=list)
    # request id -> its latest attempt, for requests with more than one (rare)
    _attempts: dict[str, int] = field(default_factory=dict)
    # False: every event takes the general path (tests compare it with the fast paths)
    _fast: ClassVar[bool] = True

    def __post_init__(self) -> None:
        cfg = self.config
        self._resolved = ResolvedMemory(cfg.resolved_ttl_ms, cfg.max_resolved)
        self._conflict_ms = cfg.conflict_keep_ms
        self._recent = RecentJoins(self._conflict_ms)
        self._timers = JoinTimers(self._pending, cfg.inflight_ttl_ms, cfg.timeout_ms)

    def _held_received(self, rid: str, n: int, ev: AnyLifecycle) -> Received | AnyReceived | None:
        """The gateway.received the join holds under ``ev``'s id among the request's
        ``n`` attempts (the compact copy or the event), for a duplicate's content; None
        where it keeps only the id's hash (a fully joined request past conflict_ttl_ms)."""
        h = event_id_hash(ev.event_id)
        for k in range(1, n + 1):
            key = attempt_key(rid, k)
            if not holds_received(self._pending, self._resolved, key, h):
                continue
            pending = self._pending.get(key)
            if isinstance(pending, int):
                return self._codec.unpack(pending).received
            if pending is not None:
                return pending.received
            done = self._resolved.get(key)
            kept = self._recent.get(key, self._attempts) if isinstance(done, int) else done
            return None if kept is None else kept.received
        return None

    def _unpack(self, v: int) -> Pending:
        entry = self._codec.unpack(v)
        entry.deadline_ms = self._timers.deadline(v)
        entry.wall_deadline_ms = self._timers.wall_deadline(v)
        return entry

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def add(
        self, event: AnyLifecycle, offset: int, wall_ms: int | None = None
    ) -> RequestRecord | None:
        """Feed one event; returns the record it completes, if any (see :meth:`add_emitted`)."""
        out = self.add_emitted(event, offset, wall_ms)
        return out.record if out is not None else None

    def add_emitted(
        self, event: AnyLifecycle, offset: int, wall_ms: int | None = None, now_ms: int = 0
    ) -> Emitted | None:
        """Feed one event; returns a record when this event completes a request.

        ``wall_ms`` (processing time) arms the second timeout condition; None
        (a replay of a file) times out on event time alone. ``now_ms``: the partition's
        clock; a partner's timeout runs from the later of it and the event's own time,
        so an event from a host whose clock is behind still waits the full timeout.
        """
        self.counters.events += 1
        rid = event.request_id
        kind = event.kind
        if self._fast and rid not in self._attempts:
            # The common sequence of a request's first attempt, with the fewest lookups:
            # what the general path below does for it (the test suite checks that both
            # give the same records, counters and offsets).
            pending = self._pending
            entry = pending.get(rid)
            if kind == "gateway.received":
                if entry is None and self._resolved.get(rid) is None:
                    # A new request: held as one packed int.
                    if len(pending) >= self.config.max_pending:
                        self._evict_oldest()
                    packed = self._codec.pack(event, offset, wall_ms)  # type: ignore[arg-type]
                    if packed is not None:
                        pending[rid] = packed
                        self._timers.arm(
                            rid, event.ts_unix_ns // NS_PER_MS + self.config.inflight_ttl_ms
                        )
                        return None
            elif entry is not None and not refused_before_engine(event):
                # (never resolved too: no _resolved lookup; a refusal: the general path)
                if isinstance(entry, int):
                    # Its first terminal event: its partner now has timeout_ms to arrive.
                    entry = pending[rid] = self._codec.unpack(entry)
                    if kind == "gateway.completed":
                        entry.completed = event  # type: ignore[assignment]
                    else:
                        entry.finished = event  # type: ignore[assignment]
                    ts_ms = max(event.ts_unix_ns // NS_PER_MS, now_ms)
                    entry.terminal_ms = ts_ms
                    deadline = entry.deadline_ms = ts_ms + self.config.timeout_ms
                    entry.wall_deadline_ms = (
                        wall_ms + self.config.timeout_ms if wall_ms is not None else 0
                    )
                    self._timers.arm(rid, deadline, ts_ms)
                    return None
                if kind == "gateway.completed":
                    joins = entry.completed is None and entry.finished is not None
                else:
                    joins = entry.finished is None and entry.completed is not None
                if joins:
                    # The partner of a request's first terminal event: its record.
                    if kind == "gateway.completed":
                        entry.completed = event  # type: ignore[assignment]
                    else:
                        entry.finished = event  # type: ignore[assignment]
                    return self._join(rid, entry, max(event.ts_unix_ns // NS_PER_MS, now_ms))
        key, attempt = rid, 1
        if kind == "gateway.received":
            which = received_kind(self._pending, self._resolved, self._attempts, rid, event)  # type: ignore[arg-type]
            n = self._attempts.get(rid, 1)
            if which is DUPLICATE:
                count_duplicate(self._held_received(rid, n, event), event, self.counters)
                return None
            if which is RETRY:
                return self._start_attempt(rid, n, event, offset, wall_ms)  # type: ignore[arg-type]
            key, attempt = attempt_key(rid, n), n
        elif rid in self._attempts:
            key, attempt = route(self._pending, self._resolved, rid, self._attempts[rid], event)
        done = self._resolved.get(key)
        if done is not None:
            if isinstance(done, int):
                recent = (
                    self._recent.get(key, self._attempts) if kind != "gateway.received" else None
                )
                if recent is not None:
                    return after_resolved(recent, key, event, self.counters)
                count_repeat(event, None, self.counters)  # its events are no longer kept
                return None
            return after_resolved(done, key, event, self.counters)
        entry = self._pending.get(key)
        if entry is None:
            if len(self._pending) >= self.config.max_pending:
                self._evict_oldest()
            if kind == "gateway.received" and attempt == 1:
                packed = self._codec.pack(event, offset, wall_ms)  # type: ignore[arg-type]
                if packed is not None:
                    self._pending[key] = packed
                    self._timers.arm(
                        key, event.ts_unix_ns // NS_PER_MS + self.config.inflight_ttl_ms
                    )
                    return None
            entry = self._pending[key] = Pending(offset, attempt)
        elif isinstance(entry, int):
            if kind == "gateway.received":  # (another id would have been a retry)
                count_duplicate(self._codec.unpack(entry).received, event, self.counters)
                return None
            entry = self._pending[key] = self._unpack(entry)
        if not store_event(entry, event, self.counters):
            return None
        ts_ms = max(event.ts_unix_ns // NS_PER_MS, now_ms)
        if entry.completed is not None and entry.finished is not None:
            return self._join(key, entry, ts_ms)
        if kind == "gateway.received":
            if entry.completed is not None or entry.finished is not None:
                return None  # the partner's timeout is already running
            wait_ms = self.config.inflight_ttl_ms
        elif entry.finished is None and refused_before_engine(event):
            return self._resolve_partial(key, entry, ts_ms)  # no partner will come
        else:
            # First terminal event: its partner now has timeout_ms to arrive.
            wait_ms = self.config.timeout_ms
            entry.terminal_ms = ts_ms
            self._timers.push_terminal(ts_ms, key)
        entry.deadline_ms = ts_ms + wait_ms
        entry.wall_deadline_ms = wall_ms + wait_ms if wall_ms is not None else 0
        self._timers.push_deadline(entry.deadline_ms, key)
        return None

    def _join(self, key: str, entry: Pending, ts_ms: int) -> Emitted:
        """Both terminal events are in: the request's record (revision 2 or 3)."""
        del self._pending[key]
        self.counters.joined += 1
        received, completed, finished = entry.received, entry.completed, entry.finished
        attempt = entry.attempt
        rec = record_of(
            key if attempt == 1 else rid_of(key, attempt), received, completed, finished,
            attempt, entry.retried, entry.conflicts,
        )  # fmt: skip
        if rec.superseded:
            self.counters.superseded += 1
        if received is None or rec.outcome != "ok":
            # Joined before its gateway.received (producers reordered): keep the
            # events so that a late received can still add priority/tenant; a failed
            # attempt: so that a retry can supersede it.
            self._resolved.put(key, resolved_from(entry, ts_ms + self.config.resolved_ttl_ms))
        else:
            # A fully joined request is remembered by its expiry and received hash alone
            # (one dict operation: a new key is what makes the dict grow).
            self._resolved.put(
                key,
                (ts_ms + self.config.resolved_ttl_ms)
                | (((received.id_hash & 0xFFFFFFFF) + 1) << RESOLVED_HASH_SHIFT),
            )
            if self._conflict_ms:
                out = Emitted(rec, entry.first_offset, False, None, (received, completed, finished))
                recent = self._recent  # (its generation stored into here: once per request)
                gen = recent.gen if ts_ms >> RECENT_BITS == recent.at else recent.generation(ts_ms)
                held = out if not entry.seen else resolved_from(entry, ts_ms + self._conflict_ms)
                gen[key] = (ts_ms, held)
                return out
        return Emitted(rec, entry.first_offset, False, None, (received, completed, finished))

    def _start_attempt(
        self, rid: str, n: int, event: AnyReceived, offset: int, wall_ms: int | None
    ) -> Emitted | None:
        """Start attempt n + 1 of a request; the previous attempt, if it failed, is
        superseded (returned re-emitted when it was windowed already)."""
        self._attempts[rid] = n + 1
        self.counters.attempts += 1
        if len(self._pending) >= self.config.max_pending:
            self._evict_oldest()
        key = attempt_key(rid, n + 1)
        entry = self._pending[key] = Pending(offset, n + 1)
        store_event(entry, event, self.counters)
        entry.deadline_ms = event.ts_unix_ns // NS_PER_MS + self.config.inflight_ttl_ms
        entry.wall_deadline_ms = wall_ms + self.config.inflight_ttl_ms if wall_ms is not None else 0
        self._timers.push_deadline(entry.deadline_ms, key)
        return self._supersede(attempt_key(rid, n))

    def _supersede(self, key: str) -> Emitted | None:
        pending = self._pending.get(key)
        if pending is not None:
            if isinstance(pending, int):
                pending = self._pending[key] = self._unpack(pending)
                self._timers.push_deadline(pending.deadline_ms, key)
            pending.retried = True  # its record, when it comes, is built superseded
            return None
        done = self._resolved.get(key)
        if not isinstance(done, Resolved):
            return None  # joined and ok (never superseded), or forgotten
        return supersede_resolved(done, key, self.counters)

    def seed_resolved(self, key: str, expires_ms: int) -> None:
        """Remember a request (attempt: its ledger key, see :func:`attempt_key`) another
        worker (or an earlier run) counted complete: any event of it is then a duplicate
        (its gateway.received id is unknown, so another received is taken for a repeat,
        not a retry). Call in order of expiry, before any event."""
        if key not in self._resolved:
            rid, sep, n = key.rpartition(ATTEMPT_SEP)
            if sep and n.isdigit() and int(n) > self._attempts.get(rid, 1):
                self._attempts[rid] = int(n)
            self._resolved.put(key, expires_ms)

    def _resolve_partial(self, key: str, entry: Pending | int, now_ms: int) -> Emitted | None:
        del self._pending[key]
        if isinstance(entry, int) or (entry.completed is None and entry.finished is None):
            self.counters.orphaned_received += 1
            return None
        expires_ms = now_ms + self.config.resolved_ttl_ms
        self._resolved.put(key, resolved_from(entry, expires_ms, partial=True))
        return partial_record(key, entry, self.counters)

    def evict(self, n: int) -> None:
        """Resolve the ``n`` oldest pending requests early (counted as evicted); their
        partial records come out of the next :meth:`advance_emitted`."""
        for _ in range(min(n, len(self._pending))):
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        rid = next(iter(self._pending))
        entry = self._pending[rid]
        self.counters.evicted += 1
        rec = self._resolve_partial(rid, entry, self._timers.deadline(entry))
        if rec is not None:
            self._evicted.append(rec)

    def advance(self, now_ms: int, wall_ms: int | None = None) -> list[RequestRecord]:
        """Records of requests whose partner is overdue (see :meth:`advance_emitted`)."""
        return [e.record for e in self.advance_emitted(now_ms, wall_ms)]

    def advance_emitted(self, now_ms: int, wall_ms: int | None = None) -> list[Emitted]:
        """Resolve every request whose partner is overdue.

        Overdue means ``timeout_ms`` has passed in event time (``now_ms``) and,
        when ``wall_ms`` is given, also in processing time. Event time alone
        would time out too early when one producer's messages sit far ahead of
        another's in the log (a backlog, a buffering producer); processing
        time alone would make a replay's results depend on its speed.
        """
        out = self._evicted
        self._evicted = []
        for rid, entry in self._timers.due(now_ms, wall_ms):
            rec = self._resolve_partial(rid, entry, now_ms)
            if rec is not None:
                out.append(rec)
        self._resolved.expire(now_ms)
        self._recent.expire(now_ms)
        return out

    def drain(self) -> list[RequestRecord]:
        return [e.record for e in self.drain_emitted()]

    def drain_emitted(self) -> list[Emitted]:
        """End of input: resolve everything pending as if its timeout had passed."""
        out = self._evicted
        self._evicted = []
        for rid, entry in list(self._pending.items()):
            rec = self._resolve_partial(rid, entry, self._timers.deadline(entry))
            if rec is not None:
                out.append(rec)
        self._timers.clear()
        return out

    def oldest_terminal_ms(self) -> int | None:
        """Event time of the oldest terminal event still waiting for its partner.

        Its record (joined or partial) will end no earlier than this, so windows
        from here on must stay open until it is resolved.
        """
        return self._timers.oldest_terminal_ms()

    def oldest_terminal_before(self, bound_ms: int) -> int | None:
        """:meth:`oldest_terminal_ms` if it is earlier than ``bound_ms``, else None
        (cheaper: see :meth:`JoinTimers.oldest_terminal_before`)."""
        return self._timers.oldest_terminal_before(bound_ms)

    def safe_offset(self, next_offset: int, *, lone_received_durable: bool = False) -> int:
        """Smallest offset whose events may still be needed (commit up to here).

        ``lone_received_durable``: a request known only by its ``gateway.received`` does
        not hold the commit back, because the caller keeps that event durably elsewhere
        and gives it back with :meth:`add` after a restart (the worker: the raw events
        table). Without it, a lone received pins the commit for ``inflight_ttl_ms``.
        """
        for entry in self._pending.values():  # insertion order = offset order
            if isinstance(entry, int):
                if lone_received_durable:
                    continue
                return min(entry >> OFF_SHIFT, next_offset)
            if lone_received_durable and entry.completed is None and entry.finished is None:
                continue
            return min(entry.first_offset, next_offset)
        return next_offset
