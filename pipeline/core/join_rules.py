"""The join's rules for an event of a request it holds (see :mod:`pipeline.core.join`).

Duplicates, conflicting terminal events (the worse kept), late partners upgrading a
partial record, superseded attempts and which attempt an event belongs to: functions
of the state the join holds (:mod:`pipeline.core.join_state`), each counting what it
decides into the joiner's :class:`~pipeline.core.join_state.JoinCounters`, and the
record builder over that state. No timers (:mod:`pipeline.core.join_timers`).
"""

from __future__ import annotations

import math
from typing import Final

import msgspec

from pipeline.contract.events import REFUSED_BEFORE_ENGINE
from pipeline.contract.wire import AnyCompleted, AnyFinished, AnyLifecycle, AnyReceived
from pipeline.core.join_state import (
    HASH_SHIFT,
    M64,
    MAX_CONFLICTS,
    RESOLVED_HASH_SHIFT,
    Emitted,
    JoinCounters,
    Parts,
    Pending,
    Received,
    Resolved,
    ResolvedMemory,
    event_id_hash,
    received_hash,
    short_hash,
)
from pipeline.core.record import ATTEMPT_SEP, RequestRecord, attempt_key, record_of

# An engine run may look up to this much longer than its gateway's wait (the two hosts'
# timers differ slightly) and still belong to that attempt.
_ENGINE_FIT_SLACK_MS: Final = 50.0

# What a gateway.received is to the request's latest attempt (see received_kind).
SAME: Final = object()
DUPLICATE: Final = object()
RETRY: Final = object()


def rid_of(key: str, attempt: int) -> str:
    """The request id of an attempt's key (see :func:`attempt_key`)."""
    return key if attempt == 1 else key.rpartition(ATTEMPT_SEP)[0]


def build(key: str, attempt: int, retried: bool, parts: Parts, conflicts: int = 0) -> RequestRecord:
    """The record of an attempt (``key``) from the events held."""
    return record_of(rid_of(key, attempt), *parts, attempt, retried, conflicts)


def refused_before_engine(ev: AnyLifecycle) -> bool:
    """A ``gateway.completed`` of a request the gateway's enforcement turned away before
    any engine saw it (mode enforce, a verdict of :data:`REFUSED_BEFORE_ENGINE`): no
    engine.finished will come, so its partner's timeout is not waited for (a window
    holding it would stay open that long, and the control loop's decisions with it)."""
    return (
        ev.kind == "gateway.completed"
        and ev.control_mode == "enforce"
        and ev.control_verdict in REFUSED_BEFORE_ENGINE
    )


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


def same_id(slot: Received | AnyLifecycle, event: AnyLifecycle) -> bool:
    if isinstance(slot, Received):
        return slot.id_hash == event_id_hash(event.event_id)
    return slot.event_id == event.event_id


# What the join's compact copy of a gateway.received keeps (compared with a repeat's)
_RECEIVED_FIELDS: Final = (
    "ts_unix_ns", "host", "model", "priority", "tenant", "prompt_tokens", "stream",
    "client_attempt", "logical_request_id",
)  # fmt: skip


def count_duplicate(
    slot: Received | AnyLifecycle | None, event: AnyLifecycle, counters: JoinCounters
) -> None:
    """A duplicate: counted, and as ``duplicate_ids_changed`` too when it repeats the id of
    ``slot`` (the event the join holds) with other content (the fields the join keeps of
    a gateway.received; every field of a terminal event). ``slot`` None: not held, so
    nothing tells."""
    counters.duplicates += 1
    if slot is None or not same_id(slot, event):
        return
    if isinstance(slot, Received):
        changed = any(getattr(slot, f) != getattr(event, f) for f in _RECEIVED_FIELDS)
    else:
        changed = _content(slot) != _content(event)
    if changed:
        counters.duplicate_ids_changed += 1


# --- an event of a kind the request has, or of a request already resolved ----------


