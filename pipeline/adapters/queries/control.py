"""Reads of ``control_signals`` (every directive and heartbeat, signed or replayed)."""

from __future__ import annotations

from typing import Any, Final

from pipeline.adapters.queries.filters import ReportFilter, scope_models, time_where
from pipeline.adapters.store import Store

Row = tuple[Any, ...]


def _where(f: ReportFilter) -> tuple[str, dict[str, Any]]:
    """The filter's time range; with a model or SLOs that select models, the directives
    of those models' scopes, ``*`` and ``fleet``."""
    where = time_where("event_time", f)
    models = scope_models(f)
    if models is None:
        return where, {}
    return where + " AND scope IN {scopes:Array(String)}", {"scopes": [*models, "*", "fleet"]}


def directives(store: Store, f: ReportFilter) -> list[Row]:
    """``(scope, seq, level, phase, event_time, reason)`` of the filter's directives
    (heartbeats left out), by event time."""
    return _directives(
        store, f, "scope, seq, level, phase, event_time, reason", "event_time, scope, seq"
    )


def directive_timeline(store: Store, f: ReportFilter) -> list[Row]:
    """``(scope, event_time, level, phase, reason)`` of the filter's directives (heartbeats
    left out), by event time and sequence."""
    return _directives(store, f, "scope, event_time, level, phase, reason", "event_time, seq")


def directives_sql(db: str, where: str) -> str:
    """SQL: every column of the directives (heartbeats left out) ``where`` keeps (report
    and dashboards)."""
    return f"SELECT * FROM {db}.control_signals FINAL WHERE NOT heartbeat AND {where}"


def _directives(store: Store, f: ReportFilter, columns: str, order: str) -> list[Row]:
    where, bound = _where(f)
    return store.query_rows(
        f"SELECT {columns} FROM ({directives_sql(store.database, where)}) ORDER BY {order}",
        bound,
    )


# Every signal before {b} (unix ms, event time): (scope, event time ms, seq, level).
_LEVELS_BEFORE: Final = (
    "SELECT scope, toUnixTimestamp64Milli(event_time), seq, level "
    "FROM {db}.control_signals FINAL "
    "WHERE toUnixTimestamp64Milli(event_time) < {{b:Int64}} ORDER BY scope, event_time, seq"
)
# The latest signals of scope {s} up to {t} (unix ms, event time), newest first:
# (scope, seq, level, phase, event time ms, reason).
_LATEST_OF_SCOPE: Final = (
    "SELECT scope, seq, level, phase, toUnixTimestamp64Milli(event_time), reason "
    "FROM {db}.control_signals FINAL "
    "WHERE scope = {{s:String}} AND toUnixTimestamp64Milli(event_time) <= {{t:Int64}} "
    "ORDER BY event_time DESC, seq DESC LIMIT {limit:d}"
)


def levels_before(store: Store, until_unix_ms: int) -> list[Row]:
    """``(scope, event time ms, seq, level)`` of every signal before ``until_unix_ms``."""
    return store.query_rows(_LEVELS_BEFORE.format(db=store.database), {"b": until_unix_ms})


def latest_of_scope(store: Store, scope: str, until_unix_ms: int, limit: int = 5) -> list[Row]:
    """``(scope, seq, level, phase, event time ms, reason)`` of the latest signals of
    ``scope`` up to ``until_unix_ms`` (event time), newest first."""
    sql = _LATEST_OF_SCOPE.format(db=store.database, limit=limit)
    return store.query_rows(sql, {"s": scope, "t": until_unix_ms})
