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
  visible here) or engine-only (flagged as direct traffic).
* A partner arriving after its partial record was emitted, while the request
  id is still remembered, upgrades it to a joined record (revision 1; the
  store keeps the highest revision).
* A repeated ``event_id`` is a duplicate and is ignored, and so is a terminal event
  with another id but the same content (every field but ``event_id`` equal: a producer
  that re-sent it under a new id).
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
without losing any state that lives only in memory.
"""

from __future__ import annotations

import heapq
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar, Final

import msgspec

from pipeline.contract.wire import AnyCompleted, AnyFinished, AnyLifecycle, AnyReceived
from pipeline.core.record import (
    ATTEMPT_SEP,
    ReceivedFields,
    RequestRecord,
    attempt_key,
    build_record,
    record_of,
)

_NS_PER_MS: Final = 1_000_000
# A fully joined request is remembered as one int: its expiry (ms, low bits) and a
# 32-bit hash of its gateway.received event id + 1 (0: unknown), which tells a retry
# (another received) from a duplicate of the one it had.
_RESOLVED_HASH_SHIFT: Final = 56
_RESOLVED_EXPIRY_MASK: Final = (1 << _RESOLVED_HASH_SHIFT) - 1
# An engine run may look up to this much longer than its gateway's wait (the two hosts'
# timers differ slightly) and still belong to that attempt.
_ENGINE_FIT_SLACK_MS: Final = 50.0
_COMPACT_SLACK: Final = 1024
_MAX_CONFLICTS: Final = 65_535  # requests.conflicts is a UInt16

# A request in flight (gateway.received only: the bulk of the join state) is held as
# one int packing what a record takes from the event, little-endian bytes of
# ``_PACK`` (packed and unpacked by ``struct``: one C call each way, ~1 µs less than
# shifting the fields in), low bits first: stream (1) and priority (4) in one byte,
# host, model and tenant as indices into the joiner's string table (2 bytes each,
# < 2**12, tenant 0 = None), prompt_tokens + 1 (4 bytes, < 2**24, 0 = None),
# wall_ms + 1 (6 bytes, < 2**44, 0 = None), a 64-bit hash of the event id (duplicates
# are told from conflicts by it), ts_unix_ns (8 bytes) and the source offset (8 bytes:
# an int carries no leading zero bytes, so a small offset costs little). Values that
# do not fit fall back to a _Pending holding a _Received.
_PACK: Final = struct.Struct("<BHHHIIHQQQ")
_UNPACK: Final = struct.Struct("<BHHHI6xQQQ")  # without wall_ms (the deadlines take it)
_PRIO_SHIFT: Final = 1
_HOST_SHIFT: Final = 8
_MODEL_SHIFT: Final = 24
_TENANT_SHIFT: Final = 40
_PROMPT_SHIFT: Final = 56
_WALL_SHIFT: Final = 88
_HASH_SHIFT: Final = 136
_TS_SHIFT: Final = 200
_OFF_SHIFT: Final = 264
_PACK_BYTES: Final = 41
_M64: Final = (1 << 64) - 1
_MAX_STRINGS: Final = 1 << 12
_MAX_PROMPT: Final = (1 << 24) - 2
_MAX_WALL: Final = (1 << 44) - 2
# In-flight deadlines wait in buckets of 2**_BUCKET_BITS ms (one list slot per request)
# and move to the deadline heap when event time reaches their bucket.
_BUCKET_BITS: Final = 14
# A first terminal event waits likewise, by its time, in buckets of 2**_TERMINAL_BITS ms
# (4 s): one list slot per request for both its partner's deadline (its time +
# timeout_ms) and the oldest-terminal lookup (``Joiner.oldest_terminal_before``). A
# bucket moves to the two heaps, its requests still waiting, when event time nears
# either; by then (11 s or more after the event) nearly all are joined: dropped with
# one dict lookup instead of pushed through two heaps of tuples and popped (or
# compacted) from them again (~17 tuple comparisons on scattered memory a pop).
_TERMINAL_BITS: Final = 12
# Joined requests' events are kept (for conflicts) in generations of 2**_RECENT_BITS ms.
_RECENT_BITS: Final = 12


_SAME: Final = object()
_DUPLICATE: Final = object()
_RETRY: Final = object()


def _id_hash(event_id: str) -> int:
    return hash(event_id) & _M64


def _short_hash(id_hash: int) -> int:
    return (id_hash & 0xFFFFFFFF) + 1


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


Parts = tuple["ReceivedFields | None", AnyCompleted | None, AnyFinished | None]


class Emitted(msgspec.Struct, frozen=True, gc=False):
    """A record with what the windows need to know about it.

    A msgspec Struct (one per record on the hot path): a frozen dataclass's constructor
    costs ~1 µs more. ``gc=False``: it holds records and events, which hold nothing back.
    """

    record: RequestRecord
    first_offset: int  # smallest source offset of the events it was built from (-1: unknown)
    upgrade: bool = False  # a late partner completed a partial record already emitted
    # The record this one replaces (emitted, hence windowed, before): windows take it back.
    previous: RequestRecord | None = None
    parts: Parts | None = None  # the events it was built from (see version)

    def version(self, code: int) -> RequestRecord | None:
        """The record this request had at ledger ``code`` (``pipeline.core.windows.
        ledger_code``: revision, which side of a partial, superseded), built from the same
        events; None if these events cannot make it. For a restarted worker that learns
        from the store which version of a replayed request it windowed."""
        if self.parts is None:
            return None
        received, completed, finished = self.parts
        revision, engine_only, superseded = code & 3, bool(code & 4), bool(code & 8)
        if revision & 1 and received is None:
            return None
        rcv = received if revision & 1 else None
        if revision >= 2:
            cpl, fin = completed, finished
        elif engine_only:
            cpl, fin = None, finished
        else:
            cpl, fin = completed, None
        if (revision >= 2 and (cpl is None or fin is None)) or (cpl is None and fin is None):
            return None
        rec = self.record
        # (the conflicts of the version counted are taken to be this one's: the events
        # set aside are not kept)
        out = build_record(
            rec.request_id, rcv, cpl, fin, attempt=rec.attempt, retried=superseded,
            conflicts=rec.conflicts,
        )  # fmt: skip
        if out.superseded != superseded:
            return None
        return out


@dataclass(slots=True)
class JoinCounters:
    events: int = 0
    duplicates: int = 0
    conflicts: int = 0  # conflicting terminal events (see "Conflicts")
    conflicts_corrected: int = 0  # of them, after the record was emitted: corrected
    joined: int = 0
    gateway_only: int = 0
    engine_only: int = 0
    upgraded: int = 0
    orphaned_received: int = 0
    evicted: int = 0
    late_after_resolved: int = 0
    attempts: int = 0  # retries: gateway.received of a request id seen before
    superseded: int = 0  # failed attempts followed by another attempt

    def add(self, other: JoinCounters) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class _Received(msgspec.Struct, gc=False):
    """What the join keeps of a ``gateway.received`` once a terminal event joined it
    (or when it does not fit the packed in-flight int): the fields a record takes, and
    a 64-bit hash of the event id (duplicates are told from conflicts by it). A Struct
    without GC tracking (scalars and strings only): built in C, ~0.5 µs less a request."""

    id_hash: int
    ts_unix_ns: int
    host: str
    model: str
    priority: int
    tenant: str | None
    prompt_tokens: int | None
    stream: bool


def _same_id(slot: _Received | AnyLifecycle, event: AnyLifecycle) -> bool:
    if isinstance(slot, _Received):
        return slot.id_hash == _id_hash(event.event_id)
    return slot.event_id == event.event_id


class _Pending(msgspec.Struct, gc=False):
    """A request with more than its gateway.received (or one that does not fit the
    in-flight int). A Struct built in C; ``gc=False``: it holds events, which hold
    nothing back, so it can take part in no reference cycle."""

    first_offset: int
    attempt: int = 1
    retried: bool = False  # a later attempt of the request exists
    received: _Received | None = None
    completed: AnyCompleted | None = None
    finished: AnyFinished | None = None
    deadline_ms: int = 0
    wall_deadline_ms: int = 0
    terminal_ms: int = 0  # event time of its first terminal event (0: none yet)
    conflicts: int = 0  # conflicting terminal events set aside (see "Conflicts")
    seen: tuple[int, ...] = ()  # after a conflict: _marks of its terminal events


class _Resolved(msgspec.Struct, gc=False):
    """A resolved request whose events are kept (see ``Joiner._resolved``)."""

    expires_ms: int
    # Kept for partial records (a late partner can upgrade them), records joined before
    # their gateway.received, and failed attempts (a retry supersedes them).
    received: _Received | AnyReceived | None = None
    completed: AnyCompleted | None = None
    finished: AnyFinished | None = None
    partial: bool = False
    attempt: int = 1
    retried: bool = False
    # smallest source offset of its events: an upgrade's window holds the commit back to
    # it, so that a worker resuming before that window is written re-reads every event
    # the upgraded record needs (-1: unknown)
    first_offset: int = -1
    conflicts: int = 0
    seen: tuple[int, ...] = ()


_GENERATIONS: Final = 8  # a resolved memory's generations per resolved_ttl_ms (see below)
_NEVER: Final = 1 << 62


class ResolvedMemory:
    """What the join remembers of resolved requests: key -> a packed int (fully joined:
    its expiry and received hash) or a :class:`_Resolved`, for ``resolved_ttl_ms``.

    Held in generations by expiry (``span_ms`` of expiry times each), each dropped whole
    once every entry in it has expired: no request is deleted one by one. A dict that
    loses one key for each it gains keeps the deleted slots until a resize (CPython
    resizes it to three times its live keys: +60 MiB at 2 M requests, session 9),
    and its keys, freed one by one among newer objects, leave pymalloc's pools part
    full; a generation's keys are freed together, and the memory then holds at most
    one generation more than ``ttl`` needs.

    A lookup checks the entry's own expiry against the last :meth:`expire`, so a
    request is remembered until exactly its expiry whatever the generations. Over
    ``max_items``, the oldest generation is forgotten at once (within the newest one,
    the oldest entries one by one).
    """

    __slots__ = ("_by_index", "_drop_at_ms", "_gens", "_len", "_max", "_now_ms", "_span_ms")

    def __init__(self, ttl_ms: int, max_items: int) -> None:
        self._span_ms = max(ttl_ms // _GENERATIONS, 1)
        self._max = max_items
        self._by_index: dict[int, dict[str, _Resolved | int]] = {}
        self._gens: list[dict[str, _Resolved | int]] = []  # newest first (lookups)
        self._len = 0
        self._now_ms = 0  # entries expiring at or before it are gone
        self._drop_at_ms = _NEVER  # when the oldest generation is over

    def __len__(self) -> int:
        """Entries held (expired ones of a generation not yet dropped included)."""
        return self._len

    def get(self, key: str) -> _Resolved | int | None:
        for gen in self._gens:
            v = gen.get(key)
            if v is not None:
                return v if _expiry(v) > self._now_ms else None
        return None

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def put(self, key: str, value: _Resolved | int) -> None:
        """Remember ``key`` (not remembered now: the join never puts a key twice while
        it is remembered; an expired copy in an older generation is shadowed)."""
        index = _expiry(value) // self._span_ms
        gen = self._by_index.get(index)
        if gen is None:
            gen = self._by_index[index] = {}
            self._regenerate()
        n = len(gen)
        gen[key] = value
        self._len += len(gen) - n
        if self._len > self._max:
            self._drop_oldest()

    def expire(self, now_ms: int) -> None:
        """Event time is ``now_ms``: forget what expired by then."""
        if now_ms > self._now_ms:
            self._now_ms = now_ms
            if now_ms >= self._drop_at_ms:
                for i in [i for i in self._by_index if (i + 1) * self._span_ms <= now_ms]:
                    self._len -= len(self._by_index.pop(i))
                self._regenerate()

    def _regenerate(self) -> None:
        order = sorted(self._by_index, reverse=True)
        self._gens = [self._by_index[i] for i in order]
        self._drop_at_ms = (order[-1] + 1) * self._span_ms if order else _NEVER

    def _drop_oldest(self) -> None:
        oldest = min(self._by_index)
        if len(self._by_index) > 1:
            self._len -= len(self._by_index.pop(oldest))
            self._regenerate()
            return
        gen = self._by_index[oldest]
        while self._len > self._max:
            del gen[next(iter(gen))]
            self._len -= 1

    def items(self) -> dict[str, _Resolved | int]:
        """What :meth:`get` finds, key by key (tests, probes): each key's newest copy,
        unless that one has expired."""
        seen: set[str] = set()
        out: dict[str, _Resolved | int] = {}
        for gen in self._gens:  # newest first
            for k, v in gen.items():
                if k not in seen:
                    seen.add(k)
                    if _expiry(v) > self._now_ms:
                        out[k] = v
        return out

    def keys(self) -> list[str]:
        return list(self.items())


def _expiry(value: _Resolved | int) -> int:
    return value & _RESOLVED_EXPIRY_MASK if isinstance(value, int) else value.expires_ms


def _received_hash(received: _Received | AnyReceived | None) -> int | None:
    if received is None:
        return None
    if isinstance(received, _Received):
        return received.id_hash
    return _id_hash(received.event_id)


def _rid_of(key: str, attempt: int) -> str:
    return key if attempt == 1 else key.rpartition(ATTEMPT_SEP)[0]


def _build(
    key: str, attempt: int, retried: bool, parts: Parts, conflicts: int = 0
) -> RequestRecord:
    return record_of(_rid_of(key, attempt), *parts, attempt, retried, conflicts)


# Outcomes by how bad they are for a conflict (any other outcome, a failure: 2).
_OUTCOME_RANK: Final = {"ok": 0, "client_abort": 1}
_FINISH_RANK: Final = {"stop": 0, "length": 0, "abort": 1}


def _badness(ev: AnyCompleted | AnyFinished) -> tuple[int, float, float, float, str]:
    """How bad a terminal event is for its request (see "Conflicts": the larger, the
    worse; a total order over events of one kind, ties broken by the event id)."""
    if ev.kind == "gateway.completed":
        ttfb = ev.ttfb_ms
        return (
            _OUTCOME_RANK.get(ev.outcome, 2), ev.total_ms,
            math.inf if ttfb is None else ttfb, float(ev.http_status),
            ev.event_id,
        )  # fmt: skip
    fin: AnyFinished = ev
    return (
        _FINISH_RANK.get(fin.finish_reason, 2), fin.e2e_ms, fin.inference_ms, fin.queue_ms,
        fin.event_id,
    )  # fmt: skip


def worse_terminal(a: AnyCompleted | AnyFinished, b: AnyCompleted | AnyFinished) -> bool:
    """Whether terminal event ``a`` is worse than ``b`` (same kind; see "Conflicts")."""
    return _badness(a) > _badness(b)


def _content(ev: AnyLifecycle) -> dict[str, object]:
    """An event's fields but its id (and kind): equal content, another id, is a duplicate."""
    d: dict[str, object] = (
        msgspec.structs.asdict(ev) if isinstance(ev, msgspec.Struct) else ev.model_dump()
    )
    d.pop("event_id", None)
    d.pop("kind", None)
    return d


