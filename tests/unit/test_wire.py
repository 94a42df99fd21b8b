"""The worker's fast decoder (msgspec Structs) agrees with the reference (pydantic):
same events field by field, same dead letters and reasons, on valid and malformed input."""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contract.codec import SourceRef, decode_message, encode_batch, encode_event
from pipeline.contract.events import GatewayCompleted
from pipeline.contract.wire import CompletedWire, decode_fast, from_model
from tests.factories import completed, finished, received
from tests.integration.malformed import TEMPLATES, bad_event, dumps, malformed, not_json

SRC = SourceRef("tailguard.lifecycle", 3, 42)

STATS = {"v": 1, "event_id": "s-1", "kind": "engine.stats", "ts_unix_ns": 1_763_316_946_680_590_000,
         "host": "engine-0", "model": "m", "num_running": 3, "num_waiting": 0,
         "kv_cache_usage": 0.5}  # fmt: skip


def _fields(ev: Any) -> dict[str, Any]:
    if isinstance(ev, msgspec.Struct):
        return {"kind": ev.kind, **msgspec.structs.asdict(ev)}
    return dict(ev.model_dump())


def _agree(raw: bytes) -> None:
    ref = decode_message(raw, SRC)
    fast = decode_fast(raw, SRC)
    assert [_fields(e) for e in fast.events] == [_fields(e) for e in ref.events], raw[:300]
    assert fast.dead == ref.dead, raw[:300]
    assert len(fast.raws) == len(fast.events)
    for ev, r in zip(fast.events, fast.raws, strict=True):
        # the stored bytes decode to the same event
        assert [_fields(e) for e in decode_message(bytes(r), SRC).events] == [_fields(ev)]


def test_valid_events_decode_to_the_same_fields() -> None:
    events = [received("r1"), completed("r1"), finished("r1"), received("r2", tenant=None)]
    for ev in events:
        _agree(encode_event(ev))
    _agree(encode_batch(events))
    _agree(orjson.dumps(STATS))
    _agree(b"  [ " + encode_event(events[0]) + b" ,\n" + orjson.dumps(STATS) + b"]")


def test_original_bytes_are_kept() -> None:
    one = b'{"kind":"gateway.received", "v":1, "event_id":"e","ts_unix_ns":5,"host":"h",' \
          b'"model":"m","request_id":"r","priority":0,"extra":{"a":[1,2]}}'  # fmt: skip
    out = decode_fast(b"[" + one + b" , " + one + b"]", SRC)
    assert [bytes(r) for r in out.raws] == [one, one]
    assert decode_fast(one, SRC).raws == [one]


def test_from_model_is_the_same_event() -> None:
    for ev in (received("r"), completed("r"), finished("r")):
        assert _fields(from_model(ev)) == _fields(ev)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("v", True), ("v", 1.0), ("v", "1"), ("v", 2), ("ts_unix_ns", 2**63), ("ts_unix_ns", 0),
        ("ts_unix_ns", 2**63 - 1), ("ts_unix_ns", 5.0), ("total_ms", 2.0**53),
        ("total_ms", 2.0**53 * 1.01), ("total_ms", 1e400), ("total_ms", -0.0), ("total_ms", 7),
        ("total_ms", True), ("http_status", 599), ("http_status", 600), ("http_status", 200.0),
        ("output_tokens", 2**32 - 1), ("output_tokens", 2**32), ("event_id", "é" * 128),
        ("event_id", "é" * 129), ("event_id", "\ud800"), ("host", "h" * 256), ("host", ""),
        ("ttfb_ms", None), ("outcome", "OK"), ("kind", "engine.stats"),
    ],
)  # fmt: skip
def test_boundaries_agree(field: str, value: object) -> None:
    doc = dict(TEMPLATES["gateway.completed"])
    doc[field] = value
    raw = dumps(doc) if value != 1e400 else dumps(doc).replace(b"Infinity", b"1e400")
    _agree(raw)
    _agree(b"[" + raw + b"," + encode_event(completed("x")) + b"]")


def test_duplicate_keys_agree() -> None:
    base = encode_event(completed("r"))[:-1]
    _agree(base + b',"total_ms":-1}')
    _agree(base + b',"total_ms":3.5}')


