"""A tenant's contract statement for one billing period, computed exactly (pure).

Inputs are plain values: the tenant's request records of the period (one per request
attempt, the store's final version), the control audit's level changes, the budget
events, the contract and its SLO spec, and the digests of what was read. The same
inputs always give the same statement (``tailguard statement --verify`` relies on it).

The rules (``specs/README.md`` "Contracts" documents them for readers of a statement):

* **Period.** Records whose ``end_unix_ns`` (the window time) lies in the calendar
  month in the contract's time zone; days are that zone's calendar days.
* **Exemptions.** A record ending in a declared maintenance window is exempted
  ("maintenance: <reason>"). A record marked as served during a cold start
  (``cold_start_unix_ns``) belongs to the cold start (engine host, start time); per
  day (of the cold start, contract time zone) the first ``max_per_day`` cold starts
  (by start time, then host) are exempted, later ones are listed as over the cap and
  counted like any request. Exempted records are in no count below.
* **SLOs.** For each bound SLO, ``SLO.classify`` on every counted record: ``total``
  = good + bad, ``compliance`` = good / total, ``met`` = compliance >= objective
  (null when nothing counted). Each blended tier of the spec whose primary and
  secondary are both bound: ``(good primary + w x good for the secondary only) /
  total of the primary`` (``pipeline/core/slo.py``), met against its objective.
* **Percentiles and breaches.** Per bound SLO, the values of its boundary on the
  records it counts (not skipped, with a value); the percentile is nearest-rank
  (the ``ceil(p/100 * n)``-th smallest). Per day whose percentile exceeds the SLO's
  threshold: a breach; above ``severe_above`` x threshold: severe. The period is
  within the rule when breaches <= ``max_breaches`` and none is severe.
* **Budget exhaustion: the tenant's.** A ``budget_exhausted`` event of a bound SLO in
  the period is the tenant's when at least one of the tenant's counted records is bad
  for that SLO in the ``lookback`` before it (``period``: since the period began);
  budget events are service-wide, and one without such a record is listed under
  ``budget_exhausted_not_this_tenant`` and triggers nothing for the tenant. Each of the
  tenant's exhaustions opens a billing pause (``pause_for``: a duration or until the
  period ends; overlapping pauses merge) and, with ``incident_report``, an incident:
  the SLO, its boundary, those bad records (never none), their queue share (sum queue_ms
  / sum (queue_ms + inference_ms) over those with both) and the worst of them by the
  boundary's value.
* **Levels and credit.** Control levels are per scope (a model; ``*`` or ``fleet``: every
  model of the contract). A scope's level counts for the tenant only while the tenant
  had traffic in it: in the ``TRAFFIC_SLOT_MS`` (one minute) slots, aligned to the Unix
  epoch, that one of the tenant's records of the period on the scope's models overlaps
  from its start to its end (a record whose two times are more than an hour apart: its
  end's slot only). The tenant's level at an instant is the highest level of the covered
  scopes it had traffic in (each scope holds the level of its latest audit row by event
  time; before its first row a scope is at 0); the service's level (every covered
  scope, traffic or not) is reported beside it and counts for nothing. Time is counted
  over [period start, min(period end, observed_until)], ``observed_until`` being the
  latest event time the store holds for the period (requests of any tenant, audit rows).
  Billing pauses take precedence. With T = the period's length::

      credit_percent = 100 * paused_ms / T
                     + sum over levels L of (-fee_change_percent(L)) * ms_at_L_unpaused / T
"""

from __future__ import annotations

import bisect
import datetime as dt
import hashlib
import itertools
import math
import zoneinfo
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from operator import attrgetter
from typing import Any, Final, Protocol, runtime_checkable

import msgspec
import numpy as np
import orjson

from pipeline.contract.boundaries import BOUNDARIES
from pipeline.core.record import RequestRecord
from pipeline.core.slo import (
    CLASSIFY_FIELDS,
    LOWER_BOUNDS,
    BoolArray,
    Categorical,
    FloatArray,
    IntArray,
    RecordColumns,
    SLOMatcher,
    boundary_table,
)
from pipeline.core.timefmt import iso_time
from pipeline.spec.contract import Contract, digest, period_bounds_ns
from pipeline.spec.durations import parse_duration_ms
from pipeline.spec.slo import SLOSpec

_NS_PER_MS: Final = 1_000_000
# 3: the requests digest is over the columns the statement reads (the store's columns
# digest), not every field of the records (2); 4: the same numbers, counted in the store's
# engine, the digest its sum of row hashes (pipeline.adapters.queries.statement_engine)
STATEMENT_VERSION: Final = 4
# A tenant "had traffic in a control scope" during a slot of this length in which one of
# its requests of the scope's models was in flight (the levels' rule, module docstring).
TRAFFIC_SLOT_MS: Final = 60_000
# Longer than this from start to end, a record's two clocks disagree: only its end counts.
MAX_SPAN_MS: Final = 3_600_000
# Control scopes that hold for every model (the contract's ``models``, when it names them).
FLEET_SCOPES: Final = frozenset({"*", "fleet"})


@dataclass(frozen=True, slots=True)
class LevelChange:
    """One control audit row: from ``at_ms`` (event time) ``scope`` runs at ``level``."""

    scope: str
    at_ms: int
    seq: int
    level: int


@dataclass(frozen=True, slots=True)
class BudgetEventRow:
    """One ``budget_events`` row."""

    slo: str
    event: str
    at_ms: int


# --------------------------------------------------------------------------- #
# The statement, typed. ``Statement.to_json`` is its one wire form (``statement --json``,
# what ``--verify`` reads back): each field under its name, ``from_``/``to`` as
# ``from``/``to``, mappings' keys as strings, tuples as lists, in field order.
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class SLOResult:
    """One bound SLO over the counted records."""

    boundary: str
    threshold_ms: float
    objective: float
    total: int
    good: int
    compliance: float | None  # good / total; None when nothing counted
    met: bool | None


@dataclass(frozen=True, slots=True)
class TierResult:
    """One blended tier whose primary and secondary the contract binds."""

    primary: str
    secondary: str
    secondary_weight: float
    objective: float
    total: int
    good_primary: int
    good_secondary_only: int
    compliance: float | None
    met: bool | None


@dataclass(frozen=True, slots=True)
class DayPercentile:
    """A day's nearest-rank percentile of an SLO's boundary over ``n`` values."""

    p: float
    n: int


@dataclass(frozen=True, slots=True)
class Percentiles:
    """An SLO's boundary's nearest-rank percentile over the period and per day."""

    boundary: str
    period: float | None
    n: int
    days: Mapping[str, DayPercentile]


