"""The Prometheus protobuf exposition format, written by hand (pure: families in, bytes
out; no I/O, no ``google.protobuf``).

Prometheus scrapes native histograms only over this format: a stream of
``io.prometheus.client.MetricFamily`` messages, each preceded by its length as a varint
(:data:`CONTENT_TYPE`). The messages and field numbers are those of
``io/prometheus/client/metrics.proto`` (``prometheus/client_model`` v0.6, proto2; the
copy Prometheus parses with, ``prompb/io/prometheus/client/metrics.proto``, calls
``created_timestamp`` ``start_timestamp``, same number). Only what
:mod:`pipeline.core.slo_exposition` exposes is written:

=================  =====  =================================================================
message            field  written
=================  =====  =================================================================
MetricFamily       1 2 3  name (a counter's with ``_total``), help, type (COUNTER 0,
                   4      GAUGE 1, HISTOGRAM 4); metric
Metric             1 2 3  label (LabelPair: name 1, value 2); gauge (value 1, double);
                   7      counter (value 1, created_timestamp 3); histogram
Histogram          1 2 3  sample_count, sample_sum, bucket (classic: cumulative_count 1,
                          upper_bound 2; ``+Inf`` left out, it is the count)
                   5 6 7  schema (sint32), zero_threshold, zero_count
                   12 13  positive_span (BucketSpan: offset 1 sint32, length 2 uint32),
                          positive_delta (sint64: each bucket's count less the previous
                          bucket's, the first less 0)
                   15     created_timestamp (google.protobuf.Timestamp: seconds 1, nanos 2)
=================  =====  =================================================================

Every field is written, zero values included (proto2 ``optional``: present means set);
repeated scalars unpacked (proto2's default; decoders take both). A native histogram's
populated buckets become spans, a gap of at most 2 empty buckets filled with zero counts
rather than opening a span (as client_golang does). Checked by
``tests/unit/test_prometheus_proto.py`` (a decoder of the wire format reads back what
is written; hand-encoded bytes) and, against a real Prometheus, by
``tests/integration/test_native_histograms.py``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from typing import Final

from pipeline.core.slo_exposition import Family, HistogramSample, NativeBuckets, Sample

CONTENT_TYPE: Final = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)
_MEDIA_TYPE: Final = "application/vnd.google.protobuf"
_PROTO: Final = "io.prometheus.client.MetricFamily"

# MetricType
COUNTER: Final = 0
GAUGE: Final = 1
HISTOGRAM: Final = 4
_TYPES: Final = {"counter": COUNTER, "gauge": GAUGE, "histogram": HISTOGRAM}

# wire types
_VARINT: Final = 0
_I64: Final = 1
_LEN: Final = 2

MAX_SPAN_GAP: Final = 2  # empty buckets filled with zeros instead of opening a span
_DOUBLE: Final = struct.Struct("<d")


# --- the wire format ---------------------------------------------------------


def varint(n: int) -> bytes:
    """``n`` >= 0 as a base-128 varint (negative int32/int64 as their 64-bit two's
    complement, as protobuf writes them)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zigzag(n: int) -> int:
    """``sint32``/``sint64``'s mapping: 0, -1, 1, -2 ... -> 0, 1, 2, 3 ..."""
    return (n << 1) if n >= 0 else ((-n << 1) - 1)


def _tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def _uint(field: int, n: int) -> bytes:
    return _tag(field, _VARINT) + varint(n)


def _sint(field: int, n: int) -> bytes:
    return _tag(field, _VARINT) + varint(zigzag(n))


def _double(field: int, x: float) -> bytes:
    return _tag(field, _I64) + _DOUBLE.pack(x)


def _bytes(field: int, payload: bytes) -> bytes:
    return _tag(field, _LEN) + varint(len(payload)) + payload


def _string(field: int, s: str) -> bytes:
    return _bytes(field, s.encode())


def _timestamp(field: int, unix_s: float) -> bytes:
    """A ``google.protobuf.Timestamp`` (nanos in [0, 1e9))."""
    seconds = math.floor(unix_s)
    nanos = round((unix_s - seconds) * 1e9)
    if nanos == 1_000_000_000:
        seconds, nanos = seconds + 1, 0
    return _bytes(field, _uint(1, seconds) + _uint(2, nanos))


# --- the messages --------------------------------------------------------------