@given(st.lists(bad_event(), max_size=4), st.booleans())
@settings(max_examples=400)
def test_bad_events_agree(items: list[Any], batch: bool) -> None:
    good = [orjson.loads(encode_event(received("a"))), STATS]
    if batch:
        _agree(dumps([*items, *good]))
    elif items:
        _agree(dumps(items[0]))


@given(not_json())
@settings(max_examples=300)
def test_not_json_agrees(raw: bytes) -> None:
    _agree(raw)


@given(malformed(4096))
@settings(max_examples=300)
def test_malformed_agrees(m: Any) -> None:
    if m.raw is not None:
        _agree(m.raw)
    else:
        good = [orjson.loads(encode_event(received(f"g{i}"))) for i in range(5)]
        items: list[Any] = list(good)
        for pos, item in zip(m.positions, m.bad_items, strict=True):
            items.insert(min(pos, len(items)), item)
        _agree(orjson.dumps(items))


@given(st.binary(max_size=200))
@settings(max_examples=300)
def test_arbitrary_bytes_agree(raw: bytes) -> None:
    _agree(raw)


def test_reference_model_still_rejects_what_the_structs_would_take() -> None:
    # Sanity for the fallback: one rejected element sends the message to the reference.
    doc = orjson.loads(encode_event(completed("r")))
    doc["total_ms"] = -1
    out = decode_fast(orjson.dumps([doc, orjson.loads(encode_event(completed("s")))]), SRC)
    assert [d.index for d in out.dead] == [0]
    assert [e.request_id for e in out.events] == ["s"]
    assert isinstance(completed("s"), GatewayCompleted)


@pytest.mark.parametrize(
    "extra",
    [b'"\xff\xfe"', b'"\\ud800"', b'"\\udc00x"', b'"\\x"', b"01", b"1.", b"-",
     b'{"a":[1,{"b":"\xc3\x28"}]}', b'{"a":1,}', b"[1,]", b"tru", b'"\t"', b"1e999", b"NaN",
     b"-Infinity", b'"\\u00e9"', b'{"\xff":1}'],
)  # fmt: skip
def test_unknown_fields_are_checked_like_the_reference(extra: bytes) -> None:
    # msgspec skips an unknown field's value: it must still be one the reference takes.
    raw = encode_event(received("r"))[:-1] + b',"x":' + extra + b"}"
    _agree(raw)
    _agree(b"[" + raw + b"," + encode_event(received("s")) + b"]")


def test_every_contract_field_is_on_the_wire_structs() -> None:
    """A field added to the contract (pydantic) and not to the Structs would be dropped
    silently by the worker's decoder (unknown fields are ignored)."""
    from pipeline.contract.events import EngineFinished, EngineStats, GatewayReceived
    from pipeline.contract.wire import CompletedWire, FinishedWire, ReceivedWire, StatsWire

    pairs = [(GatewayReceived, ReceivedWire), (GatewayCompleted, CompletedWire),
             (EngineFinished, FinishedWire), (EngineStats, StatsWire)]  # fmt: skip
    for model, struct in pairs:
        assert set(model.model_fields) == {"kind", *struct.__struct_fields__}, model.__name__


def test_optional_fields_added_later_decode_the_same() -> None:
    c = completed("r1").model_copy(
        update={"prompt_tokens": 700, "slo_ttft_ms": 250.0, "slo_tpot_ms": 40.0}
    )
    f = finished("r1").model_copy(update={"cold_start_unix_ns": 1_700_000_000_000_000_000})
    _agree(encode_batch([c, f]))


_MODES = [None, "shadow", "enforce"]
_VERDICTS = [None, "shed_priority", "new_session", "rate_limit", "admission", "queue_timeout",
             "retry_budget", "deadline"]  # fmt: skip


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("verdict", _VERDICTS)
def test_control_fields_decode_the_same(mode: str | None, verdict: str | None) -> None:
    """gateway.completed's control_mode / control_verdict (issue 48): every value of the
    contract decodes on the fast path (no fallback, no dead letter) to the same event."""
    doc = dict(TEMPLATES["gateway.completed"], control_mode=mode, control_verdict=verdict)
    raw = dumps(doc)
    _agree(raw)
    out = decode_fast(raw, SRC)
    assert out.dead == []
    (ev,) = out.events
    assert isinstance(ev, CompletedWire)
    assert (ev.control_mode, ev.control_verdict) == (mode, verdict)


