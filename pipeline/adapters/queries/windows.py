"""Reads of the latency sketches: ``window_sketches`` (per window, key and boundary, with
the ledger of the requests each window counted) and the rollup ``latency_1m``."""

from __future__ import annotations

from typing import Any, Final

from pipeline.adapters.queries.filters import ReportFilter, params, spans_sql, time_where
from pipeline.adapters.sketch_sql import quantile_from_merged_sql
from pipeline.adapters.store import SLO_ROW_BOUNDARY, Store
from pipeline.contract.sketch import SketchColumns
from pipeline.core.cover import Cover
from pipeline.core.ledger import ENDED_THROUGH, pack
from pipeline.core.sketch import QuantileSketch

Row = tuple[Any, ...]


# How the rows of a latency rollup merge their sketch bins: plain ``(keys, counts)``
# arrays, merged by ``sumMap`` (latency_1h since sql/0019, latency_1m since sql/0023; as
# aggregate states, ``sumMapMerge``, the engine deserialised every state it read: 3x
# slower on the rows wanted, and every state of every granule read).
BINS_MERGE: Final = "sumMap"


def latency_sql(
    source: str,
    where: str,
    boundaries: tuple[str, ...],
    *,
    bucket: str = "window_start",
    quantiles: tuple[float, ...] = (0.99,),
    merge: str = BINS_MERGE,
) -> str:
    """SQL: ``(time, boundary, p<q> for each of quantiles, sum_ms, n)`` per ``bucket`` (an
    expression of ``window_start``) and boundary, over the rows of ``source``
    (``latency_1m``, ``latency_1h`` or a union of them) that ``where`` keeps, their keys'
    sketches merged (``merge``: :data:`BINS_MERGE`): the quantiles of the merged sketch,
    and the sum and count of the values. The report and the dashboards read the latency
    rollups through it (tools/dev/dashboards.py)."""
    pos, neg = f"{merge}(pos)", f"{merge}(neg)"
    qs = "".join(
        f"{quantile_from_merged_sql(q, pos, neg, 'sum(zero_count)')} AS p{round(q * 100)}, "
        for q in quantiles
    )
    bset = ", ".join(f"'{b}'" for b in boundaries)
    return (
        f"SELECT {bucket} AS time, boundary, {qs}sum(sum) AS sum_ms, sum(count) AS n "
        f"FROM {source} WHERE boundary IN ({bset}) AND {where} GROUP BY time, boundary"
    )


def minute_p99_and_means(
    store: Store,
    f: ReportFilter,
    boundaries: tuple[str, ...],
    *,
    means_only: tuple[str, ...] = (),
    hourly: bool = False,
) -> list[Row]:
    """``(start s, boundary, p99, sum, count)`` per minute (``hourly``: per hour, from
    the hourly rollup) and boundary of the filter's model (all traffic without one),
    priorities and context buckets folded: all traffic is the one key ``('*', '*', '*')``,
    a model its keys ``(model, priority, ctx_bucket)``, merged. ``means_only``: more
    boundaries, their p99 None (their sketches are not merged: most of the read)."""
    model = "{model:String}" if f.model is not None else "'*'"
    where = f"model = {model} AND " + time_where("window_start", f)
    table = f"{store.database}.{'latency_1h' if hourly else 'latency_1m'}"
    minutes = latency_sql(table, where, boundaries)
    if means_only:
        bset = ", ".join(f"'{b}'" for b in means_only)
        minutes += (
            " UNION ALL SELECT window_start AS time, boundary, NULL AS p99, sum(sum) AS sum_ms, "
            f"sum(count) AS n FROM {table} WHERE boundary IN ({bset}) AND {where} "
            "GROUP BY time, boundary"
        )
    return store.query_rows(
        f"SELECT toUnixTimestamp(time), boundary, p99, sum_ms, n FROM ({minutes}) ORDER BY time",
        params(f),
    )


# Each part of a :class:`~pipeline.core.cover.Cover` the windows answer: its table, how
# that table's rows merge their sketch (the rollups' bins and the base windows' are
# arrays).
_SKETCH_TIERS: Final = (
    *(
        (attr, table, f"{BINS_MERGE}(pos)", f"{BINS_MERGE}(neg)")
        for attr, table in (("hours", "latency_1h"), ("minutes", "latency_1m"))
    ),
    ("windows", "window_sketches", "sumMap(pos_keys, pos_counts)", "sumMap(neg_keys, neg_counts)"),
)


# A partition whose windows stopped closing this long before the newest is left out of
# where the windows are closed (a topic generation gone, a partition idle): the rest read
# from ``requests`` is at most this long.
IDLE_PARTITION_NS: Final = 3_600_000_000_000


def extent_s(store: Store) -> tuple[int, int] | None:
    """``(first, last)`` hour (unix s) of the all-traffic hourly rollup; None: empty."""
    ((lo, hi, n),) = store.query_rows(
        "SELECT toUnixTimestamp(min(window_start)), toUnixTimestamp(max(window_start)), "
        f"count() FROM {store.database}.latency_1h "
        "WHERE boundary = 'gateway_total_ms' AND model = '*'"
    )
    return (int(lo), int(hi)) if n else None


