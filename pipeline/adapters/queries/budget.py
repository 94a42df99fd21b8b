"""Reads of the SLO counts (``slo_windows``; rollups ``slo_1m``, ``slo_1h``) and of
``budget_events``."""

from __future__ import annotations

from typing import Any, Final

from pipeline.adapters.queries.filters import ReportFilter, params, slo_where
from pipeline.adapters.store import Store

Row = tuple[Any, ...]
# The SLO rollups and their bucket width.
ROLLUP_MS: Final = {"slo_1m": 60_000, "slo_1h": 3_600_000}


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


def minute_counts(store: Store, f: ReportFilter) -> list[Row]:
    """``(slo, kind, start s, objective, secondary_weight, total, good,
    good_secondary_only)`` per SLO, kind and minute of the filter."""
    return store.query_rows(
        "SELECT slo, kind, toUnixTimestamp(window_start), any(objective), "
        "any(secondary_weight), sum(total), sum(good), sum(good_secondary_only) "
        f"FROM {store.database}.slo_1m WHERE {slo_where(f)} GROUP BY slo, kind, window_start "
        "ORDER BY slo, kind, window_start",
        params(f),
    )


def minute_slo_series(store: Store, f: ReportFilter) -> list[Row]:
    """``(start s, slo, objective, total, good)`` per minute and SLO (kind ``slo``)."""
    return store.query_rows(
        "SELECT toUnixTimestamp(window_start), slo, any(objective), sum(total), sum(good) "
        f"FROM {store.database}.slo_1m WHERE kind = 'slo' AND {slo_where(f)} "
        "GROUP BY window_start, slo ORDER BY window_start, slo",
        params(f),
    )


def events_in(store: Store, f: ReportFilter, order: str = "event_time, slo") -> list[Row]:
    """``(event_time, slo, event)`` of the filter's budget events."""
    if order not in {"event_time", "event_time, slo"}:
        raise ValueError(f"budget events ordered by {order!r}")
    return store.query_rows(
        f"SELECT event_time, slo, event FROM {store.database}.budget_events FINAL "
        f"WHERE {slo_where(f, 'event_time')} ORDER BY {order}",
        params(f),
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
