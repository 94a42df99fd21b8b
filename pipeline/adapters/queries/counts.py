"""Reads of the report's per-window counts (``sql/0018_window_counts.sql``): the
requests per source, outcome, model, priority and control mode / verdict, the SLOs'
measured bad requests, and the clock skew's offset buckets per host pair, as the windows counted
them (``pipeline.core.window_counts``).

Each reads the window parts of a :class:`~pipeline.core.cover.Cover`: its hours from the
hourly rollups (``request_counts_1h``, ``slo_bad_1h``, ``clock_skew_1h``), its minutes
and base windows from the windows' ``__slo__`` rows themselves (corrections summed in);
its ``rest`` is read from ``requests`` (``requests.range_summary``). A month is 720
hours of the rollups and at most two hours of windows at its ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from pipeline.adapters.queries.filters import spans_sql
from pipeline.adapters.store import SLO_ROW_BOUNDARY, Store
from pipeline.core.cover import Cover, Span

Row = tuple[Any, ...]

# The windows' '__slo__' rows (their ordering key's prefix: the rows of a time range are
# read, not every window's).
_SLO_ROWS: Final = (
    f"w.boundary = '{SLO_ROW_BOUNDARY}' AND w.model = '*' AND w.priority = '*' "
    "AND w.ctx_bucket = '*'"
)


def counted_from_ns(store: Store) -> int:
    """Where the windows' counts start (unix ns): the end of the last window (or
    correction) written without them (before migration 0018; 0: none was). The report
    reads the requests of the windows before it."""
    ((end_ms,),) = store.query_rows(
        "SELECT max(toUnixTimestamp64Milli(window_start) + window_ms) "
        f"FROM {store.database}.window_sketches WHERE boundary = {{b:String}} "
        "AND counts_kept = 0",
        {"b": SLO_ROW_BOUNDARY},
    )
    return int(end_ms or 0) * 1_000_000


def _base_spans(cover: Cover) -> tuple[Span, ...]:
    return (*cover.minutes, *cover.windows)


def _union(
    store: Store,
    cover: Cover,
    hourly: str,
    base: str,
    bound: dict[str, Any],
) -> list[Row]:
    """Rows of ``hourly`` (a SELECT over the hourly rollup, ``{spans}`` for its condition
    on the cover's hours) and ``base`` (over the '__slo__' rows ``w``, the same for the
    base windows), one read."""
    parts = []
    if cover.hours:
        parts.append(hourly.replace("{spans}", spans_sql("window_start", cover.hours, "ms")))
    if _base_spans(cover):
        spans = spans_sql("w.window_start", _base_spans(cover), "ms")
        parts.append(base.replace("{spans}", f"{_SLO_ROWS} AND {spans}"))
    if not parts:
        return []
    return store.query_rows(" UNION ALL ".join(parts), bound)


def _model(column: str, model: str | None) -> str:
    return "1" if model is None else f"{column} = {{model:String}}"


def _bound(model: str | None) -> dict[str, Any]:
    return {} if model is None else {"model": model}


_KEY: Final = ("source", "outcome", "model", "priority", "control_mode", "control_verdict")


def request_counts(store: Store, cover: Cover, model: str | None) -> list[Row]:
    """``(source, outcome, model, priority, control_mode, control_verdict, requests)`` of
    the requests (of ``model``) that ended in the cover's window parts, as the windows
    counted them; a missing priority, mode or verdict is None (stored ""). A key may
    come in more than one row (the rollups' and the windows'): add them up."""
    db = store.database
    key, joined = ", ".join(_KEY), ", ".join(f"c.{k}" for k in _KEY)
    rows = _union(
        store, cover,
        f"SELECT {key}, toInt64(sum(requests)) FROM {db}.request_counts_1h "
        f"WHERE {_model('model', model)} AND {{spans}} GROUP BY {key}",
        f"SELECT {joined}, toInt64(sum(c.requests)) "
        f"FROM {db}.window_sketches AS w ARRAY JOIN w.request_counts AS c "
        f"WHERE {_model('c.model', model)} AND {{spans}} GROUP BY {joined}",
        _bound(model),
    )  # fmt: skip
    return [
        (str(src), str(out), str(m), int(prio) if prio else None, mode or None, verdict or None,
         int(n))
        for src, out, m, prio, mode, verdict, n in rows
    ]  # fmt: skip


def bad_splits(
    store: Store, cover: Cover, slos: Sequence[str], model: str | None
) -> dict[str, tuple[int, float, float]]:
    """Per SLO of ``slos``: ``(count, Σ queue_ms, Σ boundary ms)`` of its measured bad
    requests (of ``model``) that ended in the cover's window parts, as the windows
    counted them (``pipeline.core.slo_windows.SLOBadRow``); an SLO without any: zeros."""
    out = dict.fromkeys(slos, (0, 0.0, 0.0))
    if not slos:
        return out
    db = store.database
    bound = _bound(model) | {"slos": list(slos)}
    for slo, n, queue_ms, bad_ms in _union(
        store, cover,
        "SELECT slo, toInt64(sum(bad_measured)), sum(bad_queue_ms), sum(bad_ms) "
        f"FROM {db}.slo_bad_1h WHERE slo IN {{slos:Array(String)}} AND {_model('model', model)} "
        "AND {spans} GROUP BY slo",
        "SELECT b.slo, toInt64(sum(b.bad_measured)), sum(b.bad_queue_ms), sum(b.bad_ms) "
        f"FROM {db}.window_sketches AS w ARRAY JOIN w.slo_bad AS b "
        f"WHERE b.slo IN {{slos:Array(String)}} AND {_model('b.model', model)} AND {{spans}} "
        "GROUP BY b.slo",
        bound,
    ):  # fmt: skip
        a, q, x = out[str(slo)]
        out[str(slo)] = (a + int(n), q + float(queue_ms), x + float(bad_ms))
    return out


def skew_buckets(
    store: Store, cover: Cover, model: str | None
) -> dict[tuple[str, str], dict[int, int]]:
    """Per (gateway host, engine host): the engine clock's offsets of the joined requests
    (of ``model``) that ended in the cover's window parts, as the windows counted them
    per 0.1 ms bucket (``pipeline.core.skew.offset_bucket`` -> how many), merged
    (corrections summed in; a bucket they emptied is left out)."""
    db = store.database
    rows = _union(
        store, cover,
        f"SELECT gateway_host, engine_host, sumMapMerge(offsets) FROM {db}.clock_skew_1h "
        f"WHERE {_model('model', model)} AND {{spans}} GROUP BY gateway_host, engine_host",
        "SELECT k.gateway_host, k.engine_host, sumMap(k.offset_buckets, k.counts) "
        f"FROM {db}.window_sketches AS w ARRAY JOIN w.clock_skew AS k "
        f"WHERE {_model('k.model', model)} AND {{spans}} GROUP BY k.gateway_host, k.engine_host",
        _bound(model),
    )  # fmt: skip
    out: dict[tuple[str, str], dict[int, int]] = {}
    for gateway, engine, (keys, counts) in rows:
        buckets = out.setdefault((str(gateway), str(engine)), {})
        for k, n in zip(keys, counts, strict=True):
            buckets[int(k)] = buckets.get(int(k), 0) + int(n)
    return {pair: {k: n for k, n in b.items() if n} for pair, b in out.items()}
