"""The ``lifecycle_events`` table (raw events): its rows, and the writers of the
processor's kept messages (JSON lines the embedded engine reads itself, column-wise
otherwise; a refused message isolated event by event)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from msgspec import Raw

from pipeline.contract.wire import AnyEvent, EventBytes, event_slices
from pipeline.core.processor import KeptMessage

from .embedded import _quote
from .inserts import _JSON, _NO_INSERT_MERGE, _attr_columns, _insert, _insert_columns
from .protocol import Store, file_inserts
from .retry import _CODE_RE, is_data_error, write_isolating

log = logging.getLogger(__name__)


EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "String"),
    ("kind", "LowCardinality(String)"),
    ("request_id", "String"),
    ("ts_unix_ns", "Int64"),
    ("host", "LowCardinality(String)"),
    ("model", "LowCardinality(String)"),
    ("source_topic", "LowCardinality(String)"),
    ("source_partition", "UInt16"),
    ("source_offset", "Int64"),
    ("payload", "String"),
)
# The event's own fields among them, read by name from the decoded event.
_EVENT_FIELDS = ("event_id", "kind", "request_id", "ts_unix_ns", "host", "model")


class EventRow(NamedTuple):
    """One ``lifecycle_events`` row (:data:`EVENT_COLUMNS`) built one at a time (build it
    by keyword). The worker does not build these: it writes the processor's kept events
    as columns (:func:`write_raw_events`)."""

    event_id: str
    kind: str
    request_id: str
    ts_unix_ns: int
    host: str
    model: str
    source_topic: str
    source_partition: int
    source_offset: int
    payload: str | bytes  # the event's JSON as received


def write_events(store: Store, rows: Sequence[EventRow]) -> None:
    _insert(store, "lifecycle_events", EVENT_COLUMNS, rows)


# An event kept one at a time: (partition, offset, event, its bytes as received). The
# processor keeps whole messages (KeptMessage); tests and tools build these.
KeptEvent = tuple[int, int, AnyEvent, EventBytes]


def kept_events(kept: Sequence[KeptMessage]) -> list[KeptEvent]:
    """The kept messages event by event (the column-wise insert, dead letters)."""
    out: list[KeptEvent] = []
    for m in kept:
        raws = event_slices(m.payload) if isinstance(m.payload, bytes) else m.payload
        out.extend((m.partition, m.offset, ev, raw) for ev, raw in zip(m.events, raws, strict=True))
    return out


def raw_event_columns(topic: str, kept: Sequence[KeptEvent]) -> list[list[Any]]:
    """The :data:`EVENT_COLUMNS` of kept events, by name (no row per event is built); the
    payload is the event's bytes as the producer sent them (not decoded to ``str`` and
    encoded again)."""
    events = [k[2] for k in kept]
    by_name = dict(zip(_EVENT_FIELDS, _attr_columns(events, _EVENT_FIELDS), strict=True))
    by_name["source_topic"] = [topic] * len(kept)
    by_name["source_partition"] = [k[0] for k in kept]
    by_name["source_offset"] = [k[1] for k in kept]
    by_name["payload"] = [bytes(k[3]) for k in kept]
    return [by_name[n] for n, _ in EVENT_COLUMNS]


def _plain(t: str) -> str:
    return t.removeprefix("LowCardinality(").removesuffix(")") if t.startswith("Low") else t


# Into the embedded engine, raw events go as JSON lines (JSONCompactEachRow), one per
# message: its partition and offset, its events and its events' bytes. A message the
# decoder accepted whole is a JSON array of its events: it is written verbatim, twice,
# and read by the engine once as an array of named tuples (the event's fields; other keys
# ignored) and once as an array of the events' own text, byte for byte
# (input_format_json_read_objects_as_strings); ARRAY JOIN makes the rows. No value is
# handled in Python per event: only the message's bytes are copied (the old path built a
# row of fields per event, ~1.3 µs of the writer's GIL time an event, after the decoder
# had sliced every message for it, ~0.7 µs of the event loop's). The source topic is one
# literal of the SELECT.
_TYPES = dict(EVENT_COLUMNS)
_EVENT_TUPLE = ", ".join(f"{n} {_plain(_TYPES[n])}" for n in _EVENT_FIELDS)
_MESSAGE_STRUCTURE = (
    f"source_partition {_TYPES['source_partition']}, source_offset {_TYPES['source_offset']}, "
    f"events Array(Tuple({_EVENT_TUPLE})), payloads Array(String)"
)
_MESSAGE_ARRAY_JOIN = "ARRAY JOIN events AS e, payloads AS payload"
_EVENT_NAMES = tuple(n for n, _ in EVENT_COLUMNS)
# INCORRECT_DATA (an object with a repeated key), SIZES_OF_ARRAYS_DONT_MATCH (the two
# readings of a message disagree: never seen): the engine's reading of the messages
# failed, not the store.
_READ_ERROR_CODES = frozenset({117, 190})
_OBJECTS_AS_TEXT = {"input_format_json_read_objects_as_strings": 1}


class _MessageLine(NamedTuple):
    """One line of :data:`_MESSAGE_STRUCTURE`."""

    source_partition: int
    source_offset: int
    events: list[Raw] | list[dict[str, Any]]  # JSON objects with _EVENT_FIELDS
    payloads: list[Raw | str]


def _json_payload(raw: EventBytes) -> Raw | str:
    """An event's bytes as a JSON value the engine reads back byte for byte: a JSON object
    as itself (a slice of its message is one), anything else (a whole message with
    whitespace around its object) as a JSON string of its text (valid UTF-8: the decoder
    checked it)."""
    if type(raw) is Raw:
        return raw
    data = bytes(raw)
    return Raw(data) if data[:1] == b"{" and data[-1:] == b"}" else data.decode()


def _message_lines(kept: Sequence[KeptMessage], *, decoded: bool) -> list[bytes]:
    """The kept messages as lines of :data:`_MESSAGE_STRUCTURE`, in pieces (written to the
    file one after the other: a message's bytes are copied once, by the kernel). The
    events' fields are read by the engine from their bytes, or with ``decoded`` given as
    the decoder read them (the engine refuses an object with a repeated key, which the
    decoder reads as its last value)."""
    if decoded:
        lines = []
        for m in kept:
            payload = m.payload
            raws = event_slices(payload) if isinstance(payload, bytes) else payload
            lines.append(
                _MessageLine(
                    m.partition,
                    m.offset,
                    [{n: getattr(ev, n) for n in _EVENT_FIELDS} for ev in m.events],
                    [_json_payload(r) for r in raws],
                )
            )
        return [_JSON.encode_lines(lines)]
    pieces: list[bytes] = []
    add = pieces.extend
    for m in kept:
        payload = m.payload
        if isinstance(payload, bytes):  # the message, an array of the events: twice
            add((b"[%d,%d," % (m.partition, m.offset), payload, b",", payload, b"]\n"))
        else:
            line = _MessageLine(
                m.partition,
                m.offset,
                [Raw(bytes(r)) for r in payload],
                [_json_payload(r) for r in payload],
            )
            add((_JSON.encode(line), b"\n"))
    return pieces


def write_raw_messages(store: Store, topic: str, kept: Sequence[KeptMessage]) -> None:
    """The processor's kept messages of ``topic`` into ``lifecycle_events``, one row per
    event."""
    if not kept:
        return
    files = file_inserts(store)
    if files is None:
        _insert_columns(
            store, "lifecycle_events", EVENT_COLUMNS, raw_event_columns(topic, kept_events(kept))
        )
        return
    select = ", ".join(
        _quote(topic) if n == "source_topic" else n if n.startswith("source_") or n == "payload"
        else f"e.{n}"
        for n in _EVENT_NAMES
    )  # fmt: skip
    # no event id twice (a message delivered twice in one batch): no key repeats
    ids = [ev.event_id for m in kept for ev in m.events]
    unique = len(set(ids)) == len(ids)
    settings = _OBJECTS_AS_TEXT | _NO_INSERT_MERGE if unique else _OBJECTS_AS_TEXT

    def insert(decoded: bool) -> None:
        files.insert_from_file(
            "lifecycle_events", _EVENT_NAMES, select, _message_lines(kept, decoded=decoded),
            fmt="JSONCompactEachRow", structure=_MESSAGE_STRUCTURE, settings=settings,
            array_join=_MESSAGE_ARRAY_JOIN,
        )  # fmt: skip

    try:
        insert(decoded=False)
    except Exception as exc:
        m = _CODE_RE.search(str(exc))
        if not (is_data_error(exc) or (m is not None and int(m.group(1)) in _READ_ERROR_CODES)):
            raise
        # An event the engine does not read as the decoder did (a repeated key): each
        # event's fields as decoded, and its bytes sliced here, instead. The failed insert
        # wrote nothing as long as it had fewer rows than one insert block (an INSERT ...
        # SELECT writes in blocks of min_insert_block_size_rows, ~1 M; a flush holds far
        # fewer); rows of a block written before the failure come again identical, and the
        # table collapses them (ReplacingMergeTree, one row per event id).
        log.info(
            "raw events: the engine could not read %d messages as sent (%s); "
            "writing the decoded fields",
            len(kept),
            str(exc).split("\n", 1)[0],
        )
        insert(decoded=True)


def write_raw_isolating(
    store: Store,
    topic: str,
    kept: Sequence[KeptMessage],
    *,
    retry: Callable[[Callable[[], None], str], int],
) -> tuple[int, list[tuple[KeptEvent, str]]]:
    """:func:`write_raw_messages` under :func:`write_isolating`: a message the store
    refuses is written again event by event, so that only the events it refuses are
    returned (with its reason), each with its own offset. Returns the retries too."""
    what = "write of raw events"
    retries, refused = write_isolating(
        lambda rows: write_raw_messages(store, topic, rows), kept, what, retry=retry
    )
    if not refused:
        return retries, []
    more, rejected = write_isolating(
        lambda rows: write_raw_events(store, topic, rows),
        kept_events([m for m, _ in refused]),
        what,
        retry=retry,
    )
    return retries + more, rejected


def write_raw_events(store: Store, topic: str, kept: Sequence[KeptEvent]) -> None:
    """Kept events of ``topic`` into ``lifecycle_events`` (each as a message of its own)."""
    if not kept:
        return
    if file_inserts(store) is not None:
        write_raw_messages(
            store,
            topic,
            [KeptMessage(p, off, [ev], [raw]) for p, off, ev, raw in kept],  # type: ignore[list-item]
        )
    else:
        _insert_columns(store, "lifecycle_events", EVENT_COLUMNS, raw_event_columns(topic, kept))