def _repeats(slot: AnyLifecycle, event: AnyLifecycle) -> bool:
    """A terminal event the join holds already: the same id, or the same content."""
    return slot.event_id == event.event_id or _content(slot) == _content(event)


def _marks(ev: AnyLifecycle) -> tuple[int, int]:
    """Hashes of an event's id and of its content: a repeat of an event set aside as
    conflicting is a duplicate too, so the conflict count does not depend on the order."""
    return hash(ev.event_id), hash(tuple(_content(ev).items()))


def _terminal_key(entry: _Pending | int) -> int | None:
    """The bucket of a pending request's first terminal event (None: none yet)."""
    return entry.terminal_ms >> _TERMINAL_BITS if isinstance(entry, _Pending) else None


def _bucket_put(buckets: dict[int, list[str]], keys: list[int], key: int, rid: str) -> None:
    """Add a request id to a bucket (``keys``: a heap of the buckets' keys)."""
    bucket = buckets.get(key)
    if bucket is None:
        bucket = buckets[key] = []
        heapq.heappush(keys, key)
    bucket.append(rid)


def _bucket_take(
    buckets: dict[int, list[str]], keys: list[int], frontier: int
) -> Iterator[tuple[int, list[str]]]:
    """Remove and yield the buckets up to ``frontier``, in key order."""
    while keys and keys[0] <= frontier:
        key = heapq.heappop(keys)
        yield key, buckets.pop(key)


