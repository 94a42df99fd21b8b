"""Rollups that cannot drift: each rollup compared with its source, and set right.

The materialized views of ``sql/0006_signed_windows.sql`` fill the rollups from the rows
written into their sources::

    window_sketches ─┬─> latency_1m, latency_1h            (sketch rows)
                     └─> slo_windows ─┬─> slo_1m, slo_1h   ('__slo__' rows)

An insert into ``window_sketches`` is not atomic across them: the base table can take
its rows and a view's insert fail after (a disk filling up, the process killed between
the two). Its retry carries the same deduplication token, and a view whose target
recorded the token without keeping its rows (or a worker that never retries: killed,
then resuming past the window) leaves the rollup short for good (the fault trial of
issue 37: ``latency_1m`` 5.2 % short of ``window_sketches``).

:func:`repair_rollups` compares every rollup with its source per bucket (minute or hour
and key, or window and SLO for ``slo_windows``) and, where they differ, inserts the
difference: one row per differing bucket whose counts, sums and sketch bins are the
source's minus the rollup's (min and max the source's). The rollups are sums (signed
counts since 0006), so the bucket then equals its source, and nothing is deleted: a
dashboard reads the short figure until the insert lands and the exact one after, never
a gap. Run again, it finds nothing to do. Sources before their rollups
(``slo_windows`` first: its inserts feed ``slo_1m`` and ``slo_1h`` through their views,
which are compared after).

It needs to be the store's only writer while it runs (a write of another process landing
between its read and its insert would be counted twice): the embedded store (one process
per directory) is. Workers sharing one ClickHouse server are not covered: a repair there
can race another worker's insert between its base table and its views.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pipeline.core.windows import ClosedWindow

from .protocol import Store
from .windows import SLO_ROW_BOUNDARY, write_windows

log = logging.getLogger(__name__)

# Relative difference of float sums taken as equal (the rollup adds the same values in
# another order).
_SUM_TOLERANCE = 1e-9
_KEY = "model, priority, ctx_bucket, boundary"
_SLO_WINDOW_KEY = (
    "window_start, window_ms, source_topic, partition, correction, slo, kind, boundary, "
    "threshold_ms, objective, secondary_weight"
)


@dataclass(frozen=True, slots=True)
class RepairResult:
    """Buckets found to differ from their source (and set right), per rollup table."""

    repaired: dict[str, int] = field(default_factory=dict)
    hours: int | None = None  # hours compared (None: all)

    @property
    def total(self) -> int:
        return sum(self.repaired.values())

    def describe(self) -> str:
        scope = "all hours" if self.hours is None else f"{self.hours} hours"
        if not self.total:
            return f"every rollup equals its source ({scope} compared)"
        parts = ", ".join(f"{t} {n}" for t, n in self.repaired.items() if n)
        return f"buckets repaired: {parts} ({scope} compared)"


def window_hours(starts_ms: Iterable[int]) -> set[int]:
    """The hours (unix seconds of their start) the windows starting at ``starts_ms`` fall in."""
    return {ms // 3_600_000 * 3600 for ms in starts_ms}


def _scope(column: str, hours: set[int] | None) -> str:
    """SQL: ``column`` in one of ``hours`` (None: true), as ranges of consecutive hours
    (the engine skips the monthly partitions and the granules outside them; a condition
    on a function of the column read every row: 4.6 s for one hour of a store of 2 M
    window rows)."""
    if hours is None:
        return "1"
    ranges: list[list[int]] = []
    for h in sorted(hours):
        if ranges and ranges[-1][1] == h:
            ranges[-1][1] = h + 3600
        else:
            ranges.append([h, h + 3600])
    return (
        "("
        + " OR ".join(
            f"({column} >= toDateTime({a}, 'UTC') AND {column} < toDateTime({b}, 'UTC'))"
            for a, b in ranges
        )
        + ")"
    )


def _differs(a: str, b: str) -> str:
    """SQL: float sums ``a`` and ``b`` differ by more than rounding."""
    return f"abs({a} - {b}) > {_SUM_TOLERANCE} * greatest(abs({a}), abs({b}), 1.0)"


def _latency_delta(db: str, table: str, bucket: str, hours: set[int] | None) -> str:
    """SELECT of the rows that make ``table`` (latency_1m/1h) equal window_sketches."""
    src = (
        f"SELECT toDateTime({bucket}(window_start), 'UTC') AS b, {_KEY}, 1 AS s_in, "
        "sum(records) AS records, sum(count) AS count, sum(sum) AS sum, min(min) AS min, "
        "max(max) AS max, sum(zero_count) AS zero_count, "
        "sumMap(pos_keys, pos_counts) AS pos, sumMap(neg_keys, neg_counts) AS neg "
        f"FROM {db}.window_sketches WHERE boundary != '{SLO_ROW_BOUNDARY}' "
        f"AND {_scope('window_start', hours)} GROUP BY b, {_KEY}"
    )
    dst = (
        f"SELECT toDateTime(window_start, 'UTC') AS b, {_KEY}, 1 AS d_in, "
        "sum(records) AS records, sum(count) AS count, sum(sum) AS sum, "
        "sum(zero_count) AS zero_count, sumMapMerge(pos) AS pos, sumMapMerge(neg) AS neg "
        f"FROM {db}.{table} WHERE {_scope('window_start', hours)} GROUP BY b, {_KEY}"
    )
    neg = "arrayMap(x -> -x, {}.2)"
    return (
        f"SELECT b AS window_start, {_KEY}, "
        "s.records - d.records AS records, s.count - d.count AS count, "
        "s.sum - d.sum AS sum, if(s.s_in = 1, s.min, inf) AS min, "
        "if(s.s_in = 1, s.max, -inf) AS max, s.zero_count - d.zero_count AS zero_count, "
        "initializeAggregation('sumMapState', arrayConcat(s.pos.1, d.pos.1), "
        f"arrayConcat(s.pos.2, {neg.format('d.pos')})) AS pos, "
        "initializeAggregation('sumMapState', arrayConcat(s.neg.1, d.neg.1), "
        f"arrayConcat(s.neg.2, {neg.format('d.neg')})) AS neg "
        f"FROM ({src}) AS s FULL OUTER JOIN ({dst}) AS d USING (b, {_KEY}) "
        "WHERE s.records != d.records OR s.count != d.count OR s.zero_count != d.zero_count "
        f"OR s.pos != d.pos OR s.neg != d.neg OR {_differs('s.sum', 'd.sum')}"
    )


_LATENCY_COLUMNS = (
    "window_start, model, priority, ctx_bucket, boundary, records, count, sum, min, max, "
    "zero_count, pos, neg"
)


def _slo_windows_delta(db: str, hours: set[int] | None) -> str:
    """SELECT of the rows that make slo_windows equal the '__slo__' rows of window_sketches
    (the view's own SELECT, summed per window and SLO)."""
    spread = (
        "SELECT w.window_start AS window_start, w.window_ms AS window_ms, "
        "w.source_topic AS source_topic, w.partition AS partition, "
        "w.correction AS correction, slo_name AS slo, v.kind AS kind, "
        "v.boundary AS boundary, v.threshold_ms AS threshold_ms, v.objective AS objective, "
        "v.total AS total, v.good AS good, v.good_secondary_only AS good_secondary_only, "
        "v.secondary_weight AS secondary_weight "
        f"FROM {db}.window_sketches AS w "
        "ARRAY JOIN mapKeys(w.slo_counts) AS slo_name, mapValues(w.slo_counts) AS v "
        f"WHERE w.boundary = '{SLO_ROW_BOUNDARY}' AND {_scope('w.window_start', hours)}"
    )
    sums = "sum(total) AS total, sum(good) AS good, sum(good_secondary_only) AS gso"
    src = f"SELECT {_SLO_WINDOW_KEY}, 1 AS s_in, {sums} FROM ({spread}) GROUP BY {_SLO_WINDOW_KEY}"
    dst = (
        f"SELECT {_SLO_WINDOW_KEY}, 1 AS d_in, {sums} FROM {db}.slo_windows "
        f"WHERE {_scope('window_start', hours)} GROUP BY {_SLO_WINDOW_KEY}"
    )
    return (
        f"SELECT {_SLO_WINDOW_KEY}, s.total - d.total AS total, s.good - d.good AS good, "
        "s.gso - d.gso AS good_secondary_only "
        f"FROM ({src}) AS s FULL OUTER JOIN ({dst}) AS d USING ({_SLO_WINDOW_KEY}) "
        "WHERE s.total != d.total OR s.good != d.good OR s.gso != d.gso"
    )


_SLO_WINDOW_COLUMNS = f"{_SLO_WINDOW_KEY}, total, good, good_secondary_only"


def _slo_delta(db: str, table: str, bucket: str, hours: set[int] | None) -> str:
    """SELECT of the rows that make ``table`` (slo_1m/1h) equal slo_windows."""
    sums = "sum(total) AS total, sum(good) AS good, sum(good_secondary_only) AS gso"
    src = (
        f"SELECT toDateTime({bucket}(window_start), 'UTC') AS b, slo, kind, 1 AS s_in, "
        f"any(objective) AS objective, any(secondary_weight) AS secondary_weight, {sums} "
        f"FROM {db}.slo_windows WHERE {_scope('window_start', hours)} GROUP BY b, slo, kind"
    )
    dst = (
        f"SELECT toDateTime(window_start, 'UTC') AS b, slo, kind, 1 AS d_in, {sums} "
        f"FROM {db}.{table} WHERE {_scope('window_start', hours)} GROUP BY b, slo, kind"
    )
    return (
        "SELECT b AS window_start, slo, kind, s.objective AS objective, "
        "s.secondary_weight AS secondary_weight, s.total - d.total AS total, "
        "s.good - d.good AS good, s.gso - d.gso AS good_secondary_only "
        f"FROM ({src}) AS s FULL OUTER JOIN ({dst}) AS d USING (b, slo, kind) "
        "WHERE s.total != d.total OR s.good != d.good OR s.gso != d.gso"
    )


_SLO_COLUMNS = (
    "window_start, slo, kind, objective, secondary_weight, total, good, good_secondary_only"
)


def _steps(db: str, hours: set[int] | None) -> list[tuple[str, str, str]]:
    """(table, its columns, the SELECT of its missing difference), sources first."""
    minute, hour = "toStartOfMinute", "toStartOfHour"
    return [
        ("slo_windows", _SLO_WINDOW_COLUMNS, _slo_windows_delta(db, hours)),
        ("latency_1m", _LATENCY_COLUMNS, _latency_delta(db, "latency_1m", minute, hours)),
        ("latency_1h", _LATENCY_COLUMNS, _latency_delta(db, "latency_1h", hour, hours)),
        ("slo_1m", _SLO_COLUMNS, _slo_delta(db, "slo_1m", minute, hours)),
        ("slo_1h", _SLO_COLUMNS, _slo_delta(db, "slo_1h", hour, hours)),
    ]


# A repair's insert is never taken for a repeat of an earlier one (the same difference can
# be missing twice), and nothing in it is merged away at insert.
_INSERT_SETTINGS = "SETTINGS insert_deduplicate = 0, join_use_nulls = 0"


def repair_rollups(store: Store, hours: set[int] | None = None) -> RepairResult:
    """Compare every rollup with its source in ``hours`` (unix seconds of hour starts;
    None: everything) and insert the difference where they differ. Idempotent: a second
    run finds every bucket equal. Raises what the store raises (the caller retries: a
    rerun recomputes every difference)."""
    if hours is not None and not hours:
        return RepairResult({}, 0)
    db = store.database
    repaired: dict[str, int] = {}
    for table, columns, delta in _steps(db, hours):
        count = f"SELECT count() FROM ({delta}) SETTINGS join_use_nulls = 0"
        n = int(store.query_rows(count)[0][0])
        repaired[table] = n
        if n:
            store.command(f"INSERT INTO {db}.{table} ({columns}) {delta} {_INSERT_SETTINGS}")
    return RepairResult(repaired, None if hours is None else len(hours))


def recent_hours(store: Store, lookback_hours: int) -> set[int]:
    """The hours of the windows written in the ``lookback_hours`` before the store's last
    window write (a worker killed in the middle of a write wrote it last)."""
    db = store.database
    rows = store.query_rows(
        f"SELECT DISTINCT toUnixTimestamp(toStartOfHour(window_start)) FROM {db}.window_sketches "
        f"WHERE written_at >= (SELECT max(written_at) FROM {db}.window_sketches) "
        f"- INTERVAL {int(lookback_hours)} HOUR"
    )
    return {int(r[0]) for r in rows}


def hour_label(hour_s: int) -> str:
    return datetime.fromtimestamp(hour_s, tz=UTC).strftime("%Y-%m-%dT%H")


# Start-up: the hours of the windows written in this span before the store's last window
# write are compared (a write cut short by a kill is among the last).
STARTUP_LOOKBACK_HOURS = 24


def check_rollups(store: Store, *, lookback_hours: int = STARTUP_LOOKBACK_HOURS) -> RepairResult:
    """At start-up (worker, replay): :func:`repair_rollups` over the hours of the windows
    written last (see :func:`recent_hours`), logged."""
    hours = recent_hours(store, lookback_hours)
    result = repair_rollups(store, hours)
    if result.total:
        log.warning("rollups checked at start-up: %s", result.describe())
    else:
        log.info("rollups checked at start-up: %s", result.describe())
    return result


def write_windows_repairing(
    store: Store,
    windows: Sequence[ClosedWindow],
    topic: str,
    relative_accuracy: float,
    token: str,
    *,
    through_offsets: dict[int, int],
    retry: Callable[[Callable[[], None], str], int],
) -> int:
    """:func:`~pipeline.adapters.store.write_windows` under ``retry`` (the caller's
    policy); when an attempt failed (it may have landed in ``window_sketches`` and not in
    every view), the rollups of the windows' hours are compared with their sources once
    the write succeeded, and set right (logged). Returns the retries of both."""
    failures: list[str] = []

    def attempt() -> None:
        try:
            write_windows(
                store, windows, topic, relative_accuracy, token, through_offsets=through_offsets
            )
        except Exception as exc:
            failures.append(str(exc).split("\n", 1)[0])
            raise

    retries = retry(attempt, f"write of {len(windows)} windows")
    if not failures:
        return retries
    hours = window_hours(w.start_ms for w in windows)
    results: list[RepairResult] = []
    retries += retry(lambda: results.append(repair_rollups(store, hours)), "repair of rollups")
    result = results[-1]
    log.warning(
        "write of %d windows failed %d times before it landed (%s); rollups of %s: %s",
        len(windows),
        len(failures),
        failures[0][:200],
        ", ".join(hour_label(h) for h in sorted(hours)),
        result.describe(),
    )
    return retries
