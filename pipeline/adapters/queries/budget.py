"""Reads of the SLO counts (``slo_windows``; rollups ``slo_1m``, ``slo_1h``) and of
``budget_events``."""

from __future__ import annotations

from typing import Any, Final

from pipeline.adapters.queries.filters import ReportFilter, params, slo_where, spans_sql
from pipeline.adapters.store import Store
from pipeline.core.cover import Cover

Row = tuple[Any, ...]
# The SLO rollups and their bucket width.
ROLLUP_MS: Final = {"slo_1m": 60_000, "slo_1h": 3_600_000}
# SQL: the compliance of a row of :func:`slo_counts_sql`: good / total, a blended tier's
# good on its secondary only counted at the tier's weight (pipeline.core.slo_windows).
COMPLIANCE_SQL: Final = (
    "if(kind = 'blended', good + secondary_weight * good_secondary_only, good) / nullIf(total, 0)"
)


def slo_counts_sql(source: str, where: str = "1", bucket: str = "window_start") -> str:
    """SQL: ``(time, slo, kind, objective, secondary_weight, total, good,
    good_secondary_only)`` per ``bucket`` (an expression of ``window_start``; a constant:
    the whole range), SLO and kind, over the rows of ``source`` (``slo_1m``, ``slo_1h``,
    or a union of them) that ``where`` keeps. The report and the dashboards read the SLO
    counts through it (tools/dev/dashboards.py)."""
    return (
        f"SELECT {bucket} AS time, slo, kind, any(objective) AS objective, "
        "any(secondary_weight) AS secondary_weight, sum(total) AS total, sum(good) AS good, "
        f"sum(good_secondary_only) AS good_secondary_only FROM {source} WHERE {where} "
        "GROUP BY time, slo, kind"
    )


def budget_events_sql(db: str, where: str) -> str:
    """SQL: every column of the budget events ``where`` keeps (report and dashboards)."""
    return f"SELECT * FROM {db}.budget_events FINAL WHERE {where}"


def newest_window_start_ms(store: Store) -> int | None:
    """Start of the newest stored SLO window (unix ms), None when there is none."""
    ref = store.query_rows(
        f"SELECT toUnixTimestamp64Milli(max(window_start)) FROM {store.database}.slo_windows"
    )
    if not ref or not ref[0][0]:
        return None
    return int(ref[0][0])


def last_window_end_ms(store: Store) -> int:
    """End of the last closed SLO window (unix ms), 0 when there is none."""
    ((last_end_ms,),) = store.query_rows(
        "SELECT max(toUnixTimestamp64Milli(window_start) + window_ms) "
        f"FROM {store.database}.slo_windows"
    )
    return int(last_end_ms or 0)


def base_windows(store: Store, from_unix_ms: int) -> list[Row]:
    """``(slo, start ms, window_ms, partition, total, good, objective)`` per base window
    and partition from ``from_unix_ms`` on, corrections summed in."""
    return store.query_rows(
        "SELECT slo, toUnixTimestamp64Milli(window_start) AS s, any(window_ms), partition, "
        f"sum(total), sum(good), any(objective) FROM {store.database}.slo_windows "
        "WHERE kind = 'slo' AND s >= {lo:Int64} GROUP BY slo, s, partition",
        {"lo": from_unix_ms},
    )


def rollup_windows(store: Store, table: str, from_unix_ms: int, until_unix_ms: int) -> list[Row]:
    """``(slo, start ms, total, good, objective)`` per bucket of a rollup (``slo_1m``,
    ``slo_1h``) in ``[from, until)``, ``until`` rounded down to a bucket edge."""
    size = ROLLUP_MS[table]
    return store.query_rows(
        "SELECT slo, toUnixTimestamp(window_start) * 1000 AS s, sum(total), sum(good), "
        f"any(objective) FROM {store.database}.{table} WHERE kind = 'slo' "
        "AND s >= {lo:Int64} AND s < {hi:Int64} GROUP BY slo, s",
        {"lo": from_unix_ms, "hi": until_unix_ms - until_unix_ms % size},
    )


# Each window part of a Cover and the SLO table that holds it.
_SLO_TIERS: Final = (("hours", "slo_1h"), ("minutes", "slo_1m"), ("windows", "slo_windows"))