def _bucket_compact(
    buckets: dict[int, list[str]],
    pending: dict[str, _Pending | int],
    key_of: Callable[[_Pending | int], int | None],
) -> tuple[list[int], int]:
    """Keep in each bucket the ids of pending requests whose bucket it still is
    (``key_of`` their state); returns the heap of the buckets' keys and the ids kept."""
    n = 0
    for key, bucket in list(buckets.items()):
        live = [rid for rid in bucket if (e := pending.get(rid)) is not None and key_of(e) == key]
        if live:
            buckets[key] = live
            n += len(live)
        else:
            del buckets[key]
    keys = list(buckets)
    heapq.heapify(keys)
    return keys, n


@dataclass(slots=True)
class Joiner:
    config: JoinConfig = field(default_factory=JoinConfig)
    counters: JoinCounters = field(default_factory=JoinCounters)
    # A request in flight is a packed int (see _TS_SHIFT), any other a _Pending.
    _pending: dict[str, _Pending | int] = field(default_factory=dict)
    # A fully joined request is remembered by its expiry alone (an int: ~3x smaller
    # than a _Resolved); requests whose events are kept hold a _Resolved.
    _resolved: ResolvedMemory = field(init=False)
    # Fully joined requests' records and events, for conflict_ttl_ms after their record
    # (their entry in _resolved is an int): a conflicting terminal event corrects the
    # record. Generations by join time (>> _RECENT_BITS) of key -> (join ms, the Emitted,
    # or the _Resolved it became once looked up); dropped whole once expired. Storing
    # the Emitted the join returns anyway costs one dict store a request (a _Resolved put
    # in a ResolvedMemory cost ~2 µs a request).
    _recent: dict[int, dict[str, tuple[int, Emitted | _Resolved]]] = field(default_factory=dict)
    _recent_gen: dict[str, tuple[int, Emitted | _Resolved]] = field(default_factory=dict)
    _recent_at: int = -1  # the generation _recent_gen is
    _recent_now: int = 0  # the clock at the last advance: entries expired by then are gone
    _conflict_ms: int = 0  # JoinConfig.conflict_keep_ms
    _deadlines: list[tuple[int, str]] = field(default_factory=list)
    _wall_waits: list[tuple[int, int, str]] = field(default_factory=list)
    _terminals: list[tuple[int, str]] = field(default_factory=list)
    _evicted: list[Emitted] = field(default_factory=list)
    # In-flight deadlines by bucket (deadline_ms >> _BUCKET_BITS): request ids, checked
    # against the live state when their bucket moves to _deadlines.
    _buckets: dict[int, list[str]] = field(default_factory=dict)
    _bucket_keys: list[int] = field(default_factory=list)
    _bucket_items: int = 0
    _frontier: int = -1  # buckets up to here have moved to _deadlines
    # Pending requests by their first terminal event (terminal_ms >> _TERMINAL_BITS)
    _tbuckets: dict[int, list[str]] = field(default_factory=dict)
    _tbucket_keys: list[int] = field(default_factory=list)
    _tbucket_items: int = 0
    _tfrontier: int = -1  # terminal buckets up to here have moved to the heaps
    _string_ids: dict[str, int] = field(default_factory=dict)
    _strings: list[str] = field(default_factory=lambda: [""])  # index 0: tenant None
    # request id -> its latest attempt, for requests with more than one (rare)
    _attempts: dict[str, int] = field(default_factory=dict)
    # False: every event takes the general path (tests compare it with the fast paths)
    _fast: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self._resolved = ResolvedMemory(self.config.resolved_ttl_ms, self.config.max_resolved)
        self._conflict_ms = self.config.conflict_keep_ms

    def _string_id(self, s: str) -> int:
        i = self._string_ids.get(s)
        if i is None:
            i = len(self._strings)
            if i >= _MAX_STRINGS:
                return -1
            self._string_ids[s] = i
            self._strings.append(s)
        return i

    def _pack(self, ev: AnyReceived, offset: int, wall_ms: int | None) -> int | None:
        """The in-flight int of a ``gateway.received`` (None: a value does not fit)."""
        ids = self._string_ids  # (known strings without a call: the common case)
        host = ids.get(ev.host)
        if host is None:
            host = self._string_id(ev.host)
        model = ids.get(ev.model)
        if model is None:
            model = self._string_id(ev.model)
        tenant = 0 if ev.tenant is None else ids.get(ev.tenant)
        if tenant is None:
            tenant = self._string_id(ev.tenant)  # type: ignore[arg-type]
        prompt = ev.prompt_tokens
        ts = ev.ts_unix_ns
        prio = ev.priority
        if (
            host < 0
            or model < 0
            or tenant < 0
            or not 0 <= prio <= 15
            or not 0 <= ts <= _M64
            or not 0 <= offset <= _M64
            or (prompt is not None and not 0 <= prompt <= _MAX_PROMPT)
            or (wall_ms is not None and not 0 <= wall_ms <= _MAX_WALL)
        ):
            return None
        wall = 0 if wall_ms is None else wall_ms + 1
        return int.from_bytes(
            _PACK.pack(
                (prio << 1) | (1 if ev.stream else 0), host, model, tenant,
                0 if prompt is None else prompt + 1, wall & 0xFFFFFFFF, wall >> 32,
                hash(ev.event_id) & _M64, ts, offset,
            ),
            "little",
        )  # fmt: skip

    def _unpack(self, v: int) -> _Pending:
        entry = self._unpack_joining(v)
        entry.deadline_ms = self._deadline(v)
        entry.wall_deadline_ms = self._wall_deadline(v)
        return entry

    def _unpack_joining(self, v: int) -> _Pending:
        """The pending state of an in-flight int, its deadlines left for the caller to
        set (a terminal event joining it restarts them)."""
        strings = self._strings
        prio_stream, host, model, tenant, prompt, id_hash, ts, offset = _UNPACK.unpack(
            v.to_bytes(_PACK_BYTES, "little")
        )
        entry = _Pending(offset)
        entry.received = _Received(
            id_hash, ts, strings[host], strings[model], prio_stream >> 1,
            strings[tenant] if tenant else None, prompt - 1 if prompt else None,
            bool(prio_stream & 1),
        )  # fmt: skip
        return entry

    def _deadline(self, entry: _Pending | int) -> int:
        if isinstance(entry, int):
            return ((entry >> _TS_SHIFT) & _M64) // _NS_PER_MS + self.config.inflight_ttl_ms
        return entry.deadline_ms

    def _wall_deadline(self, entry: _Pending | int) -> int:
        if isinstance(entry, int):
            wall = (entry >> _WALL_SHIFT) & 0xFFFFFFFFFFF
            return wall - 1 + self.config.inflight_ttl_ms if wall else 0
        return entry.wall_deadline_ms

    def _push_deadline(self, deadline_ms: int, rid: str) -> None:
        heapq.heappush(self._deadlines, (deadline_ms, rid))
        if len(self._deadlines) > 2 * len(self._pending) + _COMPACT_SLACK:
            self._compact()

    def _arm_inflight(self, rid: str, deadline_ms: int) -> None:
        key = deadline_ms >> _BUCKET_BITS
        if key <= self._frontier:
            self._push_deadline(deadline_ms, rid)
            return
        bucket = self._buckets.get(key)  # (_bucket_put inlined: once per request)
        if bucket is None:
            _bucket_put(self._buckets, self._bucket_keys, key, rid)
        else:
            bucket.append(rid)
        self._bucket_items += 1
        if self._bucket_items > 2 * len(self._pending) + _COMPACT_SLACK:
            self._compact_buckets()

    def _arm_terminal(self, rid: str, terminal_ms: int, deadline_ms: int) -> None:
        """Arm a pending request's first terminal event and its partner's deadline
        (``terminal_ms + timeout_ms``): into its bucket, or the heaps when their
        frontier passed it already."""
        key = terminal_ms >> _TERMINAL_BITS
        if key <= self._tfrontier:
            heapq.heappush(self._terminals, (terminal_ms, rid))
            self._push_deadline(deadline_ms, rid)
            return
        bucket = self._tbuckets.get(key)  # (_bucket_put inlined: once per request)
        if bucket is None:
            _bucket_put(self._tbuckets, self._tbucket_keys, key, rid)
        else:
            bucket.append(rid)
        self._tbucket_items += 1
        if self._tbucket_items > 2 * len(self._pending) + _COMPACT_SLACK:
            self._tbucket_keys, self._tbucket_items = _bucket_compact(
                self._tbuckets, self._pending, _terminal_key
            )

    def _move_terminals(self, frontier: int) -> None:
        """Move the first terminal events (and their partners' deadlines) of the buckets
        up to ``frontier`` whose requests still wait to the heaps."""
        if frontier <= self._tfrontier:
            return
        self._tfrontier = frontier
        pending = self._pending
        terminals, deadlines = self._terminals, self._deadlines
        for key, bucket in _bucket_take(self._tbuckets, self._tbucket_keys, frontier):
            self._tbucket_items -= len(bucket)
            for rid in bucket:
                e = pending.get(rid)
                if isinstance(e, _Pending) and e.terminal_ms >> _TERMINAL_BITS == key:
                    heapq.heappush(terminals, (e.terminal_ms, rid))
                    heapq.heappush(deadlines, (e.deadline_ms, rid))
        if len(deadlines) > 2 * len(pending) + _COMPACT_SLACK:
            self._compact()

    def _compact_buckets(self) -> None:
        """Drop bucket items of requests no longer in flight (see :meth:`_compact`)."""
        self._bucket_keys, self._bucket_items = _bucket_compact(
            self._buckets, self._pending, self._inflight_key
        )

    def _inflight_key(self, entry: _Pending | int) -> int | None:
        """The bucket of an in-flight request's deadline (None: not in flight)."""
        return self._deadline(entry) >> _BUCKET_BITS if isinstance(entry, int) else None

    def _move_buckets(self, now_ms: int) -> None:
        """Move the in-flight deadlines of buckets event time reached to the heap."""
        frontier = now_ms >> _BUCKET_BITS
        if frontier <= self._frontier:
            return
        self._frontier = frontier
        pending = self._pending
        heap = self._deadlines
        for key, bucket in _bucket_take(self._buckets, self._bucket_keys, frontier):
            self._bucket_items -= len(bucket)
            for rid in bucket:
                e = pending.get(rid)
                if isinstance(e, int):
                    d = self._deadline(e)
                    if d >> _BUCKET_BITS == key:
                        heapq.heappush(heap, (d, rid))

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
                    packed = self._pack(event, offset, wall_ms)  # type: ignore[arg-type]
                    if packed is not None:
                        pending[rid] = packed
                        self._arm_inflight(
                            rid, event.ts_unix_ns // _NS_PER_MS + self.config.inflight_ttl_ms
                        )
                        return None
            elif entry is not None:
                # (a pending request is never resolved too: no _resolved lookup)
                if isinstance(entry, int):
                    # Its first terminal event: its partner now has timeout_ms to arrive.
                    entry = pending[rid] = self._unpack_joining(entry)
                    if kind == "gateway.completed":
                        entry.completed = event  # type: ignore[assignment]
                    else:
                        entry.finished = event  # type: ignore[assignment]
                    ts_ms = event.ts_unix_ns // _NS_PER_MS
                    ts_ms = max(ts_ms, now_ms)
                    entry.terminal_ms = ts_ms
                    deadline = entry.deadline_ms = ts_ms + self.config.timeout_ms
                    entry.wall_deadline_ms = (
                        wall_ms + self.config.timeout_ms if wall_ms is not None else 0
                    )
                    self._arm_terminal(rid, ts_ms, deadline)
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
                    return self._join(rid, entry, max(event.ts_unix_ns // _NS_PER_MS, now_ms))
        key, attempt = rid, 1
        if event.kind == "gateway.received":
            n = self._attempts.get(rid, 1)
            which = self._received_kind(rid, n, event)
            if which is _DUPLICATE:
                self.counters.duplicates += 1
                return None
            if which is _RETRY:
                return self._start_attempt(rid, n, event, offset, wall_ms)
            n = self._attempts.get(rid, 1)
            key, attempt = attempt_key(rid, n), n
        elif rid in self._attempts:
            key, attempt = self._route(rid, self._attempts[rid], event)
        done = self._resolved.get(key)
        if done is not None:
            if isinstance(done, int):
                recent = self._recent_get(key) if event.kind != "gateway.received" else None
                if recent is not None:
                    return self._after_resolved(recent, key, event)
                self._count_repeat(event, None)  # its events are no longer kept
                return None
            return self._after_resolved(done, key, event)
        entry = self._pending.get(key)
        if entry is None:
            if len(self._pending) >= self.config.max_pending:
                self._evict_oldest()
            if event.kind == "gateway.received" and attempt == 1:
                packed = self._pack(event, offset, wall_ms)
                if packed is not None:
                    self._pending[key] = packed
                    self._arm_inflight(
                        key, event.ts_unix_ns // _NS_PER_MS + self.config.inflight_ttl_ms
                    )
                    return None
            entry = self._pending[key] = _Pending(offset, attempt)
        elif isinstance(entry, int):
            if event.kind == "gateway.received":
                self.counters.duplicates += 1  # (another id would have been a retry)
                return None
            entry = self._pending[key] = self._unpack(entry)
        if not self._store(entry, event):
            return None
        ts_ms = max(event.ts_unix_ns // _NS_PER_MS, now_ms)
        if entry.completed is not None and entry.finished is not None:
            return self._join(key, entry, ts_ms)
        if event.kind == "gateway.received":
            if entry.completed is not None or entry.finished is not None:
                return None  # the partner's timeout is already running
            wait_ms = self.config.inflight_ttl_ms
        else:
            # First terminal event: its partner now has timeout_ms to arrive.
            wait_ms = self.config.timeout_ms
            entry.terminal_ms = ts_ms
            heapq.heappush(self._terminals, (ts_ms, key))
        entry.deadline_ms = ts_ms + wait_ms
        entry.wall_deadline_ms = wall_ms + wait_ms if wall_ms is not None else 0
        heapq.heappush(self._deadlines, (entry.deadline_ms, key))
        if len(self._deadlines) > 2 * len(self._pending) + _COMPACT_SLACK:
            self._compact()
        return None

    def _join(self, key: str, entry: _Pending, ts_ms: int) -> Emitted:
        """Both terminal events are in: the request's record (revision 2 or 3)."""
        del self._pending[key]
        self.counters.joined += 1
        received, completed, finished = entry.received, entry.completed, entry.finished
        attempt = entry.attempt
        rec = record_of(
            key if attempt == 1 else _rid_of(key, attempt), received, completed, finished,
            attempt, entry.retried, entry.conflicts,
        )  # fmt: skip
        if rec.superseded:
            self.counters.superseded += 1
        if received is None or rec.outcome != "ok":
            # Joined before its gateway.received (producers reordered): keep the
            # events so that a late received can still add priority/tenant; a failed
            # attempt: so that a retry can supersede it.
            self._remember(key, ts_ms, entry, partial=False)
        else:
            # A fully joined request is remembered by its expiry and received hash alone
            # (one dict operation: a new key is what makes the dict grow).
            self._resolved.put(
                key,
                (ts_ms + self.config.resolved_ttl_ms)
                | (((received.id_hash & 0xFFFFFFFF) + 1) << _RESOLVED_HASH_SHIFT),
            )
            if self._conflict_ms:
                out = Emitted(rec, entry.first_offset, False, None, (received, completed, finished))
                at = ts_ms >> _RECENT_BITS
                if at != self._recent_at:
                    self._recent_at = at
                    self._recent_gen = self._recent.setdefault(at, {})
                self._recent_gen[key] = (ts_ms, out if not entry.seen else _Resolved(
                    ts_ms + self._conflict_ms, received, completed, finished, attempt=attempt,
                    retried=entry.retried, first_offset=entry.first_offset,
                    conflicts=entry.conflicts, seen=entry.seen,
                ))  # fmt: skip
                return out
        return Emitted(rec, entry.first_offset, False, None, (received, completed, finished))

    def _recent_get(self, key: str) -> _Resolved | None:
        """A fully joined request's events, while kept (see ``_recent``), as the
        :class:`_Resolved` a conflict updates."""
        for at in sorted(self._recent, reverse=True):
            gen = self._recent[at]
            item = gen.get(key)
            if item is None:
                continue
            ts_ms, held = item
            if ts_ms + self._conflict_ms <= self._recent_now:
                return None
            if isinstance(held, _Resolved):
                return held
            rec = held.record
            assert held.parts is not None
            received, completed, finished = held.parts
            done = _Resolved(
                ts_ms + self._conflict_ms,
                received,  # type: ignore[arg-type]  # (the join's _Received: see _join)
                completed, finished, attempt=rec.attempt,
                retried=self._attempts.get(rec.request_id, 1) > rec.attempt,
                first_offset=held.first_offset, conflicts=rec.conflicts,
            )  # fmt: skip
            gen[key] = (ts_ms, done)
            return done
        return None

    def _recent_expire(self, now_ms: int) -> None:
        """Event time is ``now_ms``: forget the joined requests' events kept until then."""
        if now_ms <= self._recent_now:
            return
        self._recent_now = now_ms
        horizon = now_ms - self._conflict_ms  # joined at or before it: expired
        for at in [at for at in self._recent if ((at + 1) << _RECENT_BITS) - 1 <= horizon]:
            del self._recent[at]
            if at == self._recent_at:
                self._recent_at, self._recent_gen = -1, {}

    def _state(self, key: str) -> _Pending | _Resolved | int | None:
        """What the join holds of one attempt: pending (an int: in flight, received
        only), resolved (an int: fully joined), or nothing."""
        st = self._pending.get(key)
        return st if st is not None else self._resolved.get(key)

    def _holds_received(self, key: str, id_hash: int) -> bool | None:
        """Whether this attempt's gateway.received has this id hash (None: unknown)."""
        if (p := self._pending.get(key)) is not None:
            if isinstance(p, int):
                return (p >> _HASH_SHIFT) & _M64 == id_hash
            return None if p.received is None else p.received.id_hash == id_hash
        r = self._resolved.get(key)
        if r is None:
            return None
        if isinstance(r, int):
            short = r >> _RESOLVED_HASH_SHIFT
            return None if short == 0 else short == _short_hash(id_hash)
        have = _received_hash(r.received)
        return None if have is None else have == id_hash

    def _received_kind(self, rid: str, n: int, event: AnyReceived) -> object:
        """Whether a gateway.received belongs to the request's latest attempt (``_SAME``:
        the first one, or one it lacks), repeats one (``_DUPLICATE``) or starts another
        attempt (``_RETRY``: another event id)."""
        latest = attempt_key(rid, n)
        state = self._state(latest)
        if state is None:
            if n > 1:
                del self._attempts[rid]  # forgotten: a new request
            return _SAME
        h = _id_hash(event.event_id)
        same = self._holds_received(latest, h)
        if same is None:
            # No received yet (it fills in), or a joined request seeded from the ledger
            # (its received unknown: taken for a repeat, as before attempts existed).
            return _DUPLICATE if isinstance(state, int) else _SAME
        if same or any(self._holds_received(attempt_key(rid, k), h) for k in range(1, n)):
            return _DUPLICATE
        return _RETRY

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
        entry = self._pending[key] = _Pending(offset, n + 1)
        self._store(entry, event)
        entry.deadline_ms = event.ts_unix_ns // _NS_PER_MS + self.config.inflight_ttl_ms
        entry.wall_deadline_ms = wall_ms + self.config.inflight_ttl_ms if wall_ms is not None else 0
        heapq.heappush(self._deadlines, (entry.deadline_ms, key))
        return self._supersede(attempt_key(rid, n))

    def _supersede(self, key: str) -> Emitted | None:
        pending = self._pending.get(key)
        if pending is not None:
            if isinstance(pending, int):
                pending = self._pending[key] = self._unpack(pending)
                heapq.heappush(self._deadlines, (pending.deadline_ms, key))
            pending.retried = True  # its record, when it comes, is built superseded
            return None
        done = self._resolved.get(key)
        if not isinstance(done, _Resolved) or done.retried:
            return None  # joined and ok (never superseded), or forgotten
        done.retried = True
        parts = (done.received, done.completed, done.finished)
        before = _build(key, done.attempt, False, parts, done.conflicts)
        if before.outcome == "ok":
            return None
        self.counters.superseded += 1
        after = _build(key, done.attempt, True, parts, done.conflicts)
        return Emitted(after, done.first_offset, upgrade=True, previous=before, parts=parts)

    def _route(self, rid: str, n: int, event: AnyLifecycle) -> tuple[str, int]:
        """The attempt a terminal event of a retried request belongs to: the oldest one
        still missing that side (an engine run only where the gateway waited for it)."""
        for k in range(1, n + 1):
            key = attempt_key(rid, k)
            st = self._state(key)
            if st is None or (isinstance(st, int) and key in self._resolved):
                continue  # forgotten, or fully joined
            if isinstance(st, int):
                return key, k  # in flight: received only
            if event.kind == "gateway.completed":
                if st.completed is None:
                    return key, k
            elif st.finished is None and (
                st.completed is None or st.completed.total_ms + _ENGINE_FIT_SLACK_MS >= event.e2e_ms  # type: ignore[union-attr]
            ):
                return key, k
        return attempt_key(rid, n), n

    def _compact(self) -> None:
        """Drop the heaps' stale items (requests resolved, deadlines moved).

        They would only be skipped when they reach the top, but a joined request's
        in-flight deadline (``inflight_ttl_ms``, 10 min) would hold its id that long:
        at 17k requests/s, gigabytes. Rebuilding once the heap is twice the live
        state keeps it bounded at amortised O(1) per push; the order of what is
        resolved is unchanged.
        """
        pending = self._pending
        self._deadlines = [
            (d, rid)
            for d, rid in self._deadlines
            if (e := pending.get(rid)) is not None and self._deadline(e) == d
        ]
        heapq.heapify(self._deadlines)
        self._terminals = [
            (t, rid)
            for t, rid in self._terminals
            if isinstance(e := pending.get(rid), _Pending) and e.terminal_ms == t
        ]
        heapq.heapify(self._terminals)

    def _store(self, entry: _Pending, event: AnyLifecycle) -> bool:
        if event.kind == "gateway.received":
            slot: _Received | AnyLifecycle | None = entry.received
            if slot is None:
                entry.received = _Received(
                    id_hash=_id_hash(event.event_id),
                    ts_unix_ns=event.ts_unix_ns,
                    host=event.host,
                    model=event.model,
                    priority=event.priority,
                    tenant=event.tenant,
                    prompt_tokens=event.prompt_tokens,
                    stream=event.stream,
                )
                return True
        elif event.kind == "gateway.completed":
            slot = entry.completed
            if slot is None:
                entry.completed = event
                return True
        else:
            slot = entry.finished
            if slot is None:
                entry.finished = event
                return True
        if _same_id(slot, event):
            self.counters.duplicates += 1
        elif isinstance(slot, _Received):
            self.counters.conflicts += 1  # (another received of an attempt that has one)
        else:
            self._set_aside(entry, slot, event)
        return False

    def _set_aside(self, st: _Pending | _Resolved, slot: AnyLifecycle, event: AnyLifecycle) -> bool:
        """A terminal event of a kind the request has: a repeat of one it holds or set
        aside (a duplicate: False), or a conflict (True: counted, the worse one kept)."""
        if _repeats(slot, event):
            self.counters.duplicates += 1
            return False
        marks = _marks(event)
        if st.seen and (marks[0] in st.seen or marks[1] in st.seen):
            self.counters.duplicates += 1
            return False
        self.counters.conflicts += 1
        held = _marks(slot)
        st.seen = (*st.seen, *(() if held[0] in st.seen else held), *marks)
        st.conflicts = min(st.conflicts + 1, _MAX_CONFLICTS)
        if worse_terminal(event, slot):  # type: ignore[arg-type]
            if event.kind == "gateway.completed":
                st.completed = event
            else:
                st.finished = event  # type: ignore[assignment]
        return True

    def _conflict(
        self, done: _Resolved, key: str, event: AnyLifecycle, slot: AnyLifecycle
    ) -> Emitted | None:
        """A terminal event of a request whose record was emitted, of a kind it has: a
        repeat (ignored), or a conflict that corrects the record (see "Conflicts")."""
        previous = self._record(key, done)
        if not self._set_aside(done, slot, event):
            return None
        self.counters.conflicts_corrected += 1
        return self._upgrade(key, done, previous)

    def _after_resolved(self, done: _Resolved, key: str, event: AnyLifecycle) -> Emitted | None:
        if event.kind == "gateway.completed" and done.completed is not None:
            return self._conflict(done, key, event, done.completed)
        if event.kind == "engine.finished" and done.finished is not None:
            return self._conflict(done, key, event, done.finished)
        if not done.partial:
            if event.kind == "gateway.received" and done.completed is not None:
                if done.received is None:
                    previous = self._record(key, done)
                    done.received = event
                    self.counters.upgraded += 1
                    return self._upgrade(key, done, previous)
                self._count_repeat(event, done.received)
                return None
            self._count_repeat(event, None)
            return None
        slot = {
            "gateway.received": done.received,
            "gateway.completed": done.completed,
            "engine.finished": done.finished,
        }[event.kind]
        if slot is not None:
            self._count_repeat(event, slot)
            return None
        previous = self._record(key, done)
        if event.kind == "gateway.received":
            # The partial record gains priority, tenant and start time (still partial).
            done.received = event
        elif event.kind == "gateway.completed":
            done.completed = event
            done.partial = False
        else:
            done.finished = event
            done.partial = False
        self.counters.upgraded += 1
        return self._upgrade(key, done, previous)

    @staticmethod
    def _record(key: str, done: _Resolved) -> RequestRecord:
        return _build(
            key, done.attempt, done.retried, (done.received, done.completed, done.finished),
            done.conflicts,
        )  # fmt: skip

    def _upgrade(self, key: str, done: _Resolved, previous: RequestRecord) -> Emitted:
        parts = (done.received, done.completed, done.finished)
        rec = _build(key, done.attempt, done.retried, parts, done.conflicts)
        if rec.superseded and not previous.superseded:
            self.counters.superseded += 1
        return Emitted(rec, done.first_offset, upgrade=True, previous=previous, parts=parts)

    def _count_repeat(self, event: AnyLifecycle, slot: _Received | AnyLifecycle | None) -> None:
        if slot is None or _same_id(slot, event):
            # Fully joined requests keep no events: any repeat of them is a duplicate.
            self.counters.duplicates += 1
        else:
            self.counters.conflicts += 1

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

    def _remember(
        self, key: str, now_ms: int, entry: _Pending | None, short_hash: int = 0, *,
        partial: bool = True,
    ) -> None:  # fmt: skip
        expires = now_ms + self.config.resolved_ttl_ms
        if entry is None:
            self._resolved.put(key, expires | (short_hash << _RESOLVED_HASH_SHIFT))
        else:
            self._resolved.put(key, _Resolved(
                expires, entry.received, entry.completed, entry.finished, partial=partial,
                attempt=entry.attempt, retried=entry.retried, first_offset=entry.first_offset,
                conflicts=entry.conflicts, seen=entry.seen,
            ))  # fmt: skip

    def _resolve_partial(self, key: str, entry: _Pending | int, now_ms: int) -> Emitted | None:
        del self._pending[key]
        if isinstance(entry, int) or (entry.completed is None and entry.finished is None):
            self.counters.orphaned_received += 1
            return None
        self._remember(key, now_ms, entry)
        if entry.completed is not None:
            self.counters.gateway_only += 1
        else:
            self.counters.engine_only += 1
        parts = (entry.received, entry.completed, entry.finished)
        rec = _build(key, entry.attempt, entry.retried, parts, entry.conflicts)
        if rec.superseded:
            self.counters.superseded += 1
        return Emitted(rec, entry.first_offset, parts=parts)

    def evict(self, n: int) -> None:
        """Resolve the ``n`` oldest pending requests early (counted as evicted); their
        partial records come out of the next :meth:`advance_emitted`."""
        for _ in range(min(n, len(self._pending))):
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        rid = next(iter(self._pending))
        entry = self._pending[rid]
        self.counters.evicted += 1
        rec = self._resolve_partial(rid, entry, self._deadline(entry))
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
        self._move_buckets(now_ms)
        # (a terminal event's deadline is its time + timeout_ms: see _arm_terminal)
        self._move_terminals((now_ms - self.config.timeout_ms) >> _TERMINAL_BITS)
        heap = self._deadlines
        waits = self._wall_waits
        while heap and heap[0][0] <= now_ms:
            deadline, rid = heapq.heappop(heap)
            entry = self._pending.get(rid)
            if entry is None or self._deadline(entry) != deadline:
                continue  # stale heap item: resolved already, or deadline moved
            if wall_ms is not None and (wall_deadline := self._wall_deadline(entry)) > wall_ms:
                heapq.heappush(waits, (wall_deadline, deadline, rid))
                continue
            rec = self._resolve_partial(rid, entry, now_ms)
            if rec is not None:
                out.append(rec)
        while waits and (wall_ms is None or waits[0][0] <= wall_ms):
            _, deadline, rid = heapq.heappop(waits)
            entry = self._pending.get(rid)
            if entry is None or self._deadline(entry) != deadline:
                continue
            rec = self._resolve_partial(rid, entry, now_ms)
            if rec is not None:
                out.append(rec)
        self._resolved.expire(now_ms)
        if self._recent:
            self._recent_expire(now_ms)
        return out

    def drain(self) -> list[RequestRecord]:
        return [e.record for e in self.drain_emitted()]

    def drain_emitted(self) -> list[Emitted]:
        """End of input: resolve everything pending as if its timeout had passed."""
        out = self._evicted
        self._evicted = []
        for rid, entry in list(self._pending.items()):
            rec = self._resolve_partial(rid, entry, self._deadline(entry))
            if rec is not None:
                out.append(rec)
        self._deadlines.clear()
        self._wall_waits.clear()
        self._terminals.clear()
        self._buckets.clear()
        self._bucket_keys.clear()
        self._bucket_items = 0
        self._tbuckets.clear()
        self._tbucket_keys.clear()
        self._tbucket_items = 0
        return out

    def oldest_terminal_ms(self) -> int | None:
        """Event time of the oldest terminal event still waiting for its partner.

        Its record (joined or partial) will end no earlier than this, so windows
        from here on must stay open until it is resolved.
        """
        oldest = self._oldest_moved()
        pending = self._pending
        for key in sorted(self._tbuckets):  # (not moved: the processor's frontier stays)
            times = [
                e.terminal_ms
                for rid in self._tbuckets[key]
                if isinstance(e := pending.get(rid), _Pending)
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
        heap = self._terminals
        pending = self._pending
        while heap:
            ts, rid = heap[0]
            entry = pending.get(rid)
            if isinstance(entry, _Pending) and entry.terminal_ms == ts:
                return ts
            heapq.heappop(heap)
        return None

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
                return min(entry >> _OFF_SHIFT, next_offset)
            if lone_received_durable and entry.completed is None and entry.finished is None:
                continue
            return min(entry.first_offset, next_offset)
        return next_offset