def closed_through(store: Store) -> tuple[int, int]:
    """``(closed_ns, window_ms)``: every window ending at or before ``closed_ns`` (unix ns)
    is closed, in every partition whose windows closed within :data:`IDLE_PARTITION_NS` of
    the newest (the least of their newest ends); ``window_ms`` the base windows' length.
    ``(0, 0)`` without windows."""
    ((closed_ms, window_ms),) = store.query_rows(
        "SELECT min(e), any(w) FROM (SELECT max(toUnixTimestamp64Milli(window_start) + "
        f"window_ms) AS e, any(window_ms) AS w FROM {store.database}.window_sketches "
        "WHERE boundary = {b:String} GROUP BY source_topic, partition) "
        "WHERE e >= (SELECT max(toUnixTimestamp64Milli(window_start) + window_ms) "
        f"FROM {store.database}.window_sketches WHERE boundary = {{b:String}}) - {{idle:Int64}}",
        {"b": SLO_ROW_BOUNDARY, "idle": IDLE_PARTITION_NS // 1_000_000},
    )
    return int(closed_ms or 0) * 1_000_000, int(window_ms or 0)


def cover_sketches(
    store: Store, cover: Cover, boundaries: tuple[str, ...], model: str | None
) -> tuple[dict[str, QuantileSketch], int]:
    """Per boundary, the windows' sketches of the requests (of ``model``; all traffic:
    the key ``('*', '*', '*')``) that ended in the cover's window parts, merged: the
    hourly rollups for its hours, the minute rollups for its minutes, the base windows for
    the rest (corrections summed in); and how many requests the windows counted there
    (their ``records``). Its ``rest`` is not read here."""
    out = {b: QuantileSketch() for b in boundaries}
    key = "model = {model:String}" if model is not None else "model = '*'"
    parts = []
    for attr, table, pos, neg in _SKETCH_TIERS:
        spans = getattr(cover, attr)
        if not spans:
            continue
        parts.append(
            "SELECT boundary, toInt64(sum(records)), toInt64(sum(count)), sum(sum), min(min), "
            f"max(max), toInt64(sum(zero_count)), {pos}, {neg} FROM {store.database}.{table} "
            f"WHERE boundary IN {{bs:Array(String)}} AND {key} "
            f"AND {spans_sql('window_start', spans, 'ms')} GROUP BY boundary"
        )
    if not parts:
        return out, 0
    bound: dict[str, Any] = {"bs": list(boundaries)} | ({"model": model} if model else {})
    records = 0
    for b, n_rec, n, total, lo, hi, zero, (pk, pc), (nk, nc) in store.query_rows(
        " UNION ALL ".join(parts), bound
    ):
        cols = SketchColumns(int(n), float(total), float(lo), float(hi), int(zero),
                             list(pk), list(pc), list(nk), list(nc))  # fmt: skip
        out[str(b)].merge(QuantileSketch.from_columns(cols, delta=True))
        records += int(n_rec) if b == boundaries[0] else 0
    return out, records


def read_ledger(
    store: Store,
    topic: str,
    partition: int,
    from_offset: int,
    memory_ms: int = 0,
    *,
    since_end: bool = False,
) -> dict[str, int]:
    """Requests of ``partition`` the store's windows count that a worker taking the
    partition over must know of: those written past ``from_offset`` (the offset it resumes
    from: it re-reads them), and those counted within ``memory_ms`` of the newest window
    (a duplicate of them may still come). Request id -> ledger code packed with the end of
    the window that counted it (``pipeline.core.ledger.pack``); the furthest version wins
    (``pipeline.core.ledger.code_order``). ``since_end`` (a worker): rows written before
    the partition's last end mark (``pipeline.core.ledger.ENDED_THROUGH``, a topic
    generation that ended) count by time only.
    """
    past = "through_offset > {o:Int64}"
    if since_end:
        past += " AND written_at > ended_at"
    rows = store.query_rows(
        "WITH (SELECT max(toUnixTimestamp64Milli(window_start) + window_ms) "
        f"FROM {store.database}.window_sketches WHERE boundary = {{b:String}} "
        "AND source_topic = {t:String} AND partition = {p:UInt16}) AS newest, "
        f"(SELECT max(written_at) FROM {store.database}.window_sketches "
        "WHERE boundary = {b:String} AND source_topic = {t:String} AND partition = {p:UInt16} "
        "AND through_offset = {e:Int64}) AS ended_at "
        "SELECT id, argMax(v, bitAnd(v, 3) * 4 + bitAnd(bitShiftRight(v, 3), 1) * 2 "
        "+ bitAnd(bitShiftRight(v, 4), 1)), "
        "max(end_ms) FROM ("
        "SELECT arrayJoin(arrayZip(ledger_ids, ledger_versions)) AS t, t.1 AS id, t.2 AS v, "
        "toUnixTimestamp64Milli(window_start) + window_ms AS end_ms "
        f"FROM {store.database}.window_sketches "
        "WHERE boundary = {b:String} AND source_topic = {t:String} AND partition = {p:UInt16} "
        f"AND (({past}) OR end_ms >= newest - {{m:Int64}})) GROUP BY id",
        {
            "b": SLO_ROW_BOUNDARY,
            "t": topic,
            "p": partition,
            "o": from_offset,
            "m": memory_ms,
            "e": ENDED_THROUGH,
        },
    )
    return {str(i): pack(int(v), int(e)) for i, v, e in rows}


def read_window_horizons(store: Store, topic: str, parts: list[int]) -> dict[int, int]:
    """Per partition of ``topic``, the end (unix ms) of the latest window written for it
    as a closed window (not a correction); absent: none. A partition read again from
    its first offset (a topic created again) closes no window up to there again."""
    if not parts:
        return {}
    rows = store.query_rows(
        "SELECT partition, max(toUnixTimestamp64Milli(window_start) + window_ms) "
        f"FROM {store.database}.window_sketches WHERE boundary = {{b:String}} "
        "AND source_topic = {t:String} AND partition IN {ps:Array(UInt16)} "
        "AND correction = 0 GROUP BY partition",
        {"b": SLO_ROW_BOUNDARY, "t": topic, "ps": parts},
    )
    return {int(p): int(end) for p, end in rows}