def spans_and_deltas(
    positive: Sequence[tuple[int, int]], max_gap: int = MAX_SPAN_GAP
) -> tuple[list[tuple[int, int]], list[int]]:
    """Populated buckets ``(index, count)`` (ascending index) -> ``(spans, deltas)``:
    spans ``(offset, length)``, the first offset the first index, each next one the gap
    after the previous span; deltas per bucket in the spans (filled gaps count 0)."""
    spans: list[tuple[int, int]] = []
    deltas: list[int] = []
    previous_index, previous_count = 0, 0
    for index, count in positive:
        if spans and index <= previous_index:
            raise ValueError(f"native bucket indices not ascending: {index} after {previous_index}")
        gap = index - previous_index - 1
        if spans and gap <= max_gap:
            offset, length = spans[-1]
            spans[-1] = (offset, length + gap + 1)
            for _ in range(gap):
                deltas.append(-previous_count)
                previous_count = 0
        else:
            spans.append((index if not spans else gap, 1))
        deltas.append(count - previous_count)
        previous_index, previous_count = index, count
    return spans, deltas


def _native(n: NativeBuckets) -> bytes:
    spans, deltas = spans_and_deltas(n.positive)
    parts = [_sint(5, n.schema), _double(6, n.zero_threshold_s), _uint(7, n.zero_count)]
    if not spans:  # a span of length 0 marks a native histogram with no positive buckets
        spans = [(0, 0)]
    parts += [_bytes(12, _sint(1, offset) + _uint(2, length)) for offset, length in spans]
    parts += [_sint(13, d) for d in deltas]
    return b"".join(parts)


def _histogram(h: HistogramSample) -> bytes:
    count = h.buckets[-1][1] if h.buckets else 0.0
    parts = [_uint(1, round(count)), _double(2, h.sum)]
    for le_s, cumulative in h.buckets:
        if not math.isinf(le_s):
            parts.append(_bytes(3, _uint(1, round(cumulative)) + _double(2, le_s)))
    if h.native is not None:
        parts.append(_native(h.native))
    if h.start_s is not None:
        parts.append(_timestamp(15, h.start_s))
    return b"".join(parts)


def _labels(labels: Iterable[tuple[str, str]]) -> bytes:
    return b"".join(_bytes(1, _string(1, k) + _string(2, v)) for k, v in labels)


def _metric(kind: str, sample: Sample | HistogramSample) -> bytes:
    if kind == "histogram":
        if not isinstance(sample, HistogramSample):
            raise TypeError(f"a histogram family holds {type(sample).__name__}")
        return _labels(sample.labels) + _bytes(7, _histogram(sample))
    if not isinstance(sample, Sample):
        raise TypeError(f"a {kind} family holds {type(sample).__name__}")
    if kind == "counter":
        value = _double(1, sample.value)
        if sample.start_s is not None:
            value += _timestamp(3, sample.start_s)
        return _labels(sample.labels) + _bytes(3, value)
    return _labels(sample.labels) + _bytes(2, _double(1, sample.value))


def encode_family(family: Family) -> bytes:
    """One ``MetricFamily`` message (not length-prefixed)."""
    name = family.name + "_total" if family.kind == "counter" else family.name
    parts = [_string(1, name), _string(2, family.help), _uint(3, _TYPES[family.kind])]
    parts += [_bytes(4, _metric(family.kind, s)) for s in family.samples]
    return b"".join(parts)


def encode(families: Iterable[Family]) -> bytes:
    """The delimited stream Prometheus reads: each family's length, then the family."""
    out = bytearray()
    for f in families:
        message = encode_family(f)
        out += varint(len(message))
        out += message
    return bytes(out)


# --- content negotiation -------------------------------------------------------


def _media_ranges(accept: str) -> Iterable[tuple[str, dict[str, str], float]]:
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        values = {}
        for p in params:
            key, _, value = p.partition("=")
            values[key.strip().lower()] = value.strip().strip('"')
        try:
            q = float(values.pop("q", "1"))
        except ValueError:
            q = 0.0
        if media:
            yield media.lower(), values, q


def wants_protobuf(accept: str) -> bool:
    """Whether ``accept`` (an HTTP ``Accept`` header) asks for the delimited protobuf
    format at least as much as for anything else (Prometheus' scrapes that take native
    histograms ask for it first; others, and ``curl``, get text)."""
    ranges = list(_media_ranges(accept))
    proto = [
        q
        for media, params, q in ranges
        if media == _MEDIA_TYPE
        and params.get("proto") == _PROTO
        and params.get("encoding") == "delimited"
    ]
    if not proto or max(proto) <= 0:
        return False
    others = [q for media, _, q in ranges if media != _MEDIA_TYPE]
    return max(proto) >= max(others, default=0.0)
