"""What a report counts of a window's requests besides latency and SLOs (issue 53).

``tailguard report`` shows, over a range, the requests per source and per outcome, the
control modes and verdicts per model and priority, and per gateway -> engine host pair
the joined requests and the engine clock's offset (``pipeline.core.skew``). Counted per
window by the window itself (:class:`~pipeline.core.windows.WindowAggregator` adds each
record here when it adds it to its sketches and SLO counts: one window assignment, by
the request's end), they are stored with the window and rolled up per hour, so that a
report over 30 days reads a few thousand rows, not 50 M requests.

* :attr:`RequestCounts.counts`: per :data:`CountKey` (source, outcome, model, priority,
  control mode, control verdict) the requests, signed: a record taken back (a partial
  replaced by its upgrade) subtracts, so a window's rows and its corrections add up to
  the exact count over the stored requests.
* :attr:`RequestCounts.skew`: per :data:`SkewKey` (model, gateway host, engine host) the
  offsets of the joined requests (:func:`pipeline.core.skew.offset_ms`) as counts of
  0.1 ms buckets (:func:`pipeline.core.skew.offset_bucket`), signed like the counts:
  merged over windows, their median is the exact median's to 0.05 ms.

The SLOs' measured bad requests (the load-cause split) are counted beside the SLO
counts, by :class:`pipeline.core.slo_windows.WindowSLOCounts`. Pure: plain values in,
counts out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from pipeline.core.record import RequestRecord
from pipeline.core.skew import offset_bucket, offset_ms
from pipeline.core.slo import IntArray, RecordColumns

# (source, outcome, model, priority, control_mode, control_verdict): a record's values
CountKey = tuple[str, str, str, int | None, str | None, str | None]
# (model, gateway_host, engine_host); a missing host is "" (as ``requests`` stores it)
SkewKey = tuple[str, str, str]
_COUNT_FIELDS: Final = ("source", "outcome", "model", "priority", "control_mode", "control_verdict")


def count_key(rec: RequestRecord) -> CountKey:
    return (rec.source, rec.outcome, rec.model, rec.priority, rec.control_mode,
            rec.control_verdict)  # fmt: skip


def skew_key(rec: RequestRecord) -> SkewKey:
    return (rec.model, rec.gateway_host or "", rec.engine_host or "")


@dataclass(frozen=True, slots=True)
class RequestCountRow:
    """The requests of one :data:`CountKey` in a window (signed in a correction)."""

    source: str
    outcome: str
    model: str
    priority: int | None
    control_mode: str | None
    control_verdict: str | None
    requests: int


@dataclass(frozen=True, slots=True)
class ClockSkewRow:
    """The offsets of one :data:`SkewKey`'s joined requests in a window: how many in each
    0.1 ms bucket (``offset_buckets`` ascending, ``counts`` signed in a correction)."""

    model: str
    gateway_host: str
    engine_host: str
    offset_buckets: list[int]
    counts: list[int]


class RequestCounts:
    """Per-window accumulator: :attr:`counts` and :attr:`skew` (module docstring).
    :meth:`add_batch` gives the counts of one :meth:`add` per record, in order."""

    __slots__ = ("counts", "skew")

    def __init__(self) -> None:
        self.counts: dict[CountKey, int] = {}
        self.skew: dict[SkewKey, dict[int, int]] = {}

    def add(self, rec: RequestRecord, sign: int = 1) -> None:
        """Count one record (``sign`` -1: take back one counted before)."""
        key = count_key(rec)
        self.counts[key] = self.counts.get(key, 0) + sign
        offset = offset_ms(rec)
        if offset is not None:
            self._bump(skew_key(rec), offset_bucket(offset), sign)

    def _bump(self, pair: SkewKey, bucket: int, sign: int) -> None:
        buckets = self.skew.get(pair)
        if buckets is None:
            buckets = self.skew[pair] = {}
        buckets[bucket] = buckets.get(bucket, 0) + sign

    def add_batch(self, cols: RecordColumns, rows: IntArray, signs: IntArray) -> None:
        """:meth:`add` of the records ``rows`` (indexes into ``cols``, in record order)
        with their ``signs``. The keys and offsets of a batch are computed once, shared by
        its windows."""
        keys: list[CountKey] = cols.memo(
            "count_key", lambda: list(zip(*(cols.column(n) for n in _COUNT_FIELDS), strict=True))
        )
        skewed: list[tuple[SkewKey, int] | None] = cols.memo("skew_bucket", lambda: [
            None if (o := offset_ms(r)) is None else (skew_key(r), offset_bucket(o))
            for r in cols.records
        ])  # fmt: skip
        rows_l: list[int] = rows.tolist()
        if bool((signs > 0).all()):  # the common case: counted in C
            added = Counter(map(keys.__getitem__, rows_l))
            offsets = Counter(filter(None, map(skewed.__getitem__, rows_l)))
            signed: Iterable[tuple[Any, int]] = ()
        else:
            added, offsets = Counter(), Counter()
            signed = zip(rows_l, signs.tolist(), strict=True)
        counts = self.counts
        for k, n in added.items():
            counts[k] = counts.get(k, 0) + n
        for (pair, bucket), n in offsets.items():
            self._bump(pair, bucket, n)
        for i, sign in signed:
            k = keys[i]
            counts[k] = counts.get(k, 0) + sign
            hit = skewed[i]
            if hit is not None:
                self._bump(hit[0], hit[1], sign)

    def count_rows(self) -> list[RequestCountRow]:
        """The non-zero counts, in key order (``None`` before values)."""
        return [
            RequestCountRow(*k, n)
            for k, n in sorted(self.counts.items(), key=lambda kv: _order(kv[0]))
            if n
        ]

    def skew_rows(self) -> list[ClockSkewRow]:
        """The host pairs' non-zero buckets (additions and take-backs that cancelled out
        leave nothing to store), in key order."""
        out = []
        for key, buckets in sorted(self.skew.items()):
            kept = sorted(b for b, n in buckets.items() if n)
            if kept:
                out.append(ClockSkewRow(*key, kept, [buckets[b] for b in kept]))
        return out


def _order(key: CountKey) -> tuple[tuple[bool, object], ...]:
    return tuple((v is not None, "" if v is None else v) for v in key)
