"""Rollups that cannot drift: each rollup compared with its source, and set right.

The materialized views of ``sql/0006_signed_windows.sql`` fill the rollups from the rows
written into their sources::

    window_sketches ─┬─> latency_1m, latency_1h            (sketch rows)
                     ├─> slo_windows ─┬─> slo_1m, slo_1h   ('__slo__' rows)
                     └─> request_counts_1h, slo_bad_1h, clock_skew_1h  ('__slo__' rows)

An insert into ``window_sketches`` is not atomic across them: the base table can take
its rows and a view's insert fail after (a disk filling up, the process killed between
the two). Its retry carries the same deduplication token, and a view whose target
recorded the token without keeping its rows (or a worker that never retries: killed,
then resuming past the window) leaves the rollup short for good (the fault trial of
issue 37: ``latency_1m`` 5.2 % short of ``window_sketches``).

:func:`repair_rollups` compares every rollup with its source per bucket (minute or hour
and key, or window and SLO for ``slo_windows``) and, where they differ, inserts the
difference. What a rollup should hold is its view's own SELECT, as the migrations define
it (:func:`view_selects`), run again over the source's rows of the hours compared: the
aggregation is written once, in ``sql/``; this module only says how each rollup's rows
combine (:data:`ROLLUPS`: its engine's merge functions). The difference is one row per
differing bucket whose counts, sums and sketch bins are the source's minus the rollup's
(min and max the source's). The rollups are sums (signed counts since 0006), so the
bucket then equals its source, and nothing is deleted: a
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
import re
import string
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from pipeline.core.windows import ClosedWindow
from pipeline.shipped import SQL_DIR

from .migrations import load_migrations
from .protocol import Store, StoreError
from .windows import write_windows

log = logging.getLogger(__name__)

# Relative difference of float sums taken as equal (the rollup adds the same values in
# another order).
_SUM_TOLERANCE = 1e-9


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


# How the rows of each rollup combine into one bucket's figure (its engine merges them
# so: a SimpleAggregateFunction's function, sumMap for the sketch bins: of aggregate
# states, SUM_MAP, or of plain (keys, counts) arrays, BINS: latency_1h since 0019,
# latency_1m since 0023). What a rollup holds is its materialized view's SELECT, read
# from the migrations (:func:`view_selects`): the repair reruns it over the source and
# compares, never restating the aggregation.
SUM, FLOAT_SUM, MIN, MAX, ANY = "sum", "float sum", "min", "max", "any"
SUM_MAP, BINS = "sumMap", "sumMap of arrays"


@dataclass(frozen=True, slots=True)
class Rollup:
    """A table a materialized view fills: its bucket (``bucket``, an expression of its
    ``window_start``, and the ``key`` columns) and how its ``values`` combine."""

    table: str
    bucket: str
    key: tuple[str, ...]
    values: tuple[tuple[str, str], ...]  # (column, SUM | FLOAT_SUM | ... | SUM_MAP | BINS)

    @property
    def columns(self) -> str:
        return ", ".join(("window_start", *self.key, *(c for c, _ in self.values)))


# the latency rollups (their sketch bins plain arrays: sql/0019, sql/0023)
_LATENCY = (
    ("records", SUM), ("count", SUM), ("sum", FLOAT_SUM), ("min", MIN), ("max", MAX),
    ("zero_count", SUM), ("pos", BINS), ("neg", BINS),
)  # fmt: skip
_LATENCY_KEY = ("model", "priority", "ctx_bucket", "boundary")
_SLO = (
    ("objective", ANY), ("secondary_weight", ANY), ("total", SUM), ("good", SUM),
    ("good_secondary_only", SUM),
)  # fmt: skip
_MINUTE = "toDateTime(window_start, 'UTC')"  # the rollups' DateTime buckets
# Sources before their rollups: slo_windows' inserts feed slo_1m and slo_1h through
# their views, which are compared after.
ROLLUPS = (
    Rollup(
        "slo_windows",
        "window_start",
        (
            "window_ms",
            "source_topic",
            "partition",
            "correction",
            "slo",
            "kind",
            "boundary",
            "threshold_ms",
            "objective",
            "secondary_weight",
        ),
        (("total", SUM), ("good", SUM), ("good_secondary_only", SUM)),
    ),
    Rollup("latency_1m", _MINUTE, _LATENCY_KEY, _LATENCY),
    Rollup("latency_1h", _MINUTE, _LATENCY_KEY, _LATENCY),
    Rollup("slo_1m", _MINUTE, ("slo", "kind"), _SLO),
    Rollup("slo_1h", _MINUTE, ("slo", "kind"), _SLO),
    # the report's counts (sql/0018), from the '__slo__' rows
    Rollup(
        "request_counts_1h",
        _MINUTE,
        ("model", "source", "outcome", "priority", "control_mode", "control_verdict"),
        (("requests", SUM),),
    ),
    Rollup(
        "slo_bad_1h",
        _MINUTE,
        ("slo", "model"),
        (("bad_measured", SUM), ("bad_queue_ms", FLOAT_SUM), ("bad_ms", FLOAT_SUM)),
    ),
    Rollup(
        "clock_skew_1h",
        _MINUTE,
        ("model", "gateway_host", "engine_host"),
        (("joined", SUM), ("offsets", SUM_MAP)),
    ),
)

_VIEW_RE = re.compile(
    r"CREATE MATERIALIZED VIEW (?:IF NOT EXISTS )?\$\{db\}\.\w+ \$\{on_cluster\} "
    r"TO \$\{db\}\.(?P<target>\w+) AS\s+(?P<select>SELECT\b[^;]*)",
)
_SOURCE_RE = re.compile(r"\bFROM \$\{db\}\.(\w+)")


@dataclass(frozen=True, slots=True)
class ViewSelect:
    """A materialized view's SELECT as the migrations define it (``${db}`` templated)."""

    source: str  # the table it reads
    select: str

    def over(self, db: str, hours: set[int] | None) -> str:
        """The SELECT on ``db``, reading only the source's rows in ``hours``."""
        text = string.Template(self.select).substitute(db=db)
        table = f"{db}.{self.source}"
        scoped = f"(SELECT * FROM {table} WHERE {_scope('window_start', hours)})"
        return re.sub(rf"\b{re.escape(table)}\b", scoped, text)


