"""Message codec: bytes on the wire <-> v1 events, with dead letters for bad input.

A Kafka message value (or one JSON Lines line) is either one event object or
a JSON array of events. Decoding never raises on bad input: everything that
fails validation becomes a :class:`DeadLetter` with the raw bytes and a
reason, and one bad event in a batch does not reject its valid neighbours.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import orjson
from pydantic import TypeAdapter, ValidationError

from pipeline.contract.events import EVENT_ADAPTER, Event

DEFAULT_MAX_MESSAGE_BYTES: Final = 1_048_576
_BATCH_ADAPTER: Final[TypeAdapter[list[Event]]] = TypeAdapter(list[Event])


@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where a message came from (Kafka coordinates, or file and line for replay)."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One rejected message or batch element, with the reason it was rejected."""

    raw: bytes
    reason: str
    source: SourceRef
    index: int | None  # position inside a batch; None when the whole message is bad


@dataclass(frozen=True, slots=True)
class Decoded:
    events: list[Event]
    dead: list[DeadLetter]


def _reason(err: ValidationError) -> str:
    errors = err.errors(include_url=False)
    if errors and errors[0]["type"] == "json_invalid":
        return f"invalid_json: {errors[0]['msg']}"
    parts = []
    for e in errors[:3]:
        loc = ".".join(str(x) for x in e["loc"]) or "<root>"
        parts.append(f"{loc}: {e['msg']}")
    more = err.error_count() - len(parts)
    if more > 0:
        parts.append(f"... {more} more")
    return "invalid_event: " + "; ".join(parts)


def _json_items(raw: bytes) -> tuple[list[object], bool] | None:
    """The elements of a JSON array message and whether they hold a non-standard literal;
    None when it is not valid JSON.

    orjson rejects the non-standard literals ``NaN`` and ``Infinity`` outright, which
    would dead-letter a whole batch for one bad number; the standard library parses
    them, so that only the element carrying one is rejected (by the contract's
    ``finite number`` rule) and its neighbours are kept.
    """
    try:
        return orjson.loads(raw), False
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(raw), True
    except (ValueError, RecursionError):
        return None


def _item_bytes(item: object, nonstandard: bool) -> bytes:
    if nonstandard:  # keep NaN/Infinity as received (orjson would write null)
        # surrogatepass: a lone surrogate escape (which orjson rejects too) stays bytes
        # that the element's validation then rejects, instead of raising here
        text = json.dumps(item, separators=(",", ":"), ensure_ascii=False)
        return text.encode("utf-8", "surrogatepass")
    return orjson.dumps(item)


