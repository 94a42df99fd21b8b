"""The hand-written protobuf exposition (pipeline.adapters.prometheus_proto): varints and
zigzag against the protobuf documentation's examples, one family against bytes encoded by
hand, spans and deltas as a table, and whole families read back by a decoder of the wire
format written here from metrics.proto's field numbers (a second reading of the spec, not
the encoder's code)."""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest

from pipeline.adapters import prometheus_proto as pp
from pipeline.adapters.prometheus import MetricsState, render_for
from pipeline.contract.summary import ModelWindow, SLOWindowCounts, WindowSummary
from pipeline.core.sketch import QuantileSketch
from pipeline.core.slo_exposition import (
    Family,
    HistogramSample,
    NativeBuckets,
    Sample,
    WindowCounters,
    native_upper_bound,
)

# --- a decoder of the wire format (field numbers from metrics.proto) --------------------


def _varint(b: bytes, i: int) -> tuple[int, int]:
    n, shift = 0, 0
    while True:
        byte = b[i]
        n |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return n, i
        shift += 7


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _fields(b: bytes) -> list[tuple[int, Any]]:
    """``(field number, value)``: an int (varint), 8 bytes (I64) or bytes (LEN)."""
    out, i = [], 0
    while i < len(b):
        key, i = _varint(b, i)
        field, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, i = _varint(b, i)
        elif wire == 1:
            value, i = b[i : i + 8], i + 8
        elif wire == 2:
            size, i = _varint(b, i)
            value, i = b[i : i + size], i + size
        else:
            raise AssertionError(f"wire type {wire}")
        out.append((field, value))
    assert i == len(b)
    return out


def _double(raw: bytes) -> float:
    return float(struct.unpack("<d", raw)[0])


def _timestamp(b: bytes) -> float:
    f = dict(_fields(b))
    return float(f.get(1, 0) + f.get(2, 0) / 1e9)


def _histogram(b: bytes) -> dict[str, Any]:
    h: dict[str, Any] = {"buckets": [], "spans": [], "deltas": []}
    for field, v in _fields(b):
        if field == 1:
            h["count"] = v
        elif field == 2:
            h["sum"] = _double(v)
        elif field == 3:
            bucket = dict(_fields(v))
            h["buckets"].append((_double(bucket[2]), bucket[1]))
        elif field == 5:
            h["schema"] = _unzigzag(v)
        elif field == 6:
            h["zero_threshold"] = _double(v)
        elif field == 7:
            h["zero_count"] = v
        elif field == 12:
            span = dict(_fields(v))
            h["spans"].append((_unzigzag(span.get(1, 0)), span.get(2, 0)))
        elif field == 13:
            h["deltas"].append(_unzigzag(v))
        elif field == 15:
            h["start_s"] = _timestamp(v)
        else:
            raise AssertionError(f"Histogram field {field}")
    return h


def _metric(b: bytes) -> dict[str, Any]:
    m: dict[str, Any] = {"labels": []}
    for field, v in _fields(b):
        if field == 1:
            pair = dict(_fields(v))
            m["labels"].append((pair[1].decode(), pair[2].decode()))
        elif field == 2:
            m["gauge"] = _double(dict(_fields(v))[1])
        elif field == 3:
            c = dict(_fields(v))
            m["counter"] = _double(c[1])
            if 3 in c:
                m["start_s"] = _timestamp(c[3])
        elif field == 7:
            m["histogram"] = _histogram(v)
        else:
            raise AssertionError(f"Metric field {field}")
    return m


def decode(stream: bytes) -> list[dict[str, Any]]:
    """A delimited stream of MetricFamily messages."""
    families, i = [], 0
    while i < len(stream):
        size, i = _varint(stream, i)
        fam: dict[str, Any] = {"metrics": []}
        for field, v in _fields(stream[i : i + size]):
            if field == 1:
                fam["name"] = v.decode()
            elif field == 2:
                fam["help"] = v.decode()
            elif field == 3:
                fam["type"] = v
            elif field == 4:
                fam["metrics"].append(_metric(v))
            else:
                raise AssertionError(f"MetricFamily field {field}")
        families.append(fam)
        i += size
    return families


def native_counts(h: dict[str, Any]) -> list[tuple[int, int]]:
    """The populated buckets ``(index, count)`` of a decoded native histogram."""
    out, index, count, deltas = [], 0, 0, iter(h["deltas"])
    for n, (offset, length) in enumerate(h["spans"]):
        index = offset if n == 0 else index + offset
        for _ in range(length):
            count += next(deltas)
            if count:
                out.append((index, count))
            index += 1
    assert next(deltas, None) is None
    return out


