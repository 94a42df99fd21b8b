"""Reads of ``requests`` (one row per request attempt, ``FINAL``: the last version)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from pipeline.adapters.queries import counts
from pipeline.adapters.queries.filters import (
    ReportFilter,
    params,
    selection_sql,
    spans_sql,
    time_where,
    verdict_sql,
)
from pipeline.adapters.store import REQUEST_COLUMNS, Store
from pipeline.contract.boundaries import BOUNDARIES
from pipeline.core.cover import Cover, OpenSpan
from pipeline.core.skew import median_offset_ms, offset_bucket
from pipeline.spec.slo import SLO

Row = tuple[Any, ...]
_NAMES: Final = ", ".join(n for n, _ in REQUEST_COLUMNS)


def _where(f: ReportFilter) -> str:
    """The filter's time range and model, and the traffic its SLOs select (bound
    parameters: :func:`_params`)."""
    where = time_where("end_unix_ns", f, unit="ns", model_column="model")
    if f.selects:
        where += " AND " + selection_sql(f.selects)[0]
    return where


def _params(f: ReportFilter) -> dict[str, Any]:
    out = params(f)
    if f.selects:
        out.update(selection_sql(f.selects)[1])
    return out


# A row's logical request (pipeline/core/logical.py, "Which attempts"), as SQL.
LOGICAL_KEY_SQL: Final = "ifNull(logical_request_id, request_id)"


def _maybe_retried_sql(db: str) -> str:
    """SQL: the logical keys that may have more than one attempt: those some row names as
    its logical id, or whose request id some row of a later attempt has (``attempt > 1``),
    over every version of every row (no ``FINAL``: a superset of the final rows' keys).
    A row whose key is not among them is the one attempt of its logical request: its
    logical id is NULL (else its key would be named), and any other row of its key would
    share its request id, so be another attempt of it, one of them ``attempt > 1``."""
    return (
        f"SELECT {LOGICAL_KEY_SQL} FROM {db}.requests "
        "WHERE logical_request_id IS NOT NULL OR attempt > 1"
    )


def logical_rows(store: Store, f: ReportFilter) -> list[Row]:
    """Whole rows (``REQUEST_COLUMNS``) of every attempt, wherever it ended, of the logical
    requests that have an attempt in the filter and may have more than one
    (:func:`_maybe_retried_sql`; pipeline/core/logical.py groups them and keeps those
    whose final attempt is in it). The others: :func:`single_attempt_counts`.

    ``FINAL`` merges the versions of the candidates' rows only (their ordering keys,
    found without it: a key with an attempt in the filter has it in some version), not
    every request of the store (issue 53: that merge was most of a report over an hour
    of a month); which of them have an attempt in the filter is then decided on their
    final versions."""
    db = store.database
    key = LOGICAL_KEY_SQL
    where = _where(f)
    keys = f"SELECT {key} FROM {db}.requests WHERE {where} AND {key} IN ({_maybe_retried_sql(db)})"
    rows = f"SELECT request_id, attempt FROM {db}.requests WHERE {key} IN ({keys})"
    # none: FINAL over an empty set of keys still set up the merge of every part of the
    # table (1.0 s of a 1.7 s report over 30 days of the month store, which has no retries)
    ((n,),) = store.query_rows(f"SELECT count() FROM ({rows})", _params(f))
    if not int(n):
        return []
    return store.query_rows(
        f"SELECT {_NAMES} FROM (SELECT {_NAMES}, max({where}) OVER (PARTITION BY {key}) "
        f"AS has_one FROM {db}.requests FINAL WHERE (request_id, attempt) IN ({rows})) "
        "WHERE has_one",
        _params(f),
    )


def _single_parts(db: str, slos: Sequence[SLO]) -> tuple[list[str], dict[str, Any]]:
    """SQL: over the rows that are the one attempt of their logical request (those
    :func:`logical_rows` leaves out; each is its own logical request, its record the
    attempt's: pipeline/core/logical.py): their count, those never served, then per SLO
    its counted and good (:func:`~pipeline.adapters.queries.filters.verdict_sql`)."""
    single = f"{LOGICAL_KEY_SQL} NOT IN ({_maybe_retried_sql(db)})"
    parts = [f"countIf({single})", f"countIf({single} AND outcome NOT IN ('ok', 'client_abort'))"]
    bound: dict[str, Any] = {}
    for i, slo in enumerate(slos):
        counted, good, p = verdict_sql(slo, f"v{i}_")
        parts += [f"countIf({single} AND {counted})", f"countIf({single} AND {good})"]
        bound.update(p)
    return parts, bound


# At most this many rows (every version) match a read's filter for it to merge the
# versions of their keys only (:func:`final_source`); more, and FINAL merges the whole
# table (a set of every request id of a month would be gigabytes).
FINAL_KEYS_MAX: Final = 200_000


def final_source(store: Store, where: str, bound: dict[str, Any]) -> str:
    """``requests FINAL WHERE where`` for a ``FROM`` clause, merging the versions of few
    keys only when few rows match: those whose request id some version matching
    ``where`` has (found without FINAL, where the skip indexes prune: ``idx_end`` on a
    range of ends), then ``where`` over their final versions. The same rows: a request
    whose final version matches has a matching version (itself), and all versions of a
    key share its request id.

    Why (issue 53): ClickHouse 26.3 skips partition pruning under FINAL for a table whose
    partition key (``ts``) is not in its sorting key (``defer_partition_pruning_after_final``,
    the correct behaviour), so FINAL over any range of ends merged every request of the
    store: 73-96 s for a report over 1 hour of the month store. The parts of a range the
    windows do not answer (a few seconds at each end, what ended after the last closed
    window) match a few hundred rows."""
    db = store.database
    plain = f"{db}.requests FINAL WHERE {where}"
    (n,) = store.query_rows(f"SELECT count() FROM {db}.requests WHERE {where}", bound)[0]
    if int(n) > FINAL_KEYS_MAX:
        return plain
    keys = f"SELECT request_id FROM {db}.requests WHERE {where}"
    return f"{db}.requests FINAL WHERE request_id IN ({keys}) AND {where}"


def _spans_where(f: ReportFilter, spans: Sequence[OpenSpan]) -> str:
    """The filter's model and selected traffic (:func:`_where`), request ends in any of
    ``spans`` instead of its time range."""
    return _where(dataclasses.replace(f, since_unix_s=None, until_unix_s=None)) + (
        f" AND {spans_sql('end_unix_ns', spans, 'ns')}"
    )


def single_attempt_counts(
    store: Store, f: ReportFilter, slos: Sequence[SLO], spans: Sequence[OpenSpan]
) -> Row:
    """``(requests, those never served, then of those that are the one attempt of their
    logical request: count, never served, then per SLO its counted and good)`` of the
    filter's requests ending in ``spans`` (:func:`_single_parts`), exact."""
    parts, bound = _single_parts(store.database, slos)
    failed = "countIf(outcome NOT IN ('ok', 'client_abort'))"
    source = final_source(store, _spans_where(f, spans), _params(f))
    return store.query_rows(
        f"SELECT count(), {failed}, {', '.join(parts)} FROM {source}", {**_params(f), **bound}
    )[0]


def boundary_values(
    store: Store, f: ReportFilter, spans: Sequence[OpenSpan], boundaries: Sequence[str]
) -> list[Row]:
    """The ``boundaries``' values (NULL: none) of the filter's requests ending in
    ``spans``: what the windows cannot answer of a range (``pipeline.core.cover``)."""
    for b in boundaries:
        if b not in BOUNDARIES:
            raise ValueError(f"unknown boundary {b!r}")
    source = final_source(store, _spans_where(f, spans), _params(f))
    return store.query_rows(f"SELECT {', '.join(boundaries)} FROM {source}", _params(f))


# RangeSummary's read of requests groups them by these (sums per source, per outcome, per
# control mode and of the whole range are added up from its groups), and the clock
# skew's by host pair (issue 53: two reads of the range, not one per table; the skew's
# exact median cannot be added up from groups, and a GROUPING SETS read held every
# joined request's offset once per set).
_DIMS: Final = ("source", "outcome", "model", "priority", "control_mode", "control_verdict")
# pipeline.core.skew.offset_ms as SQL (tests/integration/test_report_window_counts.py
# holds the two equal)
_SKEWED: Final = (
    "source = 'joined' AND gateway_received_unix_ns IS NOT NULL "
    "AND engine_arrival_unix_ns IS NOT NULL AND gateway_overhead_ms IS NOT NULL"
)
_SKEW_MS: Final = (
    "(engine_arrival_unix_ns - gateway_received_unix_ns) / 1e6 - gateway_overhead_ms / 2"
)
# What a report's clock skew P50 is: exact over requests alone, else of 0.1 ms buckets.
SKEW_EXACT = "exact (quantileExact over the stored requests)"
SKEW_BUCKETED = (
    "the median of the offsets counted per 0.1 ms by the windows, within 0.05 ms of the exact"
)


@dataclass(frozen=True, slots=True)
class RangeSummary:
    """What ``tailguard report`` counts over the filter's requests besides latency and
    SLOs (sources, outcomes, clock pairs, control modes, the bad requests' time): from
    the windows' counts over a cover's window parts (``queries.counts``) and from
    ``requests`` (``FINAL``) over the rest, or over all of the range."""

    requests: int
    by_source: dict[str, int]
    by_outcome: dict[str, int]
    ended_from: int  # requests that ended at or after ``ended_from_ms``
    bad_splits: tuple[tuple[int, float, float], ...]  # per split SLO: bad_time_split's
    # per gateway -> engine host pair with joined requests: (gateway, engine, joined,
    # P50 of the engine clock's offset from the gateway's in ms: pipeline.core.skew)
    clock_skew: tuple[Row, ...]
    # (model, priority, control_mode, control_verdict, count) of the requests that
    # carried a control mode (gateway.completed ``control_mode``, issue 48)
    control: tuple[Row, ...]
    skew_basis: str = SKEW_EXACT  # what clock_skew's P50 is


@dataclass(slots=True)
class _Sums:
    n: int = 0
    ended: int = 0
    by_source: Counter[str] = dataclasses.field(default_factory=Counter)
    by_outcome: Counter[str] = dataclasses.field(default_factory=Counter)
    control: Counter[tuple[Any, ...]] = dataclasses.field(default_factory=Counter)

    def add(self, key: Sequence[Any], count: int, ended: int) -> None:
        """Add the ``count`` requests of a ``_DIMS`` key, ``ended`` of them after the end."""
        src, out, model, prio, mode, verdict = key
        self.n += count
        self.ended += ended
        self.by_source[str(src)] += count
        self.by_outcome[str(out)] += count
        if mode is not None:
            self.control[model, prio, mode, verdict] += count


def range_summary(
    store: Store,
    f: ReportFilter,
    *,
    split_slos: Sequence[SLO],
    ended_from_ms: int,
    cover: Cover | None = None,
) -> RangeSummary:
    """The filter's :class:`RangeSummary`: with a ``cover`` of its range (``f``'s time
    range split by what answers each part, ``pipeline.core.cover``), its window parts
    from the windows' counts and its ``rest`` from ``requests``; without one (or with no
    window part), all of it from ``requests``. The clock skew's P50 is then the median of
    the offsets' 0.1 ms buckets (``skew_basis``), else exact. The window parts must end at or before
    ``ended_from_ms`` when it is > 0 (their requests did not end after it), and the
    filter select no traffic (``f.selects``: the windows do not know it)."""
    windowed = cover is not None and cover.windowed
    if windowed and f.selects:
        raise ValueError("the windows' counts cannot answer traffic selected by SLOs")
    rest = cover.rest if cover is not None and windowed else None
    where = _where(f) if rest is None else _spans_where(f, rest) if rest else None
    sums = _Sums()
    split_sum = [0.0] * (3 * len(split_slos))
    if where is not None:
        splits, split_bound = _split_parts(split_slos)
        parts = ["count()", f"countIf(end_unix_ns >= {int(ended_from_ms) * 1_000_000})", *splits]
        source = final_source(store, where, _params(f))
        rows = store.query_rows(
            f"SELECT {', '.join(_DIMS)}, {', '.join(parts)} FROM {source} "
            f"GROUP BY {', '.join(_DIMS)}",
            {**_params(f), **split_bound},
        )
        for src, out, model, prio, mode, verdict, count, ended_n, *split_row in rows:
            sums.add((src, out, model, prio, mode, verdict), int(count), int(ended_n))
            split_sum = [a + float(b or 0) for a, b in zip(split_sum, split_row, strict=True)]
    skew_basis = SKEW_EXACT
    if cover is not None and windowed:
        _check_ended(cover, ended_from_ms)
        for *key, count in counts.request_counts(store, cover, f.model):
            sums.add(key, count, count if ended_from_ms <= 0 else 0)
        windows = counts.bad_splits(store, cover, [s.name for s in split_slos], f.model)
        for i, slo in enumerate(split_slos):
            for j, v in enumerate(windows[slo.name]):
                split_sum[3 * i + j] += v
        skew = _skew_merged(store, f, cover, where)
        skew_basis = SKEW_BUCKETED
    else:
        skew = _skew_exact(store, where or "0", _params(f))
    return RangeSummary(
        sums.n, dict(sorted(sums.by_source.items())), dict(sorted(sums.by_outcome.items())),
        sums.ended, _splits_of(split_sum, len(split_slos)), tuple(skew),
        tuple((*k, c) for k, c in sorted(sums.control.items(),
                                         key=lambda kv: _control_order(kv[0]))),
        skew_basis,
    )  # fmt: skip


def _check_ended(cover: Cover, ended_from_ms: int) -> None:
    ends = [b for _, b in (*cover.hours, *cover.minutes, *cover.windows)]
    if ended_from_ms > 0 and max(ends) > ended_from_ms * 1_000_000:
        raise ValueError("the cover's window parts end after ended_from_ms")


def _skew_exact(store: Store, where: str, bound: dict[str, Any]) -> list[Row]:
    """``(gateway, engine, joined, exact P50 offset ms)`` per pair over ``where``."""
    source = final_source(store, f"{_SKEWED} AND {where}", bound)
    return store.query_rows(
        f"SELECT gateway_host, engine_host, count(), quantileExact(0.5)({_SKEW_MS}) "
        f"FROM {source} GROUP BY gateway_host, engine_host ORDER BY gateway_host, engine_host",
        bound,
    )


def _skew_merged(store: Store, f: ReportFilter, cover: Cover, where: str | None) -> list[Row]:
    """``(gateway, engine, joined, median offset ms)`` per pair: the windows' offset
    buckets over the cover's window parts and the offsets of its rest (``where``), bucketed
    alike (``pipeline.core.skew``), merged."""
    buckets = counts.skew_buckets(store, cover, f.model)
    if where is not None:
        source = final_source(store, f"{_SKEWED} AND {where}", _params(f))
        for gateway, engine, offset in store.query_rows(
            f"SELECT gateway_host, engine_host, {_SKEW_MS} FROM {source}", _params(f)
        ):
            pair = buckets.setdefault((str(gateway), str(engine)), {})
            key = offset_bucket(float(offset))
            pair[key] = pair.get(key, 0) + 1
    return [
        (g, e, sum(b.values()), median_offset_ms(b))
        for (g, e), b in sorted(buckets.items())
        if sum(b.values())
    ]


def _control_order(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """``ORDER BY model, priority, control_mode, control_verdict`` (NULLs last)."""
    return tuple((v is None, v if v is not None else 0) for v in key)


def minute_p99_and_means(store: Store, f: ReportFilter, boundaries: tuple[str, ...]) -> list[Row]:
    """``(start s, boundary, p99, sum, count)`` per minute (of the end) and boundary of the
    filter's requests, exact (``quantileExact``): the latency series when the filter
    selects traffic the rollups cannot (the named SLOs' selection)."""
    for b in boundaries:
        if b not in BOUNDARIES:
            raise ValueError(f"unknown boundary {b!r}")
    parts = ", ".join(
        f"('{b}', quantileExactIf(0.99)({b}, {b} IS NOT NULL), sumIf({b}, {b} IS NOT NULL), "
        f"count({b}))"
        for b in boundaries
    )
    rows = store.query_rows(
        f"SELECT toUnixTimestamp(toStartOfMinute(toDateTime64(end_unix_ns / 1e9, 3, 'UTC'))) "
        f"AS t, [{parts}] FROM {store.database}.requests FINAL WHERE {_where(f)} "
        "GROUP BY t ORDER BY t",
        _params(f),
    )
    return [(t, b, p99 if n else None, total, n) for t, per in rows for b, p99, total, n in per]


def filter_rows(store: Store, f: ReportFilter, before_unix_ms: int) -> list[Row]:
    """Whole rows (``REQUEST_COLUMNS``) of the filter's requests that ended before
    ``before_unix_ms`` (the end of the last closed window: what the windows count)."""
    return store.query_rows(
        f"SELECT {_NAMES} FROM {store.database}.requests FINAL WHERE {_where(f)} "
        "AND end_unix_ns < {before:Int64}",
        {**_params(f), "before": before_unix_ms * 1_000_000},
    )


def last_attempt(store: Store, request_id: str) -> Row | None:
    """The whole row of a request's last attempt, or None. ``PREWHERE`` on the request id
    (the sorting key's first column: every version of a row has it, so the filter before
    the merge is exact) lets FINAL merge that request's rows only: 0.11 s against 0.29 s
    with ``WHERE`` on the month store (issue 53: ``explain`` within 300 ms)."""
    rows = store.query_rows(
        f"SELECT {_NAMES} FROM {store.database}.requests FINAL "
        "PREWHERE request_id = {rid:String} ORDER BY attempt DESC LIMIT 1",
        {"rid": request_id},
    )
    return rows[0] if rows else None


def engine_samples(store: Store, boundary: str, model: str | None = None) -> list[Row]:
    """``(model, engine_host, engine arrival ms, engine_e2e_ms, inference_ms, boundary)`` of
    the finished requests the engine measured (joined or engine-only)."""
    if boundary not in BOUNDARIES:
        raise ValueError(f"unknown boundary {boundary!r}: one of {', '.join(BOUNDARIES)}")
    where = (
        "engine_e2e_ms IS NOT NULL AND inference_ms IS NOT NULL "
        f"AND engine_arrival_unix_ns IS NOT NULL AND {boundary} IS NOT NULL"
    )
    bound: dict[str, Any] = {}
    if model is not None:
        where += " AND model = {m:String}"
        bound["m"] = model
    return store.query_rows(
        "SELECT model, engine_host, engine_arrival_unix_ns / 1e6, engine_e2e_ms, inference_ms, "
        f"{boundary} FROM {store.database}.requests FINAL WHERE {where}",
        bound,
    )


def bad_time_split(store: Store, f: ReportFilter, slo: SLO) -> tuple[int, float, float]:
    """The SLO's measured bad requests (over its threshold, with a value; refused ones have
    none) in the filter: ``(count, Σ queue_ms, Σ boundary ms)`` -- how much of the burn was
    queueing (load-caused) and how much compute. The SLO's selection (models, priorities,
    context buckets, tenants, stream, the prompt exclusion, last attempts) as SQL; the
    count is exact over ``requests``, like the window counts (``SLOEvaluator.attribution``)."""
    return bad_time_splits(store, f, [slo])[0]


def _split_parts(slos: Sequence[SLO]) -> tuple[list[str], dict[str, Any]]:
    """SQL: per SLO, the count, Σ queue_ms and Σ boundary ms of its measured bad requests
    (:func:`bad_time_split`), with their bound parameters."""
    parts: list[str] = []
    p: dict[str, Any] = {}
    for i, slo in enumerate(slos):
        b = slo.boundary
        if b not in BOUNDARIES:
            raise ValueError(f"unknown boundary {b!r}")
        late = ">=" if slo.threshold_strict else ">"  # pipeline.core.slo rule 4
        conds = [
            f"{b} IS NOT NULL", f"{b} {late} {float(slo.threshold_ms)!r}", "queue_ms IS NOT NULL"
        ]  # fmt: skip
        outcomes = ["ok", "client_abort"] if slo.client_abort == "measure" else ["ok"]
        conds.append(f"outcome IN {{bt{i}_outcomes:Array(String)}}")
        selected, bound = selection_sql([slo], prefix=f"bt{i}_")
        conds.append(selected)
        p.update(bound)
        p[f"bt{i}_outcomes"] = outcomes
        cond = " AND ".join(conds)
        parts += [f"countIf({cond})", f"sumIf(queue_ms, {cond})", f"sumIf({b}, {cond})"]
    return parts, p


def _splits_of(row: Sequence[Any], n: int) -> tuple[tuple[int, float, float], ...]:
    return tuple(
        (int(row[3 * i]), float(row[3 * i + 1] or 0.0), float(row[3 * i + 2] or 0.0))
        for i in range(n)
    )


def bad_time_splits(
    store: Store, f: ReportFilter, slos: Sequence[SLO]
) -> list[tuple[int, float, float]]:
    """:func:`bad_time_split` of each of ``slos``, in one read of the filter's requests."""
    if not slos:
        return []
    parts, p = _split_parts(slos)
    row = store.query_rows(
        f"SELECT {', '.join(parts)} FROM {store.database}.requests FINAL WHERE {_where(f)}",
        {**_params(f), **p},
    )[0]
    return list(_splits_of(row, len(slos)))
