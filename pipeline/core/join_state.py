"""What the join holds per request, and what it gives out (see :mod:`pipeline.core.join`).

* :class:`Emitted` (a record with what the windows need to know about it) and
  :class:`JoinCounters`: the join's output.
* A request in flight (its ``gateway.received`` only, the bulk of the state) is one
  packed int (:class:`InflightCodec`); any other pending request a :class:`Pending`.
* A resolved request: :class:`ResolvedMemory` (an int for a fully joined one, a
  :class:`Resolved` holding its events otherwise) and, for ``conflict_keep_ms``,
  :class:`RecentJoins` (a fully joined request's record and events, for a conflict).

Pure data and bookkeeping: no rule of the join (those are :mod:`pipeline.core.join_rules`)
and no timer (:mod:`pipeline.core.join_timers`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import msgspec

from pipeline.contract.wire import AnyCompleted, AnyFinished, AnyReceived
from pipeline.core.record import ReceivedFields, RequestRecord, build_record

NS_PER_MS: Final = 1_000_000
# A fully joined request is remembered as one int: its expiry (ms, low bits) and a
# 32-bit hash of its gateway.received event id + 1 (0: unknown), which tells a retry
# (another received) from a duplicate of the one it had.
RESOLVED_HASH_SHIFT: Final = 56
RESOLVED_EXPIRY_MASK: Final = (1 << RESOLVED_HASH_SHIFT) - 1
MAX_CONFLICTS: Final = 65_535  # requests.conflicts is a UInt16

# A request in flight (gateway.received only: the bulk of the join state) is held as
# one int packing what a record takes from the event, little-endian bytes of
# ``_PACK`` (packed and unpacked by ``struct``: one C call each way, ~1 µs less than
# shifting the fields in), low bits first: stream (1) and priority (4) in one byte,
# host, model and tenant as indices into the codec's string table (2 bytes each,
# < 2**12, tenant 0 = None), prompt_tokens + 1 (4 bytes, < 2**24, 0 = None),
# wall_ms + 1 (6 bytes, < 2**44, 0 = None), a 64-bit hash of the event id (duplicates
# are told from conflicts by it), ts_unix_ns (8 bytes) and the source offset (8 bytes:
# an int carries no leading zero bytes, so a small offset costs little). Values that
# do not fit fall back to a Pending holding a Received.
_PACK: Final = struct.Struct("<BHHHIIHQQQ")
_UNPACK: Final = struct.Struct("<BHHHI6xQQQ")  # without wall_ms (the deadlines take it)
_PRIO_SHIFT: Final = 1
_HOST_SHIFT: Final = 8
_MODEL_SHIFT: Final = 24
_TENANT_SHIFT: Final = 40
_PROMPT_SHIFT: Final = 56
WALL_SHIFT: Final = 88
HASH_SHIFT: Final = 136
TS_SHIFT: Final = 200
OFF_SHIFT: Final = 264
_PACK_BYTES: Final = 41
M64: Final = (1 << 64) - 1
_MAX_STRINGS: Final = 1 << 12
_MAX_PROMPT: Final = (1 << 24) - 2
_MAX_WALL: Final = (1 << 44) - 2
# Joined requests' events are kept (for conflicts) in generations of 2**RECENT_BITS ms.
RECENT_BITS: Final = 12


def event_id_hash(event_id: str) -> int:
    return hash(event_id) & M64


def short_hash(id_hash: int) -> int:
    return (id_hash & 0xFFFFFFFF) + 1


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
    # of them, repeats of an event id whose content differs from the event the join holds
    # under it (a producer reusing ids; ignored like any duplicate, but told apart)
    duplicate_ids_changed: int = 0
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


class Received(msgspec.Struct, gc=False):
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
    # the client's attempt (issue 47): never in the packed int (it holds only first tries
    # without a logical id)
    client_attempt: int = 0
    logical_request_id: str | None = None


class Pending(msgspec.Struct, gc=False):
    """A request with more than its gateway.received (or one that does not fit the
    in-flight int). A Struct built in C; ``gc=False``: it holds events, which hold
    nothing back, so it can take part in no reference cycle."""

    first_offset: int
    attempt: int = 1
    retried: bool = False  # a later attempt of the request exists
    received: Received | None = None
    completed: AnyCompleted | None = None
    finished: AnyFinished | None = None
    deadline_ms: int = 0
    wall_deadline_ms: int = 0
    terminal_ms: int = 0  # event time of its first terminal event (0: none yet)
    conflicts: int = 0  # conflicting terminal events set aside (see "Conflicts")
    seen: tuple[int, ...] = ()  # after a conflict: _marks of its terminal events


class Resolved(msgspec.Struct, gc=False):
    """A resolved request whose events are kept (see ``Joiner._resolved``)."""

    expires_ms: int
    # Kept for partial records (a late partner can upgrade them), records joined before
    # their gateway.received, and failed attempts (a retry supersedes them).
    received: Received | AnyReceived | None = None
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


def resolved_from(entry: Pending, expires_ms: int, *, partial: bool = False) -> Resolved:
    """What the join keeps of a pending request once its record is out (until
    ``expires_ms``)."""
    return Resolved(
        expires_ms, entry.received, entry.completed, entry.finished, partial=partial,
        attempt=entry.attempt, retried=entry.retried, first_offset=entry.first_offset,
        conflicts=entry.conflicts, seen=entry.seen,
    )  # fmt: skip


_GENERATIONS: Final = 8  # a resolved memory's generations per resolved_ttl_ms (see below)
_NEVER: Final = 1 << 62


class ResolvedMemory:
    """What the join remembers of resolved requests: key -> a packed int (fully joined:
    its expiry and received hash) or a :class:`Resolved`, for ``resolved_ttl_ms``.

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
        self._by_index: dict[int, dict[str, Resolved | int]] = {}
        self._gens: list[dict[str, Resolved | int]] = []  # newest first (lookups)
        self._len = 0
        self._now_ms = 0  # entries expiring at or before it are gone
        self._drop_at_ms = _NEVER  # when the oldest generation is over

    def __len__(self) -> int:
        """Entries held (expired ones of a generation not yet dropped included)."""
        return self._len

    def get(self, key: str) -> Resolved | int | None:
        for gen in self._gens:
            v = gen.get(key)
            if v is not None:
                return v if _expiry(v) > self._now_ms else None
        return None

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def put(self, key: str, value: Resolved | int) -> None:
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

    def items(self) -> dict[str, Resolved | int]:
        """What :meth:`get` finds, key by key (tests, probes): each key's newest copy,
        unless that one has expired."""
        seen: set[str] = set()
        out: dict[str, Resolved | int] = {}
        for gen in self._gens:  # newest first
            for k, v in gen.items():
                if k not in seen:
                    seen.add(k)
                    if _expiry(v) > self._now_ms:
                        out[k] = v
        return out

    def keys(self) -> list[str]:
        return list(self.items())