# --- the tables ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "encoded"),
    [
        (0, "00"), (1, "01"), (127, "7f"), (128, "8001"), (150, "9601"), (300, "ac02"),
        (2**63 - 1, "ffffffffffffffff7f"), (2**64 - 1, "ffffffffffffffffff01"),
        (-1, "ffffffffffffffffff01"),  # an int64 -1: ten bytes
    ],
)  # fmt: skip
def test_varint(n: int, encoded: str) -> None:
    assert pp.varint(n).hex() == encoded
    assert _varint(pp.varint(n), 0)[0] == n % 2**64


@pytest.mark.parametrize(
    ("n", "z"),
    [(0, 0), (-1, 1), (1, 2), (-2, 3), (2**31 - 1, 2**32 - 2), (-(2**31), 2**32 - 1)],
)
def test_zigzag(n: int, z: int) -> None:
    assert pp.zigzag(n) == z
    assert _unzigzag(z) == n


def test_a_gauge_family_is_the_hand_encoded_bytes() -> None:
    family = Family("a", "h", "gauge", (Sample((("k", "v"),), 1.0),))
    want = bytes.fromhex(
        "0a0161"  # name (1, LEN) "a"
        "120168"  # help (2, LEN) "h"
        "1801"  # type (3, varint) GAUGE
        "2213"  # metric (4, LEN) 19 bytes:
        "0a06" "0a016b" "120176"  # label (1, LEN): name (1) "k", value (2) "v"
        "1209" "09" "000000000000f03f"  # gauge (2, LEN): value (1, I64) 1.0
    )  # fmt: skip
    assert pp.encode_family(family) == want
    assert pp.encode([family]) == bytes([len(want)]) + want


@pytest.mark.parametrize(
    ("positive", "spans", "deltas"),
    [
        ([], [], []),
        ([(5, 3)], [(5, 1)], [3]),
        ([(5, 3), (6, 1)], [(5, 2)], [3, -2]),
        # a gap of 2 is filled with zero counts, a gap of 3 opens a span
        ([(5, 3), (8, 1)], [(5, 4)], [3, -3, 0, 1]),
        ([(5, 3), (9, 1)], [(5, 1), (3, 1)], [3, -2]),
        ([(-3, 1), (0, 2), (10, 2), (11, 7)], [(-3, 4), (9, 2)], [1, -1, 0, 2, 0, 5]),
    ],
)
def test_spans_and_deltas(
    positive: list[tuple[int, int]], spans: list[tuple[int, int]], deltas: list[int]
) -> None:
    assert pp.spans_and_deltas(positive) == (spans, deltas)
    assert native_counts({"spans": spans, "deltas": deltas}) == positive


def test_indices_must_ascend() -> None:
    with pytest.raises(ValueError, match="ascending"):
        pp.spans_and_deltas([(5, 1), (5, 2)])


def _window(latencies_ms: list[float], start_ms: int, partition: int = 0) -> WindowSummary:
    sk = QuantileSketch(0.01)
    sk.add_many(latencies_ms)
    return WindowSummary(
        partition, start_ms, 10_000,
        {"m": ModelWindow(len(latencies_ms), {"gateway_ttfb_ms": sk.to_columns()})},
        {"ttft": SLOWindowCounts(len(latencies_ms), 2, 0.99)},
    )  # fmt: skip


LATENCIES_MS = [0.0, 0.4, 3.0, 120.0, 121.0, 950.0, 2500.0, 64_000.0, 400_000.0]


def test_counters_and_histograms_read_back() -> None:
    c = WindowCounters({"gateway_ttfb_ms": [2000.0]})
    c.add(_window(LATENCIES_MS, 0))
    c.add(_window([120.0, 64_500.0], 10_000))
    families = c.families(start_s=1_767_225_600.25)
    got = {f["name"]: f for f in decode(pp.encode(families))}
    assert set(got) == {
        "tailguard_slo_requests_total",
        "tailguard_slo_good_requests_total",
        "tailguard_request_latency_seconds",
    }
    (requests,) = got["tailguard_slo_requests_total"]["metrics"]
    assert (got["tailguard_slo_requests_total"]["type"], requests["labels"]) == (
        0,
        [("slo", "ttft")],
    )
    assert (requests["counter"], requests["start_s"]) == (11.0, 1_767_225_600.25)
    hist_family = got["tailguard_request_latency_seconds"]
    assert hist_family["type"] == 4
    (metric,) = hist_family["metrics"]
    h = metric["histogram"]
    (want,) = next(f for f in families if f.kind == "histogram").samples
    assert isinstance(want, HistogramSample)
    assert want.native is not None
    assert metric["labels"] == list(want.labels)
    assert (h["count"], h["sum"], h["start_s"]) == (11, want.sum, 1_767_225_600.25)
    # the classic buckets, without +Inf (the count)
    assert h["buckets"] == [(le, n) for le, n in want.buckets if le != float("inf")]
    # the native buckets: schema 8 at 1 %, observations of 0 in the zero bucket
    assert (h["schema"], h["zero_threshold"], h["zero_count"]) == (8, 2.0**-128, 1)
    assert native_counts(h) == list(want.native.positive)
    assert sum(n for _, n in want.native.positive) + 1 == 11
    # each observation in the native bucket of the sketch's value for it (1 %)
    for v_ms in LATENCIES_MS[1:]:
        v = v_ms / 1000
        assert any(
            native_upper_bound(i - 1, 8) < v * 1.01 and v * 0.99 <= native_upper_bound(i, 8)
            for i, _ in want.native.positive
        ), v