def store_event(entry: Pending, event: AnyLifecycle, counters: JoinCounters) -> bool:
    """Put an event into a pending request's slot (True); False: the slot was taken
    (a duplicate, or a conflict: counted, the worse terminal event kept)."""
    if event.kind == "gateway.received":
        slot: Received | AnyLifecycle | None = entry.received
        if slot is None:
            entry.received = Received(
                id_hash=event_id_hash(event.event_id),
                ts_unix_ns=event.ts_unix_ns,
                host=event.host,
                model=event.model,
                priority=event.priority,
                tenant=event.tenant,
                prompt_tokens=event.prompt_tokens,
                stream=event.stream,
                client_attempt=event.client_attempt,
                logical_request_id=event.logical_request_id,
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
    if same_id(slot, event):
        count_duplicate(slot, event, counters)
    elif isinstance(slot, Received):
        counters.conflicts += 1  # (another received of an attempt that has one)
    else:
        set_aside(entry, slot, event, counters)
    return False


def set_aside(
    st: Pending | Resolved, slot: AnyLifecycle, event: AnyLifecycle, counters: JoinCounters
) -> bool:
    """A terminal event of a kind the request has: a repeat of one it holds or set
    aside (a duplicate: False), or a conflict (True: counted, the worse one kept)."""
    if _repeats(slot, event):
        count_duplicate(slot, event, counters)
        return False
    marks = _marks(event)
    if st.seen and (marks[0] in st.seen or marks[1] in st.seen):
        counters.duplicates += 1
        if marks[1] not in st.seen:  # the id of an event set aside, not its content
            counters.duplicate_ids_changed += 1
        return False
    counters.conflicts += 1
    held = _marks(slot)
    st.seen = (*st.seen, *(() if held[0] in st.seen else held), *marks)
    st.conflicts = min(st.conflicts + 1, MAX_CONFLICTS)
    if worse_terminal(event, slot):  # type: ignore[arg-type]
        if event.kind == "gateway.completed":
            st.completed = event
        else:
            st.finished = event  # type: ignore[assignment]
    return True


def after_resolved(
    done: Resolved, key: str, event: AnyLifecycle, counters: JoinCounters
) -> Emitted | None:
    """An event of a request whose record was emitted and whose events are kept: a
    repeat (ignored), a late partner or received (the record upgraded), or a conflict
    (the record corrected); the new record, taking the emitted one back."""
    if event.kind == "gateway.completed" and done.completed is not None:
        return _conflict(done, key, event, done.completed, counters)
    if event.kind == "engine.finished" and done.finished is not None:
        return _conflict(done, key, event, done.finished, counters)
    if not done.partial:
        if event.kind == "gateway.received" and done.completed is not None:
            if done.received is None:
                previous = _record(key, done)
                done.received = event
                counters.upgraded += 1
                return upgrade(key, done, previous, counters)
            count_repeat(event, done.received, counters)
            return None
        count_repeat(event, None, counters)
        return None
    slot = {
        "gateway.received": done.received,
        "gateway.completed": done.completed,
        "engine.finished": done.finished,
    }[event.kind]
    if slot is not None:
        count_repeat(event, slot, counters)
        return None
    previous = _record(key, done)
    if event.kind == "gateway.received":
        # The partial record gains priority, tenant and start time (still partial).
        done.received = event
    elif event.kind == "gateway.completed":
        done.completed = event
        done.partial = False
    else:
        done.finished = event
        done.partial = False
    counters.upgraded += 1
    return upgrade(key, done, previous, counters)


def _conflict(
    done: Resolved, key: str, event: AnyLifecycle, slot: AnyLifecycle, counters: JoinCounters
) -> Emitted | None:
    """A terminal event of a request whose record was emitted, of a kind it has: a
    repeat (ignored), or a conflict that corrects the record (see "Conflicts")."""
    previous = _record(key, done)
    if not set_aside(done, slot, event, counters):
        return None
    counters.conflicts_corrected += 1
    return upgrade(key, done, previous, counters)


def _record(key: str, done: Resolved) -> RequestRecord:
    return build(
        key, done.attempt, done.retried, (done.received, done.completed, done.finished),
        done.conflicts,
    )  # fmt: skip


def upgrade(key: str, done: Resolved, previous: RequestRecord, counters: JoinCounters) -> Emitted:
    """The record of a resolved request whose events changed, replacing ``previous``."""
    parts = (done.received, done.completed, done.finished)
    rec = build(key, done.attempt, done.retried, parts, done.conflicts)
    if rec.superseded and not previous.superseded:
        counters.superseded += 1
    return Emitted(rec, done.first_offset, upgrade=True, previous=previous, parts=parts)


def count_repeat(
    event: AnyLifecycle, slot: Received | AnyLifecycle | None, counters: JoinCounters
) -> None:
    if slot is None or same_id(slot, event):
        # Fully joined requests keep no events: any repeat of them is a duplicate.
        count_duplicate(slot, event, counters)
    else:
        counters.conflicts += 1


def supersede_resolved(done: Resolved, key: str, counters: JoinCounters) -> Emitted | None:
    """A retry of a resolved attempt whose events are kept: a failed one is superseded
    (its record re-emitted so, taking the emitted one back)."""
    if done.retried:
        return None
    done.retried = True
    parts = (done.received, done.completed, done.finished)
    before = build(key, done.attempt, False, parts, done.conflicts)
    if before.outcome == "ok":
        return None
    counters.superseded += 1
    after = build(key, done.attempt, True, parts, done.conflicts)
    return Emitted(after, done.first_offset, upgrade=True, previous=before, parts=parts)


def partial_record(key: str, entry: Pending, counters: JoinCounters) -> Emitted:
    """The partial record of a pending request whose partner did not come in time."""
    if entry.completed is not None:
        counters.gateway_only += 1
    else:
        counters.engine_only += 1
    parts = (entry.received, entry.completed, entry.finished)
    rec = build(key, entry.attempt, entry.retried, parts, entry.conflicts)
    if rec.superseded:
        counters.superseded += 1
    return Emitted(rec, entry.first_offset, parts=parts)


# --- attempts: which one an event belongs to -----------------------------------------


def held_state(
    pending: dict[str, Pending | int], resolved: ResolvedMemory, key: str
) -> Pending | Resolved | int | None:
    """What the join holds of one attempt: pending (an int: in flight, received
    only), resolved (an int: fully joined), or nothing."""
    st = pending.get(key)
    return st if st is not None else resolved.get(key)


def holds_received(
    pending: dict[str, Pending | int], resolved: ResolvedMemory, key: str, id_hash: int
) -> bool | None:
    """Whether this attempt's gateway.received has this id hash (None: unknown)."""
    if (p := pending.get(key)) is not None:
        if isinstance(p, int):
            return (p >> HASH_SHIFT) & M64 == id_hash
        return None if p.received is None else p.received.id_hash == id_hash
    r = resolved.get(key)
    if r is None:
        return None
    if isinstance(r, int):
        short = r >> RESOLVED_HASH_SHIFT
        return None if short == 0 else short == short_hash(id_hash)
    have = received_hash(r.received)
    return None if have is None else have == id_hash


def received_kind(
    pending: dict[str, Pending | int], resolved: ResolvedMemory, attempts: dict[str, int],
    rid: str, event: AnyReceived,
) -> object:  # fmt: skip
    """Whether a gateway.received belongs to the request's latest attempt (``SAME``: the
    first one, or one it lacks), repeats one (``DUPLICATE``) or starts another attempt
    (``RETRY``: another event id). ``attempts``: request id -> its latest attempt, when
    more than one (a forgotten request's is dropped)."""
    n = attempts.get(rid, 1)
    latest = attempt_key(rid, n)
    state = held_state(pending, resolved, latest)
    if state is None:
        if n > 1:
            del attempts[rid]  # forgotten: a new request
        return SAME
    h = event_id_hash(event.event_id)
    same = holds_received(pending, resolved, latest, h)
    if same is None:
        # No received yet (it fills in), or a joined request seeded from the ledger
        # (its received unknown: taken for a repeat, as before attempts existed).
        return DUPLICATE if isinstance(state, int) else SAME
    if same or any(holds_received(pending, resolved, attempt_key(rid, k), h) for k in range(1, n)):
        return DUPLICATE
    return RETRY


def route(
    pending: dict[str, Pending | int], resolved: ResolvedMemory, rid: str, n: int,
    event: AnyLifecycle,
) -> tuple[str, int]:  # fmt: skip
    """The attempt a terminal event of a retried request (``n`` attempts) belongs to: the
    oldest one still missing that side (an engine run only where the gateway waited for
    it)."""
    for k in range(1, n + 1):
        key = attempt_key(rid, k)
        st = held_state(pending, resolved, key)
        if st is None or (isinstance(st, int) and key in resolved):
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