@cache
def view_selects(sql_dir: Path = SQL_DIR) -> dict[str, ViewSelect]:
    """Target table -> the SELECT of the view that fills it, as the last migration that
    (re)defined the view wrote it: the view the store runs (migrations apply in order)."""
    found: dict[str, ViewSelect] = {}
    for mig in load_migrations(sql_dir):
        text = "\n".join(
            line for line in mig.sql.splitlines() if not line.lstrip().startswith("--")
        )
        for m in _VIEW_RE.finditer(text):
            sources = set(_SOURCE_RE.findall(m["select"]))
            if len(sources) != 1:
                raise StoreError(f"{mig.name}: view of {m['target']} reads {sorted(sources)}")
            found[m["target"]] = ViewSelect(sources.pop(), " ".join(m["select"].split()))
    return found


def _read(kind: str, column: str) -> str:
    """SQL: the rows' ``column`` combined as the rollup's engine combines them."""
    fn = {SUM: "sum", FLOAT_SUM: "sum", MIN: "min", MAX: "max", ANY: "any", BINS: "sumMap"}
    return f"{fn.get(kind, 'sumMapMerge')}({column}) AS {column}"


def _delta(kind: str, c: str) -> str:
    """SQL: the value of the row that brings the rollup's ``c`` (d) to its source's (s)."""
    if kind in {SUM, FLOAT_SUM}:
        return f"s.{c} - d.{c} AS {c}"
    if kind in {MIN, MAX}:  # the source's (a bucket only the rollup has: neutral)
        return f"if(s.s_in = 1, s.{c}, {'inf' if kind == MIN else '-inf'}) AS {c}"
    if kind == ANY:
        return f"s.{c} AS {c}"
    if kind == BINS:  # the source's bins, and the rollup's negated (summed as it merges)
        return (
            f"(arrayConcat(s.{c}.1, d.{c}.1), arrayConcat(s.{c}.2, arrayMap(x -> -x, d.{c}.2))) "
            f"AS {c}"
        )
    return (  # sketch bins: the source's, and the rollup's negated
        f"initializeAggregation('sumMapState', arrayConcat(s.{c}.1, d.{c}.1), "
        f"arrayConcat(s.{c}.2, arrayMap(x -> -x, d.{c}.2))) AS {c}"
    )


def _differ(kind: str, c: str) -> str | None:
    """SQL: the source's and the rollup's ``c`` differ (None: not compared)."""
    if kind == FLOAT_SUM:
        return _differs(f"s.{c}", f"d.{c}")
    return f"s.{c} != d.{c}" if kind in {SUM, SUM_MAP, BINS} else None


def _rollup_delta(rollup: Rollup, view: ViewSelect, db: str, hours: set[int] | None) -> str:
    """SELECT of the rows that make ``rollup`` equal its view's SELECT over its source:
    both read the same way, per bucket, and subtracted where they differ."""
    key = ", ".join(rollup.key)
    values = ", ".join(_read(kind, c) for c, kind in rollup.values)

    def side(flag: str, rows: str) -> str:
        return (
            f"SELECT {rollup.bucket} AS b, {key}, 1 AS {flag}, {values} "
            f"FROM {rows} GROUP BY b, {key}"
        )

    src = side("s_in", f"({view.over(db, hours)})")
    dst = side("d_in", f"{db}.{rollup.table} WHERE {_scope('window_start', hours)}")
    deltas = ", ".join(_delta(kind, c) for c, kind in rollup.values)
    differ = " OR ".join(d for c, kind in rollup.values if (d := _differ(kind, c)))
    return (
        f"SELECT b AS window_start, {key}, {deltas} "
        f"FROM ({src}) AS s FULL OUTER JOIN ({dst}) AS d USING (b, {key}) WHERE {differ}"
    )


def _steps(db: str, hours: set[int] | None) -> list[tuple[str, str, str]]:
    """(table, its columns, the SELECT of its missing difference), sources first."""
    views = view_selects()
    return [(r.table, r.columns, _rollup_delta(r, views[r.table], db, hours)) for r in ROLLUPS]


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