def decode_message(
    raw: bytes | None, source: SourceRef, *, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> Decoded:
    """Decode one message value into events and dead letters. Never raises.

    A null value (a Kafka tombstone) or an empty one is a dead letter like any
    other bad input, never an exception.
    """
    if raw is None:
        return Decoded([], [DeadLetter(b"", "empty_message: null value", source, None)])
    if not isinstance(raw, bytes):
        raw = bytes(raw)
    if not raw.strip():
        return Decoded(
            [], [DeadLetter(raw, f"empty_message: {len(raw)} bytes, no JSON", source, None)]
        )
    if len(raw) > max_bytes:
        return Decoded(
            [], [DeadLetter(raw, f"oversize: {len(raw)} > {max_bytes} bytes", source, None)]
        )
    stripped = raw.lstrip()
    if stripped[:1] == b"[":
        try:  # fast path: a clean batch validates in one call inside pydantic-core
            return Decoded(_BATCH_ADAPTER.validate_json(raw), [])
        except ValidationError:
            pass
        parsed = _json_items(raw)
        if parsed is None:
            try:
                orjson.loads(raw)
                reason = "invalid_json"
            except orjson.JSONDecodeError as exc:
                reason = f"invalid_json: {exc}"
            return Decoded([], [DeadLetter(raw, reason, source, None)])
        items, nonstandard = parsed
        events: list[Event] = []
        dead: list[DeadLetter] = []
        for i, item in enumerate(items):
            item_raw = _item_bytes(item, nonstandard)
            try:
                events.append(EVENT_ADAPTER.validate_json(item_raw))
            except ValidationError as exc:
                dead.append(DeadLetter(item_raw, _reason(exc), source, i))
        return Decoded(events, dead)
    try:
        return Decoded([EVENT_ADAPTER.validate_json(raw)], [])
    except ValidationError as exc:
        if stripped[:1] != b"{":
            try:
                orjson.loads(raw)
            except orjson.JSONDecodeError as jexc:
                return Decoded([], [DeadLetter(raw, f"invalid_json: {jexc}", source, None)])
            return Decoded(
                [],
                [DeadLetter(raw, "not_an_event: value is neither object nor array", source, None)],
            )
        return Decoded([], [DeadLetter(raw, _reason(exc), source, None)])


def event_to_dict(event: Event) -> dict[str, object]:
    return event.model_dump(mode="json", exclude_none=True)


def encode_event(event: Event) -> bytes:
    return orjson.dumps(event_to_dict(event))


def encode_batch(events: Sequence[Event] | Iterable[Event]) -> bytes:
    """One message carrying a JSON array of events."""
    return orjson.dumps([event_to_dict(e) for e in events])


def dead_letter_record(d: DeadLetter) -> dict[str, object]:
    """A JSON-ready description of a dead letter (for files and logs)."""
    try:
        raw_text: str | None = d.raw.decode("utf-8")
    except UnicodeDecodeError:
        raw_text = None
    out: dict[str, object] = {
        "reason": d.reason,
        "source": {
            "topic": d.source.topic,
            "partition": d.source.partition,
            "offset": d.source.offset,
        },
        "index": d.index,
    }
    if raw_text is not None:
        out["raw"] = raw_text
    else:
        out["raw_hex"] = d.raw.hex()
    return out


# --- the DLQ topic's messages (tailguard.dlq) ------------------------------------------
# A dead letter is the bytes as received, keyed by its source position, with these
# headers (read back by pipeline.adapters.reliable.read_dead_positions).
Headers = list[tuple[str, str | bytes | None]]
MAX_REASON_CHARS: Final = 2000
DLQ_REASON: Final = "tailguard.reason"  # why it is a dead letter
DLQ_TOPIC_HEADER: Final = "tailguard.source.topic"  # where it was read
DLQ_PARTITION: Final = "tailguard.source.partition"
DLQ_OFFSET: Final = "tailguard.source.offset"
DLQ_INDEX: Final = "tailguard.source.index"  # the element of a JSON array message
DLQ_TOPIC_ID: Final = "tailguard.source.topic_id"  # the source topic's generation
DLQ_ORIGINAL_SIZE: Final = "tailguard.original.size"  # a value cut to fit the topic
DLQ_TRUNCATED: Final = "tailguard.truncated"


def dead_letter_message(d: DeadLetter, topic_id: str | None = None) -> tuple[bytes, Headers]:
    """The DLQ message of a dead letter: its raw bytes, reason and source as headers."""
    headers: Headers = [
        (DLQ_REASON, d.reason[:MAX_REASON_CHARS].encode()),
        (DLQ_TOPIC_HEADER, d.source.topic.encode()),
        (DLQ_PARTITION, str(d.source.partition).encode()),
        (DLQ_OFFSET, str(d.source.offset).encode()),
    ]
    if d.index is not None:
        headers.append((DLQ_INDEX, str(d.index).encode()))
    if topic_id is not None:
        headers.append((DLQ_TOPIC_ID, topic_id.encode()))
    return d.raw, headers


def dead_letter_key(d: DeadLetter) -> bytes | None:
    """A dead letter's message key: its source position, ``topic/partition/offset`` (and
    ``/index`` for one element of a batch); None for a letter with no position (a
    record the store refused, built from several messages)."""
    if d.source.partition < 0 or d.source.offset < 0:
        return None
    key = f"{d.source.topic}/{d.source.partition}/{d.source.offset}"
    return (key if d.index is None else f"{key}/{d.index}").encode()


def truncate_dead(value: bytes, headers: Headers | None, size: int) -> tuple[bytes, Headers]:
    """The first ``size`` bytes of a dead letter, its original size kept in a header."""
    out = [h for h in headers or [] if h[0] not in (DLQ_TRUNCATED,)]
    if not any(h[0] == DLQ_ORIGINAL_SIZE for h in out):
        out.append((DLQ_ORIGINAL_SIZE, str(len(value)).encode()))
    out.append((DLQ_TRUNCATED, str(size).encode()))
    return value[:size], out


SUBPOSITION_BYTES: Final = 1024  # a truncated letter keeps at least this much


def dead_subposition(index: int | None, raw: bytes) -> int:
    """Which letter of a source message a dead letter is (with its topic, partition and
    offset, what one letter per position is keyed by): its event's ``index`` in the
    message when known; else (a whole message, or an event held and quarantined, whose
    index the processor does not keep) -1 less a checksum of its first bytes, the same
    for the same bytes read again, and the same once truncated."""
    if index is not None:
        return index
    return -1 - (zlib.crc32(bytes(raw[:SUBPOSITION_BYTES])) & 0x7FFFFFFF)