def _expiry(value: Resolved | int) -> int:
    return value & RESOLVED_EXPIRY_MASK if isinstance(value, int) else value.expires_ms


def received_hash(received: Received | AnyReceived | None) -> int | None:
    if received is None:
        return None
    if isinstance(received, Received):
        return received.id_hash
    return event_id_hash(received.event_id)


class InflightCodec:
    """A ``gateway.received`` as the packed in-flight int (see ``_PACK``) and back: host,
    model and tenant as indices into this codec's string table (one per joiner)."""

    __slots__ = ("ids", "strings")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.strings: list[str] = [""]  # index 0: tenant None

    def string_id(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = len(self.strings)
            if i >= _MAX_STRINGS:
                return -1
            self.ids[s] = i
            self.strings.append(s)
        return i

    def pack(self, ev: AnyReceived, offset: int, wall_ms: int | None) -> int | None:
        """The in-flight int of a ``gateway.received`` (None: a value does not fit)."""
        ids = self.ids  # (known strings without a call: the common case)
        host = ids.get(ev.host)
        if host is None:
            host = self.string_id(ev.host)
        model = ids.get(ev.model)
        if model is None:
            model = self.string_id(ev.model)
        tenant = 0 if ev.tenant is None else ids.get(ev.tenant)
        if tenant is None:
            tenant = self.string_id(ev.tenant)  # type: ignore[arg-type]
        prompt = ev.prompt_tokens
        ts = ev.ts_unix_ns
        prio = ev.priority
        if (
            ev.client_attempt
            or ev.logical_request_id is not None
            or host < 0
            or model < 0
            or tenant < 0
            or not 0 <= prio <= 15
            or not 0 <= ts <= M64
            or not 0 <= offset <= M64
            or (prompt is not None and not 0 <= prompt <= _MAX_PROMPT)
            or (wall_ms is not None and not 0 <= wall_ms <= _MAX_WALL)
        ):
            return None
        wall = 0 if wall_ms is None else wall_ms + 1
        return int.from_bytes(
            _PACK.pack(
                (prio << 1) | (1 if ev.stream else 0), host, model, tenant,
                0 if prompt is None else prompt + 1, wall & 0xFFFFFFFF, wall >> 32,
                hash(ev.event_id) & M64, ts, offset,
            ),
            "little",
        )  # fmt: skip

    def unpack(self, v: int) -> Pending:
        """The pending state of an in-flight int, its deadlines left for the caller to
        set (a terminal event joining it restarts them)."""
        strings = self.strings
        prio_stream, host, model, tenant, prompt, id_hash, ts, offset = _UNPACK.unpack(
            v.to_bytes(_PACK_BYTES, "little")
        )
        entry = Pending(offset)
        entry.received = Received(
            id_hash, ts, strings[host], strings[model], prio_stream >> 1,
            strings[tenant] if tenant else None, prompt - 1 if prompt else None,
            bool(prio_stream & 1),
        )  # fmt: skip
        return entry


class RecentJoins:
    """Fully joined requests' records and events, for ``keep_ms`` (``JoinConfig.
    conflict_keep_ms``) after their record (their entry in the resolved memory is an
    int): a conflicting terminal event corrects the record.

    Generations by join time (``>> RECENT_BITS``) of key -> (join ms, the
    :class:`Emitted`, or the :class:`Resolved` it became once looked up); dropped whole
    once expired. Storing the Emitted the join returns anyway costs one dict store a
    request (a Resolved put in a :class:`ResolvedMemory` cost ~2 µs a request): the
    join stores into :attr:`gen` itself (:meth:`generation` when ``at`` moved on).
    """

    __slots__ = ("_gens", "_now_ms", "at", "gen", "keep_ms")

    def __init__(self, keep_ms: int) -> None:
        self.keep_ms = keep_ms
        self._gens: dict[int, dict[str, tuple[int, Emitted | Resolved]]] = {}
        self.gen: dict[str, tuple[int, Emitted | Resolved]] = {}
        self.at = -1  # the generation ``gen`` is
        self._now_ms = 0  # the clock at the last expire: entries expired by then are gone

    def __len__(self) -> int:
        return sum(len(g) for g in self._gens.values())

    def generation(self, ts_ms: int) -> dict[str, tuple[int, Emitted | Resolved]]:
        """The generation of a request joined at ``ts_ms`` (now :attr:`gen`)."""
        self.at = at = ts_ms >> RECENT_BITS
        self.gen = self._gens.setdefault(at, {})
        return self.gen

    def get(self, key: str, attempts: dict[str, int]) -> Resolved | None:
        """A fully joined request's events, while kept, as the :class:`Resolved` a
        conflict updates (``attempts``: request id -> its latest attempt, when > 1)."""
        for at in sorted(self._gens, reverse=True):
            gen = self._gens[at]
            item = gen.get(key)
            if item is None:
                continue
            ts_ms, held = item
            if ts_ms + self.keep_ms <= self._now_ms:
                return None
            if isinstance(held, Resolved):
                return held
            rec = held.record
            assert held.parts is not None
            received, completed, finished = held.parts
            done = Resolved(
                ts_ms + self.keep_ms,
                received,  # type: ignore[arg-type]  # (the join's Received: see Joiner._join)
                completed, finished, attempt=rec.attempt,
                retried=attempts.get(rec.request_id, 1) > rec.attempt,
                first_offset=held.first_offset, conflicts=rec.conflicts,
            )  # fmt: skip
            gen[key] = (ts_ms, done)
            return done
        return None

    def expire(self, now_ms: int) -> None:
        """Event time is ``now_ms``: forget the joined requests' events kept until then
        (the clock stands still while nothing is kept)."""
        if not self._gens or now_ms <= self._now_ms:
            return
        self._now_ms = now_ms
        horizon = now_ms - self.keep_ms  # joined at or before it: expired
        for at in [at for at in self._gens if ((at + 1) << RECENT_BITS) - 1 <= horizon]:
            del self._gens[at]
            if at == self.at:
                self.at, self.gen = -1, {}