@dataclass(frozen=True, slots=True)
class Breach:
    """A day whose percentile ``p_ms`` is above the SLO's ``target_ms``; severe above
    ``severe_above`` x target."""

    slo: str
    boundary: str
    day: str
    p_ms: float
    target_ms: float
    ratio: float
    severe: bool


@dataclass(frozen=True, slots=True)
class BreachVerdict:
    """The contract's breach rule and what the period's breaches make of it."""

    percentile: float
    per: str
    severe_above: float
    max_breaches: int
    breaches: int
    severe: int
    within: bool


@dataclass(frozen=True, slots=True)
class Span:
    """``[from_ms, to_ms)``, its ends also as times in the contract's zone (a billing
    pause)."""

    from_: str
    to: str
    from_ms: int
    to_ms: int


@dataclass(frozen=True, slots=True)
class LevelInterval(Span):
    """Where the tenant's level was ``level`` (above 0), held by ``scopes``."""

    level: int
    scopes: tuple[str, ...]
    notify_customer: bool


@dataclass(frozen=True, slots=True)
class Levels:
    """The tenant's time at each level (only while it had traffic in the scope) and the
    service's, over [period start, ``observed_until``]."""

    observed_until: str
    rule: str
    traffic_slot_ms: int
    ms_at_level: Mapping[int, int]  # the tenant's (level 0 included)
    ms_at_level_service: Mapping[int, int]  # every covered scope's, traffic or not
    timeline: tuple[LevelInterval, ...]  # the tenant's, levels above 0


@dataclass(frozen=True, slots=True)
class CreditTerm:
    """A level's part of the credit: ``-fee_change_percent x ms / period_ms``."""

    level: int
    fee_change_percent: float
    ms: int  # at the level, outside billing pauses
    credit_percent: float


@dataclass(frozen=True, slots=True)
class Credit:
    """The credit's terms: the billing pauses' (the whole fee) and each level's."""

    period_ms: int
    paused_ms: int
    paused_percent: float
    levels: tuple[CreditTerm, ...]
    formula: str


@dataclass(frozen=True, slots=True)
class ColdStart:
    """An engine's cold start: its requests, exempted while within the day's cap."""

    engine_host: str
    started: str
    started_unix_ns: int
    day: str
    nth_of_day: int
    requests: int
    exempted: bool
    exempted_requests: int


@dataclass(frozen=True, slots=True)
class Exemption:
    """A request attempt left out of every count, and why."""

    request_id: str
    attempt: int
    reason: str


@dataclass(frozen=True, slots=True)
class WorstRequest:
    """One of an incident's worst requests by the SLO's boundary (``value_ms``)."""

    request_id: str
    attempt: int
    value_ms: float | None
    queue_ms: float | None
    inference_ms: float | None
    engine_host: str | None
    explain: str


@dataclass(frozen=True, slots=True)
class Incident:
    """A budget exhaustion that is the tenant's: its bad records before it."""

    at: str
    at_ms: int
    slo: str
    boundary: str
    bad_requests: int
    queue_share: float | None
    compute_share: float | None
    worst: tuple[WorstRequest, ...]


@dataclass(frozen=True, slots=True)
class NotThisTenant:
    """A budget exhaustion with no counted bad record of the tenant before it."""

    at: str
    at_ms: int
    slo: str
    why: str


@dataclass(frozen=True, slots=True)
class Statement:
    """A tenant's statement for one billing period (the module docstring's rules)."""

    statement_version: int
    tenant: str
    period: str
    timezone: str
    period_start: str
    period_end: str
    requests: int
    counted: int
    slos: Mapping[str, SLOResult]
    tiers: Mapping[str, TierResult]
    percentiles: Mapping[str, Percentiles]
    breaches: tuple[Breach, ...]
    breach_rule: BreachVerdict
    levels: Levels
    billing_pauses: tuple[Span, ...]
    credit: Credit
    credit_percent: float
    cold_starts: tuple[ColdStart, ...]
    exempted: tuple[Exemption, ...]
    exempted_by_reason: Mapping[str, int]
    incidents: tuple[Incident, ...]
    budget_exhausted_not_this_tenant: tuple[NotThisTenant, ...]
    inputs: Mapping[str, Any]  # what was read, named by the store's side

    def to_json(self) -> dict[str, Any]:
        """The statement's JSON form (``statement --json``; ``--verify`` reads it)."""
        out = _json(self)
        assert isinstance(out, dict)
        return out


_JSON_KEYS: Final = {"from_": "from"}
_KEY: Final = attrgetter("request_id", "attempt")  # a record's key, and the records' order
_END_NS: Final = attrgetter("end_unix_ns")
_MODEL: Final = attrgetter("model")