def test_control_fields_absent_are_none() -> None:
    doc = dict(TEMPLATES["gateway.completed"])
    doc.pop("control_mode", None)
    doc.pop("control_verdict", None)
    (ev,) = decode_fast(dumps(doc), SRC).events
    assert (ev.control_mode, ev.control_verdict) == (None, None)


def _dead_alike(kind: str, field: str, value: object) -> None:
    """``kind``'s template with ``field`` set to ``value``: a dead letter on the fast path,
    and the reference decoder agrees."""
    raw = dumps(dict(TEMPLATES[kind], **{field: value}))
    _agree(raw)
    out = decode_fast(raw, SRC)
    assert (out.events, len(out.dead)) == ([], 1)


@pytest.mark.parametrize(
    ("field", "value"),
    [("control_mode", "off"), ("control_mode", "SHADOW"), ("control_mode", ""),
     ("control_mode", 1), ("control_verdict", "shed"), ("control_verdict", "Admission"),
     ("control_verdict", 429), ("control_verdict", ["admission"])],
)  # fmt: skip
def test_bad_control_fields_are_dead_letters_alike(field: str, value: object) -> None:
    _dead_alike("gateway.completed", field, value)


def _literal_values(annotation: Any) -> set[Any]:
    """The values of the Literals in an (optional) annotation."""
    if typing.get_origin(annotation) is typing.Literal:
        return set(typing.get_args(annotation))
    return {v for arg in typing.get_args(annotation) for v in _literal_values(arg)}


def test_control_literals_are_the_contracts() -> None:
    ref = typing.get_type_hints(GatewayCompleted)
    wire = typing.get_type_hints(CompletedWire)
    for name, values in (("control_mode", _MODES), ("control_verdict", _VERDICTS)):
        assert _literal_values(ref[name]) == set(values[1:]), name
        assert _literal_values(wire[name]) == set(values[1:]), name


@pytest.mark.parametrize(
    ("attempt", "logical"), [(0, None), (1, "a"), (65_535, "k" * 256), (3, "idem \u00e9\n")]
)
def test_client_attempt_fields_decode_the_same(attempt: int, logical: str | None) -> None:
    """gateway.received's client_attempt / logical_request_id (issue 47): decoded on the
    fast path (no fallback, no dead letter) to the same event; absent: 0 / None."""
    doc = dict(TEMPLATES["gateway.received"], client_attempt=attempt, logical_request_id=logical)
    raw = dumps(doc)
    _agree(raw)
    (ev,) = decode_fast(raw, SRC).events
    assert (ev.client_attempt, ev.logical_request_id) == (attempt, logical)
    bare = {k: v for k, v in TEMPLATES["gateway.received"].items()
            if k not in ("client_attempt", "logical_request_id")}  # fmt: skip
    (ev,) = decode_fast(dumps(bare), SRC).events
    assert (ev.client_attempt, ev.logical_request_id) == (0, None)


@pytest.mark.parametrize(
    ("field", "value"),
    [("client_attempt", -1), ("client_attempt", 65_536), ("client_attempt", "1"),
     ("client_attempt", 1.5), ("logical_request_id", ""), ("logical_request_id", "k" * 257),
     ("logical_request_id", 7)],
)  # fmt: skip
def test_bad_client_attempt_fields_are_dead_letters_alike(field: str, value: object) -> None:
    _dead_alike("gateway.received", field, value)


@pytest.mark.parametrize("preemptions", [None, 0, 7, 2**32 - 1])
def test_stats_preemptions_decode_the_same(preemptions: int | None) -> None:
    """engine.stats' optional preemptions (issue 51): decoded on the fast path to the same
    event; an event without it (every emitter before) stays valid, with None."""
    raw = dumps(dict(STATS, preemptions=preemptions))
    _agree(raw)
    (ev,) = decode_fast(raw, SRC).events
    assert ev.preemptions == preemptions
    (ev,) = decode_fast(dumps(STATS), SRC).events
    assert ev.preemptions is None
    assert not decode_fast(dumps(STATS), SRC).dead


@pytest.mark.parametrize("value", [-1, 2**32, 1.5, "3", True, [1]])
def test_bad_stats_preemptions_are_dead_letters_alike(value: object) -> None:
    raw = dumps(dict(STATS, preemptions=value))
    _agree(raw)
    out = decode_fast(raw, SRC)
    assert (out.events, len(out.dead)) == ([], 1)