def test_an_empty_native_histogram_is_marked_native() -> None:
    sample = HistogramSample(
        (), ((float("inf"), 0.0),), 0.0, NativeBuckets(8, 2.0**-128, 0, ()), None
    )
    (fam,) = decode(pp.encode([Family("x_seconds", "", "histogram", (sample,))]))
    h = fam["metrics"][0]["histogram"]
    # Prometheus takes a histogram as native when it has a span or a zero threshold
    assert (h["spans"], h["zero_threshold"], h["count"], h["buckets"]) == (
        [(0, 0)],
        2.0**-128,
        0,
        [],
    )
    assert "start_s" not in h


def test_gauges_and_counters_without_a_start() -> None:
    families = [
        Family("g", "a gauge", "gauge", (Sample((), -2.5), Sample((("a", "é"),), 0.0))),
        Family("c", "a counter", "counter", (Sample((), 7.0),)),
    ]
    g, c = decode(pp.encode(families))
    assert (g["name"], g["help"], g["type"]) == ("g", "a gauge", 1)
    assert [(m["labels"], m["gauge"]) for m in g["metrics"]] == [([], -2.5), ([("a", "é")], 0.0)]
    assert (c["name"], c["type"], c["metrics"]) == ("c_total", 0, [{"labels": [], "counter": 7.0}])


PROMETHEUS_NATIVE = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"
    ";q=0.6,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;"
    "escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)
PROMETHEUS_CLASSIC = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;"
    "escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("accept", "protobuf", "content_type"),
    [
        (PROMETHEUS_NATIVE, True, pp.CONTENT_TYPE),
        (PROMETHEUS_CLASSIC, False, "application/openmetrics-text; version=1.0.0"),
        ("", False, "text/plain; version=0.0.4"),
        ("*/*", False, "text/plain; version=0.0.4"),
        # the text asked for more than protobuf
        (PROMETHEUS_NATIVE.replace("q=0.6", "q=0.05"), False, "application/openmetrics-text"),
        # not the delimited MetricFamily stream
        (PROMETHEUS_NATIVE.replace("encoding=delimited", "encoding=text"), False, "application/"),
        ("application/vnd.google.protobuf;proto=io.prometheus.client.Metric;encoding=delimited",
         False, "text/plain"),
        ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
         "encoding=delimited;q=0", False, "text/plain"),
        ("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
         "encoding=delimited", True, pp.CONTENT_TYPE),
    ],
)  # fmt: skip
def test_the_accept_header_picks_the_format(accept: str, protobuf: bool, content_type: str) -> None:
    assert pp.wants_protobuf(accept) is protobuf
    state = MetricsState(counters=WindowCounters())
    state.windows_stored([_window([120.0, 950.0], 0)])
    body, got_type = render_for(state.families(), accept)
    assert got_type.startswith(content_type)
    if protobuf:
        names = [f["name"] for f in decode(body)]
        assert "tailguard_request_latency_seconds" in names
    else:
        assert b"tailguard_request_latency_seconds_bucket" in body


def test_the_start_timestamp_is_when_counting_began() -> None:
    state = MetricsState()
    before_s = time.time()
    state.use_counters(WindowCounters())
    after_s = time.time()
    state.windows_stored([_window([120.0], 0), _window([9.0], 10_000)])
    body, _ = render_for(state.families(), PROMETHEUS_NATIVE)
    starts = {
        f["name"]: [m.get("start_s") or m.get("histogram", {}).get("start_s") for m in f["metrics"]]
        for f in decode(body)
    }
    (requests_s,) = starts["tailguard_slo_requests_total"]
    assert before_s - 1e-6 <= requests_s <= after_s + 1e-6
    assert starts["tailguard_request_latency_seconds"] == [requests_s]