def cover_counts(store: Store, cover: Cover) -> dict[str, tuple[int, int]]:
    """Per SLO (kind ``slo``), ``(total, good)`` of the requests that ended in the
    cover's window parts: the hourly rollup for its hours, the minute rollup for its
    minutes, the base windows for the rest (corrections summed in). Its ``rest`` is
    not read here."""
    parts = [
        f"SELECT slo, toInt64(sum(total)), toInt64(sum(good)) FROM {store.database}.{table} "
        f"WHERE kind = 'slo' AND {spans_sql('window_start', spans, 'ms')} GROUP BY slo"
        for attr, table in _SLO_TIERS
        if (spans := getattr(cover, attr))
    ]
    out: dict[str, tuple[int, int]] = {}
    if not parts:
        return out
    for slo, total, good in store.query_rows(" UNION ALL ".join(parts)):
        t, g = out.get(str(slo), (0, 0))
        out[str(slo)] = (t + int(total), g + int(good))
    return out


def minute_counts(store: Store, f: ReportFilter) -> list[Row]:
    """``(slo, kind, start s, objective, secondary_weight, total, good,
    good_secondary_only)`` per SLO, kind and minute of the filter."""
    counts = slo_counts_sql(f"{store.database}.slo_1m", slo_where(f))
    return store.query_rows(
        "SELECT slo, kind, toUnixTimestamp(time), objective, secondary_weight, total, good, "
        f"good_secondary_only FROM ({counts}) ORDER BY slo, kind, time",
        params(f),
    )


def folded_counts(store: Store, f: ReportFilter, recent_s: int) -> list[Row]:
    """:func:`minute_counts`' rows with every minute that started more than ``recent_s``
    before the filter's last minute folded into one row per SLO and kind (its ``start``:
    the earliest of them): what sums over the range and over its last ``recent_s`` need
    (issue 53: a month is 43,200 minutes per SLO read into Python, twice, otherwise)."""
    where = slo_where(f)
    minutes = slo_counts_sql(f"{store.database}.slo_1m", where)
    last = f"(SELECT max(window_start) FROM {store.database}.slo_1m WHERE {where})"
    return store.query_rows(
        "SELECT slo, kind, toUnixTimestamp(min(time)) AS t, any(objective), "
        "any(secondary_weight), sum(total), sum(good), sum(good_secondary_only) "
        f"FROM ({minutes}) GROUP BY slo, kind, "
        f"if(time >= {last} - {int(recent_s)}, time, toDateTime(0, 'UTC')) "
        "ORDER BY slo, kind, t",
        params(f),
    )


def minute_slo_series(store: Store, f: ReportFilter, *, hourly: bool = False) -> list[Row]:
    """``(start s, slo, objective, total, good)`` per minute (``hourly``: per hour, from
    ``slo_1h``) and SLO (kind ``slo``)."""
    table = "slo_1h" if hourly else "slo_1m"
    counts = slo_counts_sql(f"{store.database}.{table}", f"kind = 'slo' AND {slo_where(f)}")
    return store.query_rows(
        f"SELECT toUnixTimestamp(time), slo, objective, total, good FROM ({counts}) "
        "ORDER BY time, slo",
        params(f),
    )


def events_in(store: Store, f: ReportFilter, order: str = "event_time, slo") -> list[Row]:
    """``(event_time, slo, event)`` of the filter's budget events."""
    if order not in {"event_time", "event_time, slo"}:
        raise ValueError(f"budget events ordered by {order!r}")
    events = budget_events_sql(store.database, slo_where(f, "event_time"))
    return store.query_rows(
        f"SELECT event_time, slo, event FROM ({events}) ORDER BY {order}", params(f)
    )


def events_between(store: Store, from_unix_ms: int, until_unix_ms: int) -> list[Row]:
    """``(slo, event, event time ms)`` of every budget event in ``[from, until)``."""
    return store.query_rows(
        "SELECT slo, event, toUnixTimestamp64Milli(event_time) "
        f"FROM {store.database}.budget_events FINAL "
        "WHERE toUnixTimestamp64Milli(event_time) >= {a:Int64} "
        "AND toUnixTimestamp64Milli(event_time) < {b:Int64} ORDER BY event_time, slo, event",
        {"a": from_unix_ms, "b": until_unix_ms},
    )
