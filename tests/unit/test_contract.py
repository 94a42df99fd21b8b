from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contract import SourceRef, decode_message, encode_batch, encode_event, json_schema
from pipeline.contract.partitioning import murmur2, partition_for
from tests.factories import completed, finished, received

SRC = SourceRef("tailguard.lifecycle", 3, 42)


def _ok(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "v": 1,
        "event_id": "e1",
        "kind": "gateway.completed",
        "request_id": "r1",
        "ts_unix_ns": 1_700_000_000_000_000_000,
        "host": "gw",
        "model": "m",
        "total_ms": 120.5,
        "ttfb_ms": 12.0,
        "http_status": 200,
        "outcome": "ok",
    }
    base.update(over)
    return base


def test_round_trip_each_kind() -> None:
    events = [received("r1"), completed("r1"), finished("r1")]
    for ev in events:
        out = decode_message(encode_event(ev), SRC)
        assert out.dead == []
        assert out.events == [ev]
    out = decode_message(encode_batch(events), SRC)
    assert out.events == events


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "invalid_json"),
        (b"[1, 2", "invalid_json"),
        (b'"a string"', "not_an_event"),
        (b"42", "not_an_event"),
        (orjson.dumps(_ok(kind="gateway.exploded")), "invalid_event"),
        (orjson.dumps(_ok(total_ms=-1.0)), "total_ms"),
        (orjson.dumps(_ok(total_ms="120")), "total_ms"),
        (orjson.dumps(_ok(v=2)), "v"),
        (orjson.dumps(_ok(outcome="great")), "outcome"),
        (orjson.dumps(_ok(request_id="")), "request_id"),
        (orjson.dumps(_ok(ts_unix_ns=-5)), "ts_unix_ns"),
        (orjson.dumps({k: v for k, v in _ok().items() if k != "event_id"}), "event_id"),
        (b"[" + b" " * 2_000_000 + b"]", "oversize"),
    ],
)
def test_malformed_messages_become_dead_letters(raw: bytes, reason: str) -> None:
    out = decode_message(raw, SRC)
    assert out.events == []
    assert len(out.dead) == 1
    d = out.dead[0]
    assert reason in d.reason
    assert d.source == SRC
    assert d.raw == raw


def test_one_bad_event_does_not_reject_its_neighbours() -> None:
    good1, good2 = (
        orjson.loads(encode_event(received("a"))),
        orjson.loads(encode_event(completed("a"))),
    )
    raw = orjson.dumps([good1, _ok(queue_ms=1, total_ms=-3), good2, "junk"])
    out = decode_message(raw, SRC)
    assert [e.event_id for e in out.events] == ["a:r", "a:c"]
    assert [d.index for d in out.dead] == [1, 3]
    assert all(d.source == SRC for d in out.dead)
    assert orjson.loads(out.dead[1].raw) == "junk"


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    out = decode_message(orjson.dumps(_ok(new_field_from_v1_1="x")), SRC)
    assert out.dead == []
    assert len(out.events) == 1


@given(st.binary(max_size=300))
@settings(max_examples=300)
def test_decode_never_raises_on_arbitrary_bytes(raw: bytes) -> None:
    out = decode_message(raw, SRC)
    # Whatever the bytes, the message is accounted for: events, dead letters, or an empty batch.
    accounted = len(out.events) + len(out.dead)
    assert accounted >= 1 or orjson.loads(raw) == []


@given(
    st.lists(
        st.one_of(
            st.integers(min_value=-(2**63), max_value=2**63 - 1),
            st.text(max_size=5),
            st.none(),
            st.dictionaries(
                st.text(max_size=5),
                st.integers(min_value=-(2**63), max_value=2**63 - 1),
                max_size=3,
            ),
        ),
        max_size=20,
    )
)
def test_every_batch_element_is_accounted_for(items: list[object]) -> None:
    items = [*items, orjson.loads(encode_event(received("x")))]
    out = decode_message(orjson.dumps(items), SRC)
    assert len(out.events) + len(out.dead) == len(items)


# Vectors from Apache Kafka's UtilsTest.testMurmur2.
@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("21", -973932308),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("a-little-bit-longer-string", -1486304829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        ("abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(key: str, expected: int) -> None:
    assert murmur2(key.encode()) == expected


def test_partition_for_is_stable_and_in_range() -> None:
    parts = {partition_for(f"req-{i}", 8) for i in range(1000)}
    assert parts == set(range(8))
    assert partition_for("req-1", 8) == partition_for("req-1", 8)
    with pytest.raises(ValueError, match="num_partitions"):
        partition_for("x", 0)


def test_json_schema_names_every_kind() -> None:
    text = orjson.dumps(json_schema()).decode()
    for kind in ("gateway.received", "gateway.completed", "engine.finished", "engine.stats"):
        assert kind in text


@pytest.mark.parametrize("v", [True, 1.0, 2, "1"])
def test_version_must_be_the_json_integer_1(v: object) -> None:
    doc = orjson.loads(orjson.dumps(completed("r").model_dump()))
    doc["v"] = v
    out = decode_message(orjson.dumps(doc), SourceRef("t", 0, 0))
    assert out.events == []
    assert len(out.dead) == 1