# What the statement reads of a record besides its boundaries: a store reader gives it
# these as columns (StatementRows), without building records.
STATEMENT_FIELDS: Final = tuple(
    dict.fromkeys(
        (
            "request_id", "attempt", "tenant", "end_unix_ns", "ts_unix_ns", "model",
            "engine_host", "cold_start_unix_ns", *CLASSIFY_FIELDS,
        )
    )
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class StatementRows:
    """Records as columns, one per key: ``fields`` maps each of :data:`STATEMENT_FIELDS`
    to one value per record (the record's own, None when missing; a list or a numpy
    array), ``boundaries`` is their :func:`~pipeline.core.slo.boundary_table`. What the
    statement reads (a store reader's columns, or :meth:`of_records`: in key order).

    In any order: the statement is the same in every order, but for the last bits of an
    incident's queue share, summed in the rows' order (a reader gives one canonical
    order: the store's, by key hash)."""

    fields: Mapping[str, Sequence[Any]]
    boundaries: FloatArray

    def __len__(self) -> int:
        return len(self.boundaries)

    @classmethod
    def of_records(cls, records: Sequence[RequestRecord]) -> StatementRows:
        ordered = sorted(records, key=_KEY)
        return cls(
            {name: list(map(attrgetter(name), ordered)) for name in STATEMENT_FIELDS},
            boundary_table(ordered),
        )

    def ints(self, name: str) -> IntArray:
        """A field that is never missing, as int64."""
        col = self.fields[name]
        if isinstance(col, np.ndarray):
            return col.astype(np.int64, copy=False)
        return np.fromiter(col, np.int64, len(col))

    def digest(self) -> str:
        """The rows' digest (statement version 3's ``requests_digest``): the same value
        whatever form the columns come in, in the rows' order. sha256 over each field of
        :data:`STATEMENT_FIELDS` in turn, its name (JSON), then: a field never missing
        (:data:`_INT_FIELDS`) as int64; one of many values (:data:`_LISTED_FIELDS`) as the
        JSON list of its values; any other as the JSON list of its distinct values (sorted
        by their JSON) then each row's index among them (int32); then each boundary, its
        name (JSON), its missing rows (``numpy.packbits``) and its values as float64
        (missing: 0). Little-endian."""
        h = hashlib.sha256()
        for name in STATEMENT_FIELDS:
            col = self.fields[name]
            h.update(orjson.dumps(name))
            if name in _INT_FIELDS:
                h.update(self.ints(name).astype("<i8").tobytes())
            elif name in _LISTED_FIELDS:
                h.update(orjson.dumps(_as_list(col)))
            else:
                cat = Categorical.of(col)
                known = [orjson.dumps(v) for v in cat.categories]
                distinct = sorted(set(known))
                rank = {v: i for i, v in enumerate(distinct)}
                recode = np.array([rank[v] for v in known], dtype="<i4")
                h.update(b"[" + b",".join(distinct) + b"]")
                h.update(recode[cat.codes].tobytes())
        for j, name in enumerate(BOUNDARIES):
            values = self.boundaries[:, j]
            missing = np.isnan(values)
            h.update(orjson.dumps(name))
            h.update(np.packbits(missing).tobytes())
            h.update(np.where(missing, 0.0, values).astype("<f8").tobytes())
        return "sha256:" + h.hexdigest()

    def take(self, rows: IntArray) -> StatementRows:
        """These rows, in this order."""
        at = rows.tolist()
        fields: dict[str, Sequence[Any]] = {}
        for name, col in self.fields.items():
            if isinstance(col, Categorical):
                fields[name] = col.take(rows)
            elif isinstance(col, np.ndarray):
                fields[name] = col[rows]
            else:
                fields[name] = [col[i] for i in at]
        return StatementRows(fields, self.boundaries[rows])


# StatementRows.digest: fields never missing, and fields of many distinct values
_INT_FIELDS: Final = frozenset({"attempt", "end_unix_ns", "ts_unix_ns"})
_LISTED_FIELDS: Final = frozenset({"request_id", "prompt_tokens", "cold_start_unix_ns"})


def _as_list(col: Sequence[Any]) -> list[Any]:
    if isinstance(col, np.ndarray | Categorical):
        values: list[Any] = col.tolist()
        return values
    return list(col)


def _json(x: Any) -> Any:
    if hasattr(x, "__dataclass_fields__"):
        return {_JSON_KEYS.get(f.name, f.name): _json(getattr(x, f.name)) for f in fields(x)}
    if isinstance(x, Mapping):
        return {str(k): _json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json(v) for v in x]
    return x


def records_digest(records: Sequence[RequestRecord]) -> str:
    """Digest of the records (in (request_id, attempt) order, every field)."""
    ordered = sorted(records, key=_KEY)
    # (orjson writes a tuple as the list it was)
    return digest(orjson.dumps(list(map(msgspec.structs.astuple, ordered))))


def rows_digest(rows: Sequence[Sequence[Any]]) -> str:
    return digest(orjson.dumps(sorted(([*r] for r in rows), key=orjson.dumps)))


def nearest_rank(values: Sequence[float], percentile: float) -> float | None:
    """The nearest-rank percentile: the ``ceil(p/100 * n)``-th smallest value."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(1, math.ceil(percentile / 100.0 * len(ordered)))
    return ordered[k - 1]


def _iso(ns: int, tz: zoneinfo.ZoneInfo) -> str:
    return iso_time(ns / 1e9, tz=tz)


def _day(ns: int, tz: zoneinfo.ZoneInfo) -> str:
    return dt.datetime.fromtimestamp(ns // 1_000_000_000, tz=tz).date().isoformat()


def _exemptions(
    rows: StatementRows, contract: Contract, tz: zoneinfo.ZoneInfo
) -> tuple[dict[int, str], tuple[ColdStart, ...]]:
    """Row -> reason for the exempted rows; and the cold starts seen."""
    reasons: dict[int, str] = {}
    windows = maintenance_windows(contract)
    if windows:
        end_ns = rows.ints("end_unix_ns")
        window = np.full(len(rows), -1, dtype=np.int64)  # the first window each ends in
        for j, (start, end, _) in reversed(list(enumerate(windows))):
            window[(start <= end_ns) & (end_ns < end)] = j
        for i in np.flatnonzero(window >= 0).tolist():
            reasons[i] = f"maintenance: {windows[int(window[i])][2]}"
    starts: dict[tuple[int, str], list[int]] = defaultdict(list)
    hosts = rows.fields["engine_host"]
    for i, at in enumerate(rows.fields["cold_start_unix_ns"]):
        if at is not None:
            starts[(int(at), hosts[i] or "")].append(i)
    cap = contract.exemptions.cold_starts
    per_day: dict[str, int] = defaultdict(int)
    cold: list[ColdStart] = []
    for (at_ns, host), members in sorted(starts.items()):
        day = _day(at_ns, tz)
        per_day[day] += 1
        k = per_day[day]
        exempt = cap is not None and k <= cap.max_per_day
        n_exempted = 0
        if exempt:
            assert cap is not None
            why = (
                f"cold start: {host} started {_iso(at_ns, tz)} "
                f"({k} of at most {cap.max_per_day} on {day})"
            )
            for i in members:
                if i not in reasons:
                    reasons[i] = why
                    n_exempted += 1
        cold.append(
            ColdStart(
                engine_host=host,
                started=_iso(at_ns, tz),
                started_unix_ns=at_ns,
                day=day,
                nth_of_day=k,
                requests=len(members),
                exempted=exempt,
                exempted_requests=n_exempted,
            )
        )
    return reasons, tuple(cold)


def maintenance_windows(contract: Contract) -> list[tuple[int, int, str]]:
    """The contract's maintenance windows: ``(start_ns, end_ns, reason)``, as listed (a
    record ending in ``[start_ns, end_ns)`` of one is exempted: the first's reason)."""
    return [(_ns_of(w.start), _ns_of(w.end), w.reason) for w in contract.exemptions.maintenance]


def _ns_of(t: dt.datetime) -> int:
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


def _scope_models(scope: str, models: list[str] | None) -> frozenset[str] | None:
    """The models whose traffic is in a control scope (None: every model)."""
    if scope in FLEET_SCOPES:
        return None if models is None else frozenset(models)
    return frozenset({scope})


def traffic_intervals(
    records: Sequence[RequestRecord],
    scopes: Sequence[str],
    models: list[str] | None,
    start_ms: int,
    end_ms: int,
    *,
    slot_ms: int = TRAFFIC_SLOT_MS,
) -> dict[str, list[tuple[int, int]]]:
    """Per control scope, where in ``[start_ms, end_ms)`` the records' tenant had traffic
    in it: the ``slot_ms`` slots (aligned to the Unix epoch) that a record of the scope's
    models overlaps, from its start (``ts_unix_ns``) to its end (``end_unix_ns``); a
    record whose two times are more than ``MAX_SPAN_MS`` apart (a clock off) marks only
    its end's slot. Merged, sorted intervals."""
    n = len(records)
    return _traffic(
        np.fromiter(map(attrgetter("ts_unix_ns"), records), np.int64, n),
        np.fromiter(map(_END_NS, records), np.int64, n),
        list(map(_MODEL, records)),
        scopes=scopes, models=models, start_ms=start_ms, end_ms=end_ms, slot_ms=slot_ms,
    )  # fmt: skip


def _traffic(
    start_ns: IntArray,
    end_ns: IntArray,
    of_record: Sequence[str],
    *,
    scopes: Sequence[str],
    models: list[str] | None,
    start_ms: int,
    end_ms: int,
    slot_ms: int = TRAFFIC_SLOT_MS,
) -> dict[str, list[tuple[int, int]]]:
    """:func:`traffic_intervals` of records given as their starts, ends and models."""
    n = len(end_ns)
    end = end_ns // _NS_PER_MS
    start = np.minimum(start_ns // _NS_PER_MS, end)
    start = np.where(end - start > MAX_SPAN_MS, end, start)
    first, last = start // slot_ms, end // slot_ms
    model = Categorical.of(of_record)
    out: dict[str, list[tuple[int, int]]] = {}
    for scope in scopes:
        allowed = _scope_models(scope, models)
        mine = np.ones(n, np.bool_) if allowed is None else model.where(allowed.__contains__)
        out[scope] = _slot_runs(first[mine], last[mine], start_ms, end_ms, slot_ms)
    return out


def _slot_runs(
    first: IntArray, last: IntArray, start_ms: int, end_ms: int, slot_ms: int
) -> list[tuple[int, int]]:
    """The union of the slots ``first[i] .. last[i]`` (inclusive), each clipped to
    ``[start_ms, end_ms)`` (a slot left empty is dropped), as merged sorted intervals."""
    return _runs(slots_of(first, last), start_ms, end_ms, slot_ms)


def slots_of(first: IntArray, last: IntArray) -> IntArray:
    """The distinct slots ``first[i] .. last[i]`` (inclusive) cover, sorted."""
    lengths = last - first + 1
    offsets = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(lengths) - lengths, lengths
    )
    ks: IntArray = np.unique(np.repeat(first, lengths) + offsets)
    return ks


def traffic_of_slots(
    slots: Mapping[str, IntArray],
    scopes: Sequence[str],
    models: list[str] | None,
    start_ms: int,
    end_ms: int,
    *,
    slot_ms: int = TRAFFIC_SLOT_MS,
) -> dict[str, list[tuple[int, int]]]:
    """:func:`traffic_intervals` given, per model, the slots its records overlap (slot
    numbers: ``ms // slot_ms``; a record's first and last slots as
    :func:`traffic_intervals` says, and every slot between)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for scope in scopes:
        allowed = _scope_models(scope, models)
        mine = [ks for m, ks in slots.items() if allowed is None or m in allowed]
        ks = np.unique(np.concatenate(mine)) if mine else np.empty(0, dtype=np.int64)
        out[scope] = _runs(ks, start_ms, end_ms, slot_ms)
    return out


def _runs(ks: IntArray, start_ms: int, end_ms: int, slot_ms: int) -> list[tuple[int, int]]:
    """Sorted distinct slots, each clipped to ``[start_ms, end_ms)``, as merged intervals."""
    lo = np.maximum(start_ms, ks * slot_ms)
    hi = np.minimum(end_ms, (ks + 1) * slot_ms)
    keep = lo < hi
    ks, lo, hi = ks[keep], lo[keep], hi[keep]
    if not len(ks):
        return []
    # two kept slots touch exactly when they are consecutive (clipping only cuts the ends)
    breaks = np.flatnonzero(np.diff(ks) != 1)
    firsts = np.concatenate(([0], breaks + 1))
    lasts = np.concatenate((breaks, [len(ks) - 1]))
    return list(zip(lo[firsts].tolist(), hi[lasts].tolist(), strict=True))


def _covers(intervals: list[tuple[int, int]], t: int) -> bool:
    i = bisect.bisect_right(intervals, t, key=lambda iv: iv[0]) - 1
    return i >= 0 and intervals[i][0] <= t < intervals[i][1]


def _level_timeline(
    changes: Sequence[LevelChange],
    models: list[str] | None,
    start_ms: int,
    end_ms: int,
    traffic: dict[str, list[tuple[int, int]]] | None = None,
) -> list[tuple[int, int, int, list[str]]]:
    """[(from_ms, to_ms, level, scopes at that level)] covering [start_ms, end_ms): one
    sweep over the changes in (event time, seq) order. With ``traffic`` (per scope, where
    the tenant had traffic in it) a scope's level counts only inside its intervals."""
    ordered = sorted(
        (c for c in changes if models is None or c.scope in models or c.scope in FLEET_SCOPES),
        key=lambda c: (c.at_ms, c.seq, c.scope),
    )
    edges = {start_ms, end_ms, *(c.at_ms for c in ordered if start_ms < c.at_ms < end_ms)}
    if traffic is not None:
        for ivs in traffic.values():
            for a, b in ivs:
                edges.update(x for x in (a, b) if start_ms < x < end_ms)
    current: dict[str, int] = {}
    i = 0
    out: list[tuple[int, int, int, list[str]]] = []
    if start_ms >= end_ms:
        return out
    for t, nxt in itertools.pairwise(sorted(edges)):
        while i < len(ordered) and ordered[i].at_ms <= t:
            current[ordered[i].scope] = ordered[i].level
            i += 1
        live = {
            s: lv for s, lv in current.items() if traffic is None or _covers(traffic.get(s, []), t)
        }
        level = max(live.values(), default=0)
        scopes = sorted(s for s, lv in live.items() if lv == level) if level > 0 else []
        if out and out[-1][2] == level and out[-1][3] == scopes and out[-1][1] == t:
            out[-1] = (out[-1][0], nxt, level, scopes)
        else:
            out.append((t, nxt, level, scopes))
    return out


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap_ms(a: int, b: int, pauses: list[tuple[int, int]]) -> int:
    return sum(max(0, min(b, y) - max(a, x)) for x, y in pauses)


def compute_statement(
    *,
    tenant: str,
    period: str,
    contract: Contract,
    spec: SLOSpec,
    records: Sequence[RequestRecord] | StatementRows | StatementSource,
    level_changes: Sequence[LevelChange],
    budget_events: Sequence[BudgetEventRow],
    observed_until_ns: int | None,
    inputs: dict[str, Any],
    version: int = STATEMENT_VERSION,
) -> Statement:
    """The statement (see the module docstring for every rule). ``records``: the records,
    or their columns (:class:`StatementRows`, one row per key): only the tenant's ending
    in the period count; or what a store counts of the tenant's period
    (:class:`StatementSource`, statement version 4 on)."""
    if tenant not in contract.tenants:
        raise ValueError(f"tenant {tenant!r} is not covered by the contract")
    tz = zoneinfo.ZoneInfo(contract.billing.timezone)
    p_start, p_end = period_bounds_ns(period, contract.billing.timezone)
    if isinstance(records, StatementSource):
        source = records
    else:
        given = records if isinstance(records, StatementRows) else StatementRows.of_records(records)
        source = RowSource(_of_tenant(given, tenant, p_start, p_end), tz)
    special = source.special
    reasons, cold = _exemptions(special, contract, tz)
    batch = _Counted.of(source, sorted(reasons), contract, spec)
    slos, percentiles, breaches = _slo_results(batch, contract, spec)
    p_start_ms, p_end_ms = p_start // _NS_PER_MS, p_end // _NS_PER_MS
    until_ms = p_end_ms
    if observed_until_ns is not None:
        until_ms = max(p_start_ms, min(p_end_ms, observed_until_ns // _NS_PER_MS + 1))
    mine, not_mine = _exhaustions(
        budget_events, batch, contract, tz=tz, p_start_ms=p_start_ms, p_end_ms=p_end_ms
    )
    pauses = _pauses(mine, contract, p_end_ms)
    levels, credit = _levels_and_credit(
        source, level_changes, contract, tz, pauses=pauses, span_ms=(p_start_ms, until_ms, p_end_ms)
    )
    ids, attempts = special.fields["request_id"], special.fields["attempt"]
    by_reason: dict[str, int] = defaultdict(int)
    for why in reasons.values():
        by_reason[why.split(":", 1)[0]] += 1
    n_severe = sum(1 for b in breaches if b.severe)
    rule = contract.breach
    return Statement(
        statement_version=version,
        tenant=tenant,
        period=period,
        timezone=contract.billing.timezone,
        period_start=_iso(p_start, tz),
        period_end=_iso(p_end, tz),
        requests=source.requests,
        counted=batch.total(batch.kept),
        slos=slos,
        tiers=_tiers(batch, contract, spec),
        percentiles=percentiles,
        breaches=breaches,
        breach_rule=BreachVerdict(
            percentile=rule.percentile,
            per=rule.per,
            severe_above=rule.severe_above,
            max_breaches=rule.max_breaches,
            breaches=len(breaches),
            severe=n_severe,
            within=len(breaches) <= rule.max_breaches and n_severe == 0,
        ),
        levels=levels,
        billing_pauses=tuple(
            Span(_iso(a * _NS_PER_MS, tz), _iso(b * _NS_PER_MS, tz), a, b) for a, b in pauses
        ),
        credit=credit,
        credit_percent=_credit_percent(credit),
        cold_starts=cold,
        exempted=tuple(
            Exemption(ids[i], int(attempts[i]), reasons[i])
            for i in sorted(reasons, key=lambda i: (ids[i], attempts[i]))
        ),
        exempted_by_reason=dict(sorted(by_reason.items())),
        incidents=_incidents(mine, contract, spec, tz),
        budget_exhausted_not_this_tenant=not_mine,
        inputs=inputs,
    )


# A day's (or the period's) nearest-rank percentile of a boundary's values: (day as days
# since 1970-01-01 in the contract's zone, percentile, how many values)
DayValue = tuple[int, float, int]


@runtime_checkable
class StatementSource(Protocol):
    """What :func:`compute_statement` reads of a tenant's period: the tenant's rows
    (:class:`RowSource`), or what a store counts of them without handing them over
    (``pipeline.adapters.queries.statement_engine``, statement version 4: a tenant-month
    of a month store is 15 M rows, issue 53). The rules stay here: the source answers
    for masks over its :meth:`counted` groups, which ``SLOMatcher.classify_many``
    judged."""

    @property
    def requests(self) -> int:
        """The tenant's rows of the period (exempted or not)."""
        ...

    @property
    def special(self) -> StatementRows:
        """At least every row that ends in a maintenance window of the contract
        (:func:`maintenance_windows`) or has a cold start: what the exemptions read."""
        ...

    def counted(self, exempt: Sequence[int]) -> tuple[RecordColumns, IntArray, BoolArray]:
        """The rows as groups, given the exempted rows (indices into :attr:`special`):
        the groups' columns (what ``classify_many`` reads: a group's rows are alike for
        every SLO of the contract), each group's rows, and which groups are counted
        (not exempted)."""
        ...

    def percentiles(
        self, asked: Sequence[tuple[str, BoolArray]], percentile: float
    ) -> list[tuple[DayValue | None, list[DayValue]]]:
        """For each ``(boundary, mask)`` asked: the nearest-rank ``percentile`` of the
        boundary's values on the rows of the groups in the mask that have one (exempted
        rows never), over the period (day -1; None without values) and per day in day
        order."""
        ...

    def bad_rows(self, rows: BoolArray, from_ns: int, to_ns: int) -> StatementRows:
        """The rows of the groups in the mask ending in ``[from_ns, to_ns]``, in the order
        of their key's hash (request_id, attempt, engine_host and the boundaries)."""
        ...

    def traffic(
        self, scopes: Sequence[str], models: list[str] | None, start_ms: int, end_ms: int
    ) -> dict[str, list[tuple[int, int]]]:
        """:func:`traffic_intervals` of every row (exempted too)."""
        ...


@dataclass(frozen=True, slots=True)
class Cuts:
    """Where the contract's SLOs cut each value (statement version 4): the thresholds of
    each boundary they compare (their own, and a missing first byte's lower bound), and
    the prompt sizes they exclude above. A group of rows alike in the SLOs' fields and in
    the interval of each cut their values fall in (:meth:`interval`: codes) is alike for
    every SLO of the contract, so ``classify_many`` judges it on one row standing for it
    (:meth:`stand_in`, :meth:`prompt_stand_in`)."""

    boundaries: Mapping[str, tuple[float, ...]]  # sorted thresholds per boundary
    prompt_tokens: tuple[int, ...]  # sorted ``exclude.prompt_tokens_over``

    @classmethod
    def of(cls, contract: Contract, spec: SLOSpec) -> Cuts:
        at: dict[str, set[float]] = defaultdict(set)
        prompts: set[int] = set()
        for name in contract.slos:
            slo = spec.slo(name)
            at[slo.boundary].add(float(slo.threshold_ms))
            if slo.boundary in LOWER_BOUNDS:
                at[LOWER_BOUNDS[slo.boundary]].add(float(slo.threshold_ms))
            if slo.exclude is not None and slo.exclude.prompt_tokens_over is not None:
                prompts.add(slo.exclude.prompt_tokens_over)
        return cls({b: tuple(sorted(t)) for b, t in sorted(at.items())}, tuple(sorted(prompts)))

    @staticmethod
    def interval(value: float | None, cuts: Sequence[float]) -> int:
        """A value's interval among the cuts ``t1 < ... < tk``: -1 missing, ``2j``
        between ``t_j`` and ``t_j+1`` (0: below ``t1``, ``2k``: above ``tk``),
        ``2j - 1`` equal to ``t_j`` (what a store's reader computes in its own terms)."""
        if value is None or math.isnan(value):
            return -1
        return sum(2 * (value > t) + (value == t) for t in cuts)

    @staticmethod
    def stand_in(code: int, cuts: Sequence[float]) -> float:
        """A value in interval ``code`` (NaN: missing)."""
        if code < 0:
            return math.nan
        j, equal = divmod(code, 2)
        if equal:
            return cuts[j]
        if j == 0:
            return cuts[0] - max(1.0, abs(cuts[0]))
        if j == len(cuts):
            return cuts[-1] + max(1.0, abs(cuts[-1]))
        return (cuts[j - 1] + cuts[j]) / 2

    def prompt_stand_in(self, code: int) -> int | None:
        """A prompt size above exactly ``code`` of the cuts (-1: unknown)."""
        if code < 0:
            return None
        return 0 if code == 0 else self.prompt_tokens[code - 1] + 1


class RowSource:
    """The tenant's rows of the period, each its own group (statement versions 2 and 3,
    and the reference every other source is held to)."""

    def __init__(self, rows: StatementRows, tz: zoneinfo.ZoneInfo) -> None:
        self.rows = rows
        self.tz = tz

    @property
    def requests(self) -> int:
        return len(self.rows)

    @property
    def special(self) -> StatementRows:
        return self.rows

    @cached_property
    def end_ns(self) -> IntArray:
        return self.rows.ints("end_unix_ns")

    @cached_property
    def day(self) -> IntArray:
        return local_days(self.end_ns, self.tz)

    def counted(self, exempt: Sequence[int]) -> tuple[RecordColumns, IntArray, BoolArray]:
        kept = np.ones(len(self.rows), dtype=np.bool_)
        kept[list(exempt)] = False
        cols = RecordColumns.of_fields(self.rows.fields, self.rows.boundaries)
        return cols, np.ones(len(self.rows), dtype=np.int64), kept

    def percentiles(
        self, asked: Sequence[tuple[str, BoolArray]], percentile: float
    ) -> list[tuple[DayValue | None, list[DayValue]]]:
        return [self._percentiles(b, rows, percentile) for b, rows in asked]

    def _percentiles(
        self, boundary: str, rows: BoolArray, percentile: float
    ) -> tuple[DayValue | None, list[DayValue]]:
        column = self.rows.boundaries[:, BOUNDARIES.index(boundary)]
        at = np.flatnonzero(rows & ~np.isnan(column))
        if not len(at):
            return None, []
        values, days_of = column[at], self.day[at]
        by_day = _stable_order(days_of)
        bounds = np.flatnonzero(np.diff(days_of[by_day])) + 1
        days = [
            (int(days_of[g[0]]), _kth_smallest(values[g], percentile), len(g))
            for g in np.split(by_day, bounds)
        ]
        return (-1, _kth_smallest(values, percentile), len(at)), days

    def bad_rows(self, rows: BoolArray, from_ns: int, to_ns: int) -> StatementRows:
        end = self.end_ns
        return self.rows.take(np.flatnonzero(rows & (end >= from_ns) & (end <= to_ns)))

    def traffic(
        self, scopes: Sequence[str], models: list[str] | None, start_ms: int, end_ms: int
    ) -> dict[str, list[tuple[int, int]]]:
        return _traffic(
            self.rows.ints("ts_unix_ns"), self.end_ns, self.rows.fields["model"],
            scopes=scopes, models=models, start_ms=start_ms, end_ms=end_ms,
        )  # fmt: skip


def _of_tenant(rows: StatementRows, tenant: str, p_start: int, p_end: int) -> StatementRows:
    """The rows of ``tenant`` ending in ``[p_start, p_end)`` (all of them: themselves)."""
    end_ns = rows.ints("end_unix_ns")
    mine = (end_ns >= p_start) & (end_ns < p_end)
    mine &= Categorical.of(rows.fields["tenant"]).where(lambda v: v == tenant)
    return rows if bool(mine.all()) else rows.take(np.flatnonzero(mine))


@dataclass(frozen=True, slots=True)
class _Counted:
    """A source's groups judged: each bound SLO's verdicts (``classify_many``: masks
    counted and good; an exempted group is never counted) and each group's rows."""

    source: StatementSource
    weights: IntArray
    kept: BoolArray
    verdicts: Mapping[str, tuple[BoolArray, BoolArray]]

    @classmethod
    def of(
        cls, source: StatementSource, exempt: Sequence[int], contract: Contract, spec: SLOSpec
    ) -> _Counted:
        cols, weights, kept = source.counted(exempt)
        verdicts = {}
        for n in contract.slos:
            counted, good = SLOMatcher(spec.slo(n)).classify_many(cols)
            verdicts[n] = (counted & kept, good & kept)
        return cls(source, weights, kept, verdicts)

    def total(self, mask: BoolArray) -> int:
        """The rows of the groups in the mask."""
        return int(self.weights[mask].sum())


def _value(rows: StatementRows, boundary: str, row: int) -> float | None:
    """A row's value at a boundary (None when it has none)."""
    v = float(rows.boundaries[row, BOUNDARIES.index(boundary)])
    return None if math.isnan(v) else v


_EPOCH_ORDINAL: Final = dt.date(1970, 1, 1).toordinal()


def _offset_s(unix_s: int, tz: zoneinfo.ZoneInfo) -> int:
    off = dt.datetime.fromtimestamp(unix_s, tz=tz).utcoffset()
    assert off is not None
    return int(off.total_seconds())


# local_days looks up every hour of a span shorter than this (a billing period's), else
# only the hours of the times (found by sorting them).
_SPAN_HOURS: Final = 10_000


def local_days(end_ns: IntArray, tz: zoneinfo.ZoneInfo) -> IntArray:
    """Each time's calendar day in ``tz`` (what ``_day`` names), as days since
    1970-01-01: the zone's offset is looked up once per hour of the times (per time in an
    hour whose offset changes within it)."""
    unix_s = end_ns // 1_000_000_000
    hour = unix_s // 3600
    low = int(hour.min()) if len(hour) else 0
    if len(hour) and int(hour.max()) - low < _SPAN_HOURS:  # every hour of the span (no sort)
        hours, where = np.arange(low, int(hour.max()) + 1), hour - low
    else:
        hours, where = np.unique(hour, return_inverse=True)
    offsets = np.empty(len(hours), dtype=np.int64)
    steady = np.ones(len(hours), dtype=np.bool_)
    for j, h in enumerate(hours.tolist()):
        offsets[j] = _offset_s(h * 3600, tz)
        steady[j] = offsets[j] == _offset_s(h * 3600 + 3599, tz)
    off = offsets[where]
    for i in np.flatnonzero(~steady[where]).tolist():
        off[i] = _offset_s(int(unix_s[i]), tz)
    days: IntArray = (unix_s + off) // 86_400
    return days


def _stable_order(keys: IntArray) -> IntArray:
    """The indices that sort ``keys`` (stable); a radix sort when they span few values
    (the days of a period)."""
    span = keys - keys.min(initial=0)
    if len(keys) and int(span.max()) < 2**15:
        span = span.astype(np.int16)
    order: IntArray = np.argsort(span, kind="stable")
    return order


def _day_name(day: int) -> str:
    return dt.date.fromordinal(_EPOCH_ORDINAL + day).isoformat()


def _kth_smallest(values: FloatArray, percentile: float) -> float:
    """The nearest-rank percentile of ``values``: the ``ceil(p/100 * n)``-th smallest;
    ``values`` is not empty (and has no NaN)."""
    k = max(1, math.ceil(percentile / 100.0 * len(values)))
    return float(np.partition(values, k - 1)[k - 1])


def _slo_results(
    batch: _Counted, contract: Contract, spec: SLOSpec
) -> tuple[dict[str, SLOResult], dict[str, Percentiles], tuple[Breach, ...]]:
    """Per bound SLO: its counts, its boundary's percentiles (period, per day), and the
    days whose percentile is above its threshold (the breaches, by day then SLO). A
    percentile is the record's own value (the ``nearest_rank`` of the values)."""
    rule = contract.breach
    slos: dict[str, SLOResult] = {}
    percentiles: dict[str, Percentiles] = {}
    breaches: list[Breach] = []
    asked = [(spec.slo(n).boundary, batch.verdicts[n][0]) for n in contract.slos]
    values = batch.source.percentiles(asked, rule.percentile)
    for name, (whole, per_day) in zip(contract.slos, values, strict=True):
        slo = spec.slo(name)
        counted, good_mask = batch.verdicts[name]
        good, total = batch.total(good_mask), batch.total(counted)
        compliance = good / total if total else None
        slos[name] = SLOResult(
            boundary=slo.boundary,
            threshold_ms=slo.threshold_ms,
            objective=slo.objective,
            total=total,
            good=good,
            compliance=compliance,
            met=_met(compliance, slo.objective),
        )
        days: dict[str, DayPercentile] = {}
        for d, p, n in per_day:
            day = _day_name(d)
            days[day] = DayPercentile(p=p, n=n)
            if p > slo.threshold_ms:
                ratio = p / slo.threshold_ms
                breaches.append(
                    Breach(
                        slo=name,
                        boundary=slo.boundary,
                        day=day,
                        p_ms=p,
                        target_ms=slo.threshold_ms,
                        ratio=ratio,
                        severe=ratio > rule.severe_above,
                    )
                )
        percentiles[name] = Percentiles(
            boundary=slo.boundary,
            period=None if whole is None else whole[1],
            n=0 if whole is None else whole[2],
            days=days,
        )
    breaches.sort(key=lambda b: (b.day, b.slo))
    return slos, percentiles, tuple(breaches)


def _tiers(batch: _Counted, contract: Contract, spec: SLOSpec) -> dict[str, TierResult]:
    """The blended tiers of the spec whose primary and secondary the contract binds."""
    tiers: dict[str, TierResult] = {}
    for tname, tier in spec.tiers.items():
        if tier.primary not in contract.slos or tier.secondary not in contract.slos:
            continue
        counted, good = batch.verdicts[tier.primary]
        good_secondary = batch.verdicts[tier.secondary][1]
        total, good_p = batch.total(counted), batch.total(good)
        good_s = batch.total(counted & ~good & good_secondary)
        blended = (good_p + tier.secondary_weight * good_s) / total if total else None
        tiers[tname] = TierResult(
            primary=tier.primary,
            secondary=tier.secondary,
            secondary_weight=tier.secondary_weight,
            objective=tier.objective,
            total=total,
            good_primary=good_p,
            good_secondary_only=good_s,
            compliance=blended,
            met=_met(blended, tier.objective),
        )
    return tiers


_Exhaustion = tuple[BudgetEventRow, StatementRows]  # the event, the tenant's bad rows before it


def _exhaustions(
    budget_events: Sequence[BudgetEventRow],
    batch: _Counted,
    contract: Contract,
    *,
    tz: zoneinfo.ZoneInfo,
    p_start_ms: int,
    p_end_ms: int,
) -> tuple[list[_Exhaustion], tuple[NotThisTenant, ...]]:
    """The period's budget exhaustions of bound SLOs: the tenant's (with its bad records
    in the lookback before each), and those that are not."""
    terms = contract.budget_exhausted
    exhausted = sorted(
        (
            e
            for e in budget_events
            if e.event == "budget_exhausted"
            and e.slo in contract.slos
            and p_start_ms <= e.at_ms < p_end_ms
        ),
        key=lambda e: (e.at_ms, e.slo),
    )
    mine: list[_Exhaustion] = []
    not_mine: list[NotThisTenant] = []
    for e in exhausted:
        counted, good = batch.verdicts[e.slo]
        look_ms = (
            e.at_ms - p_start_ms  # since the period began
            if terms.lookback == "period"
            else parse_duration_ms(terms.lookback)
        )
        lo_ns, hi_ns = (e.at_ms - look_ms) * _NS_PER_MS, e.at_ms * _NS_PER_MS
        bad_rows = batch.source.bad_rows(counted & ~good, lo_ns, hi_ns)
        if len(bad_rows):
            mine.append((e, bad_rows))
        else:
            not_mine.append(
                NotThisTenant(
                    at=_iso(e.at_ms * _NS_PER_MS, tz),
                    at_ms=e.at_ms,
                    slo=e.slo,
                    why=f"no counted bad request of this tenant in the {terms.lookback} before it",
                )
            )
    return mine, tuple(not_mine)


def _pauses(
    mine: Sequence[_Exhaustion], contract: Contract, p_end_ms: int
) -> list[tuple[int, int]]:
    """The billing pauses the tenant's exhaustions open (merged)."""
    terms = contract.budget_exhausted
    pauses: list[tuple[int, int]] = []
    if terms.pause_billing:
        for e, _ in mine:
            end = (
                p_end_ms
                if terms.pause_for == "period"
                else min(p_end_ms, e.at_ms + parse_duration_ms(terms.pause_for))
            )
            pauses.append((e.at_ms, end))
    return _merge(pauses)


def _levels_and_credit(
    source: StatementSource,
    level_changes: Sequence[LevelChange],
    contract: Contract,
    tz: zoneinfo.ZoneInfo,
    *,
    pauses: list[tuple[int, int]],
    span_ms: tuple[int, int, int],
) -> tuple[Levels, Credit]:
    """The tenant's (and the service's) time at each level over ``[period start,
    observed until)``, and the credit they and the billing pauses give. ``span_ms``:
    (period start, observed until, period end)."""
    p_start_ms, until_ms, p_end_ms = span_ms
    traffic = source.traffic(
        sorted({c.scope for c in level_changes}), contract.models, p_start_ms, until_ms
    )
    timeline = _level_timeline(level_changes, contract.models, p_start_ms, until_ms, traffic)
    service = _level_timeline(level_changes, contract.models, p_start_ms, until_ms)
    period_ms = p_end_ms - p_start_ms
    ms_at = dict.fromkeys(range(4), 0)
    ms_service = dict.fromkeys(range(4), 0)
    ms_unpaused = dict.fromkeys(range(4), 0)
    for a, b, lvl, _scopes in timeline:
        ms_at[lvl] += b - a
        ms_unpaused[lvl] += (b - a) - _overlap_ms(a, b, pauses)
    for a, b, lvl, _scopes in service:
        ms_service[lvl] += b - a
    paused_ms = sum(b - a for a, b in pauses)
    credit_terms = []
    for lvl in (1, 2, 3):
        t = contract.level_terms(lvl)
        fee = t.fee_change_percent if t is not None else 0.0
        part = -fee * ms_unpaused[lvl] / period_ms
        credit_terms.append(CreditTerm(lvl, fee, ms_unpaused[lvl], part))
    levels = Levels(
        observed_until=_iso(until_ms * _NS_PER_MS, tz),
        rule=(
            f"a scope's level counts only in the {TRAFFIC_SLOT_MS // 1000} s slots in "
            "which this tenant had a request of the scope's models in flight"
        ),
        traffic_slot_ms=TRAFFIC_SLOT_MS,
        ms_at_level=ms_at,
        ms_at_level_service=ms_service,
        timeline=tuple(
            LevelInterval(
                from_=_iso(a * _NS_PER_MS, tz),
                to=_iso(b * _NS_PER_MS, tz),
                from_ms=a,
                to_ms=b,
                level=lvl,
                scopes=tuple(scopes),
                notify_customer=bool(
                    (t := contract.level_terms(lvl)) is not None and t.notify_customer
                ),
            )
            for a, b, lvl, scopes in timeline
            if lvl > 0
        ),
    )
    credit = Credit(
        period_ms=period_ms,
        paused_ms=paused_ms,
        paused_percent=100.0 * paused_ms / period_ms,
        levels=tuple(credit_terms),
        formula=(
            "100 * paused_ms / period_ms + sum_L(-fee_change_percent(L) * "
            "ms_at_L_outside_pauses / period_ms)"
        ),
    )
    return levels, credit


def _incidents(
    mine: Sequence[_Exhaustion],
    contract: Contract,
    spec: SLOSpec,
    tz: zoneinfo.ZoneInfo,
) -> tuple[Incident, ...]:
    """With ``incident_report``: each of the tenant's exhaustions, its bad records' queue
    share and the worst of them by the SLO's boundary."""
    terms = contract.budget_exhausted
    if not terms.incident_report:
        return ()
    incidents: list[Incident] = []
    for e, rows in mine:
        slo = spec.slo(e.slo)
        ids, attempts = rows.fields["request_id"], rows.fields["attempt"]
        hosts = rows.fields["engine_host"]
        queue = rows.boundaries[:, BOUNDARIES.index("queue_ms")].tolist()
        compute = rows.boundaries[:, BOUNDARIES.index("inference_ms")].tolist()
        # in row order, as Python floats (the same sums as record by record)
        both = [
            (x, y)
            for x, y in zip(queue, compute, strict=True)
            if not (math.isnan(x) or math.isnan(y))
        ]
        q = sum(x for x, _ in both)
        c = sum(y for _, y in both)
        rank = [
            _worst_first(v) for v in rows.boundaries[:, BOUNDARIES.index(slo.boundary)].tolist()
        ]
        order = sorted(range(len(rows)), key=lambda k: (rank[k], ids[k], attempts[k]))
        worst = order[: terms.worst_requests]
        incidents.append(
            Incident(
                at=_iso(e.at_ms * _NS_PER_MS, tz),
                at_ms=e.at_ms,
                slo=e.slo,
                boundary=slo.boundary,
                bad_requests=len(rows),
                queue_share=q / (q + c) if q + c > 0 else None,
                compute_share=c / (q + c) if q + c > 0 else None,
                worst=tuple(
                    WorstRequest(
                        request_id=ids[i],
                        attempt=int(attempts[i]),
                        value_ms=_value(rows, slo.boundary, i),
                        queue_ms=_value(rows, "queue_ms", i),
                        inference_ms=_value(rows, "inference_ms", i),
                        engine_host=hosts[i],
                        explain=f"tailguard explain {ids[i]}",
                    )
                    for i in worst
                ),
            )
        )
    return tuple(incidents)


def _worst_first(value: float) -> float:
    """An incident's order of its bad records: ``-(value or inf)`` (no value, NaN, and 0
    rank first)."""
    return -math.inf if math.isnan(value) or not value else -value


def _met(compliance: float | None, objective: float) -> bool | None:
    """An objective's verdict; None when nothing counted."""
    return None if compliance is None else compliance >= objective


def _credit_percent(credit: Credit) -> float:
    """The paused share, then each level's part, added in that order."""
    total = credit.paused_percent
    for term in credit.levels:
        total += term.credit_percent
    return total
