"""Window summaries on the wire: v2 (named fields) round-trips; v1 (positional arrays,
written by earlier releases and possibly still on the topic) is still read."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.contract.sketch import SKETCH_FIELDS, SketchColumns, sketch_record
from pipeline.contract.summary import (
    SUMMARY_VERSION,
    ModelWindow,
    Progress,
    SLOWindowCounts,
    StatsSample,
    WindowSummary,
    decode_summary,
    encode_summary,
)

SK = SketchColumns(3, 360.0, 100.0, 140.0, 0, [460, 470], [2, 1], [], [])
WIN = WindowSummary(
    2, 1_700_000_000_000, 10_000,
    {"*": ModelWindow(3, {"queue_ms": SK}), "m": ModelWindow(3, {"queue_ms": SK})},
    {"chat-p99": SLOWindowCounts(3, 2, 0.99)},
)  # fmt: skip

# Exactly what the v1 encoder wrote for WIN (and for variants of it), byte for byte.
V1_WINDOW = (
    b'{"v":1,"type":"window","partition":2,"start_ms":1700000000000,"size_ms":10000,'
    b'"models":{"*":{"records":3,"b":{"queue_ms":[3,360.0,100.0,140.0,0,[460,470],[2,1],[],[]]}},'
    b'"m":{"records":3,"b":{"queue_ms":[3,360.0,100.0,140.0,0,[460,470],[2,1],[],[]]}}},'
    b'"slos":{"chat-p99":[3,2,0.99]}}'
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (V1_WINDOW, WIN),
        (
            V1_WINDOW[:-1] + b',"final":false}',
            WindowSummary(WIN.partition, WIN.start_ms, WIN.size_ms, WIN.models, WIN.slos, False),
        ),
        (
            b'{"v":1,"type":"window","partition":0,"start_ms":0,"size_ms":10000,"models":{},'
            b'"slos":{"s":[-1,-1,0.9]},"correction_id":"0/0/x"}',
            WindowSummary(0, 0, 10_000, {}, {"s": SLOWindowCounts(-1, -1, 0.9)}, True, "0/0/x"),
        ),
        (
            b'{"v":1,"type":"progress","partition":1,"horizon_ms":5,"clock_ms":7}',
            Progress(1, 5, 7),
        ),
        (
            b'{"v":1,"type":"stats","host":"h","model":"m","ts_ms":9,"num_running":1,'
            b'"num_waiting":2,"kv_cache_usage":0.5,"prefix_cache_hit_rate":null,'
            b'"gpu_memory_used_fraction":0.25}',
            StatsSample("h", "m", 9, 1, 2, 0.5, None, 0.25),
        ),
    ],
)
def test_v1_messages_are_still_read(raw: bytes, expected: object) -> None:
    assert decode_summary(raw) == expected


def test_v2_window_has_named_fields() -> None:
    d = orjson.loads(encode_summary(WIN))
    assert d["v"] == SUMMARY_VERSION == 2
    assert d["models"]["m"]["boundaries"]["queue_ms"] == dict(
        zip(SKETCH_FIELDS, (3, 360.0, 100.0, 140.0, 0, [460, 470], [2, 1], [], []), strict=True)
    )
    assert d["slos"] == {"chat-p99": {"total": 3, "good": 2, "objective": 0.99}}
    assert "final" not in d
    assert "correction_id" not in d
    assert "tiers" not in d  # none: the v2 message of a spec without blended tiers


@pytest.mark.parametrize(
    "s",
    [
        WIN,
        WindowSummary(1, 0, 60_000, WIN.models, {}, final=False),
        WindowSummary(1, 0, 60_000, {}, {"s": SLOWindowCounts(-2, 1, 0.999)}, True, "c-1"),
        WindowSummary(2, 0, 10_000, WIN.models, WIN.slos, tiers={"blended": 4}),
        WindowSummary(2, 0, 10_000, {}, {}, True, "c-2", tiers={"blended": -1}),
        Progress(3, 1_000),
        Progress(3, 1_000, 2_000),
        StatsSample("h", "m", 1, 0, 0, 0.0, 0.5, None),
    ],
)
def test_v2_round_trip(s: WindowSummary | StatsSample | Progress) -> None:
    assert decode_summary(encode_summary(s)) == s


_counts = st.lists(st.integers(1, 2**40), max_size=5)


@given(
    count=st.integers(0, 2**53),
    total=st.floats(allow_nan=False, allow_infinity=False),
    keys=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5),
    counts=_counts,
)
def test_sketch_round_trip(count: int, total: float, keys: list[int], counts: list[int]) -> None:
    sk = SketchColumns(count, total, -1.5, 2.5, 0, keys, counts, counts, keys)
    s = WindowSummary(0, 0, 1, {"*": ModelWindow(count, {"tpot_ms": sk})}, {})
    assert decode_summary(encode_summary(s)) == s
    assert list(sketch_record(sk)) == list(SKETCH_FIELDS)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b'{"v":3,"type":"progress","partition":1,"horizon_ms":5}', ValueError),
        (b'{"v":true,"type":"progress","partition":1,"horizon_ms":5}', ValueError),
        (b'{"type":"progress","partition":1,"horizon_ms":5}', ValueError),
        (b"[1,2]", TypeError),
        (b'{"v":2,"type":"nope"}', ValueError),
        # a v2 window with v1's positional sketches, and the reverse
        (V1_WINDOW.replace(b'"v":1', b'"v":2'), KeyError),
        (
            encode_summary(WIN).replace(b'"v":2', b'"v":1'),
            KeyError,
        ),
        # a positional sketch with a missing item
        (V1_WINDOW.replace(b",[],[]]", b",[]]"), ValueError),
        (b"not json", ValueError),
    ],
)
def test_malformed_summaries_raise(raw: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_summary(raw)
