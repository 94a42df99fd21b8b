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
import itertools
import math
import zoneinfo
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import orjson

from pipeline.core.record import RequestRecord
from pipeline.core.slo import SLOMatcher
from pipeline.core.timefmt import iso_time
from pipeline.spec.contract import Contract, digest, period_bounds_ns
from pipeline.spec.durations import parse_duration_ms
from pipeline.spec.slo import SLOSpec

_NS_PER_MS: Final = 1_000_000
STATEMENT_VERSION: Final = 2
# A tenant "had traffic in a control scope" during a slot of this length in which one of
# its requests of the scope's models was in flight (the levels' rule, module docstring).
TRAFFIC_SLOT_MS: Final = 60_000
# Longer than this from start to end, a record's two clocks disagree: only its end counts.
_MAX_SPAN_MS: Final = 3_600_000
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


def records_digest(records: Sequence[RequestRecord]) -> str:
    """Digest of the records (in (request_id, attempt) order, every field)."""
    ordered = sorted(records, key=lambda r: (r.request_id, r.attempt))
    return digest(orjson.dumps([list(msgspec.structs.astuple(r)) for r in ordered]))


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


def _rid(r: RequestRecord) -> str:
    return r.request_id if r.attempt == 1 else f"{r.request_id}#{r.attempt}"


def _exemptions(
    records: Sequence[RequestRecord], contract: Contract, tz: zoneinfo.ZoneInfo
) -> tuple[dict[tuple[str, int], str], list[dict[str, Any]]]:
    """(request_id, attempt) -> reason for the exempted; and the cold starts seen."""
    reasons: dict[tuple[str, int], str] = {}
    windows = [(_ns_of(w.start), _ns_of(w.end), w.reason) for w in contract.exemptions.maintenance]
    for r in records:
        for start, end, why in windows:
            if start <= r.end_unix_ns < end:
                reasons[(r.request_id, r.attempt)] = f"maintenance: {why}"
                break
    starts: dict[tuple[int, str], list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.cold_start_unix_ns is not None:
            starts[(r.cold_start_unix_ns, r.engine_host or "")].append(r)
    cap = contract.exemptions.cold_starts
    per_day: dict[str, int] = defaultdict(int)
    cold: list[dict[str, Any]] = []
    for (at_ns, host), recs in sorted(starts.items()):
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
            for r in recs:
                key = (r.request_id, r.attempt)
                if key not in reasons:
                    reasons[key] = why
                    n_exempted += 1
        cold.append(
            {
                "engine_host": host,
                "started": _iso(at_ns, tz),
                "started_unix_ns": at_ns,
                "day": day,
                "nth_of_day": k,
                "requests": len(recs),
                "exempted": exempt,
                "exempted_requests": n_exempted,
            }
        )
    return reasons, cold


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
    record whose two times are more than ``_MAX_SPAN_MS`` apart (a clock off) marks only
    its end's slot. Merged, sorted intervals."""
    slots: dict[str, set[int]] = defaultdict(set)
    for r in records:
        b = r.end_unix_ns // _NS_PER_MS
        a = min(r.ts_unix_ns // _NS_PER_MS, b)
        if b - a > _MAX_SPAN_MS:
            a = b
        slots[r.model].update(range(a // slot_ms, b // slot_ms + 1))
    out: dict[str, list[tuple[int, int]]] = {}
    for scope in scopes:
        allowed = _scope_models(scope, models)
        ks: set[int] = set()
        for model, of_model in slots.items():
            if allowed is None or model in allowed:
                ks |= of_model
        merged: list[tuple[int, int]] = []
        for k in sorted(ks):
            a, b = max(start_ms, k * slot_ms), min(end_ms, (k + 1) * slot_ms)
            if a >= b:
                continue
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        out[scope] = merged
    return out


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
    records: Sequence[RequestRecord],
    level_changes: Sequence[LevelChange],
    budget_events: Sequence[BudgetEventRow],
    observed_until_ns: int | None,
    inputs: dict[str, Any],
) -> dict[str, Any]:
    """The statement as a JSON-ready dict (see the module docstring for every rule)."""
    if tenant not in contract.tenants:
        raise ValueError(f"tenant {tenant!r} is not covered by the contract")
    tz = zoneinfo.ZoneInfo(contract.billing.timezone)
    p_start, p_end = period_bounds_ns(period, contract.billing.timezone)
    recs = sorted(
        (r for r in records if r.tenant == tenant and p_start <= r.end_unix_ns < p_end),
        key=lambda r: (r.request_id, r.attempt),
    )
    reasons, cold = _exemptions(recs, contract, tz)
    counted = [r for r in recs if (r.request_id, r.attempt) not in reasons]

    rule = contract.breach
    slos: dict[str, Any] = {}
    percentiles: dict[str, Any] = {}
    breaches: list[dict[str, Any]] = []
    for name in contract.slos:
        slo = spec.slo(name)
        classify = SLOMatcher(slo).classify
        good = bad = 0
        values: list[float] = []
        by_day: dict[str, list[float]] = defaultdict(list)
        for r in counted:
            verdict = classify(r)
            if verdict == "skip":
                continue
            if verdict == "good":
                good += 1
            else:
                bad += 1
            v = r.boundary(slo.boundary)
            if v is not None:
                values.append(v)
                by_day[_day(r.end_unix_ns, tz)].append(v)
        total = good + bad
        compliance = good / total if total else None
        slos[name] = {
            "boundary": slo.boundary,
            "threshold_ms": slo.threshold_ms,
            "objective": slo.objective,
            "total": total,
            "good": good,
            "compliance": compliance,
            "met": None if compliance is None else compliance >= slo.objective,
        }
        days: dict[str, Any] = {}
        for day in sorted(by_day):
            p = nearest_rank(by_day[day], rule.percentile)
            assert p is not None
            days[day] = {"p": p, "n": len(by_day[day])}
            if p > slo.threshold_ms:
                ratio = p / slo.threshold_ms
                breaches.append(
                    {
                        "slo": name,
                        "boundary": slo.boundary,
                        "day": day,
                        "p_ms": p,
                        "target_ms": slo.threshold_ms,
                        "ratio": ratio,
                        "severe": ratio > rule.severe_above,
                    }
                )
        percentiles[name] = {
            "boundary": slo.boundary,
            "period": nearest_rank(values, rule.percentile),
            "n": len(values),
            "days": days,
        }
    breaches.sort(key=lambda b: (b["day"], b["slo"]))
    n_severe = sum(1 for b in breaches if b["severe"])

    # blended tiers of the spec whose primary and secondary the contract binds
    tiers: dict[str, Any] = {}
    for tname, tier in spec.tiers.items():
        if tier.primary not in contract.slos or tier.secondary not in contract.slos:
            continue
        prim, sec = SLOMatcher(spec.slo(tier.primary)), SLOMatcher(spec.slo(tier.secondary))
        total = good_p = good_s = 0
        for r in counted:
            vp = prim.classify(r)
            if vp == "skip":
                continue
            total += 1
            if vp == "good":
                good_p += 1
            elif sec.classify(r) == "good":
                good_s += 1
        blended = (good_p + tier.secondary_weight * good_s) / total if total else None
        tiers[tname] = {
            "primary": tier.primary,
            "secondary": tier.secondary,
            "secondary_weight": tier.secondary_weight,
            "objective": tier.objective,
            "total": total,
            "good_primary": good_p,
            "good_secondary_only": good_s,
            "compliance": blended,
            "met": None if blended is None else blended >= tier.objective,
        }

    # -- budget exhaustions: the tenant's (its bad requests before it) ----------------------
    p_start_ms, p_end_ms = p_start // _NS_PER_MS, p_end // _NS_PER_MS
    until_ms = p_end_ms
    if observed_until_ns is not None:
        until_ms = max(p_start_ms, min(p_end_ms, observed_until_ns // _NS_PER_MS + 1))
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
    mine: list[tuple[BudgetEventRow, list[RequestRecord]]] = []
    not_mine: list[dict[str, Any]] = []
    for e in exhausted:
        verdict_of = SLOMatcher(spec.slo(e.slo)).classify
        look_ms = (
            e.at_ms - p_start_ms  # since the period began
            if terms.lookback == "period"
            else parse_duration_ms(terms.lookback)
        )
        lo_ns, hi_ns = (e.at_ms - look_ms) * _NS_PER_MS, e.at_ms * _NS_PER_MS
        bad_recs = [
            r for r in counted if lo_ns <= r.end_unix_ns <= hi_ns and verdict_of(r) == "bad"
        ]
        if bad_recs:
            mine.append((e, bad_recs))
        else:
            not_mine.append(
                {
                    "at": _iso(e.at_ms * _NS_PER_MS, tz),
                    "at_ms": e.at_ms,
                    "slo": e.slo,
                    "why": f"no counted bad request of this tenant in the {terms.lookback} "
                    "before it",
                }
            )

    # -- levels, pauses, credit ------------------------------------------------------------
    pauses: list[tuple[int, int]] = []
    if terms.pause_billing:
        for e, _ in mine:
            end = (
                p_end_ms
                if terms.pause_for == "period"
                else min(p_end_ms, e.at_ms + parse_duration_ms(terms.pause_for))
            )
            pauses.append((e.at_ms, end))
    pauses = _merge(pauses)
    traffic = traffic_intervals(
        recs, sorted({c.scope for c in level_changes}), contract.models, p_start_ms, until_ms
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
    credit = 100.0 * paused_ms / period_ms
    for lvl in (1, 2, 3):
        t = contract.level_terms(lvl)
        fee = t.fee_change_percent if t is not None else 0.0
        part = -fee * ms_unpaused[lvl] / period_ms
        credit += part
        credit_terms.append(
            {
                "level": lvl,
                "fee_change_percent": fee,
                "ms": ms_unpaused[lvl],
                "credit_percent": part,
            }
        )

    # -- incidents ---------------------------------------------------------------------------
    incidents: list[dict[str, Any]] = []
    if terms.incident_report:
        for e, bad_recs in mine:
            slo = spec.slo(e.slo)
            both = [
                (r.queue_ms, r.inference_ms)
                for r in bad_recs
                if r.queue_ms is not None and r.inference_ms is not None
            ]
            q = sum(x for x, _ in both)
            c = sum(y for _, y in both)
            worst = sorted(
                bad_recs,
                key=lambda r: (-(r.boundary(slo.boundary) or math.inf), r.request_id, r.attempt),
            )[: terms.worst_requests]
            incidents.append(
                {
                    "at": _iso(e.at_ms * _NS_PER_MS, tz),
                    "at_ms": e.at_ms,
                    "slo": e.slo,
                    "boundary": slo.boundary,
                    "bad_requests": len(bad_recs),
                    "queue_share": q / (q + c) if q + c > 0 else None,
                    "compute_share": c / (q + c) if q + c > 0 else None,
                    "worst": [
                        {
                            "request_id": r.request_id,
                            "attempt": r.attempt,
                            "value_ms": r.boundary(slo.boundary),
                            "queue_ms": r.queue_ms,
                            "inference_ms": r.inference_ms,
                            "engine_host": r.engine_host,
                            "explain": f"tailguard explain {r.request_id}",
                        }
                        for r in worst
                    ],
                }
            )

    exempted: list[dict[str, Any]] = [
        {
            "request_id": r.request_id,
            "attempt": r.attempt,
            "reason": reasons[(r.request_id, r.attempt)],
        }
        for r in recs
        if (r.request_id, r.attempt) in reasons
    ]
    by_reason: dict[str, int] = defaultdict(int)
    for why in reasons.values():
        by_reason[why.split(":", 1)[0]] += 1
    return {
        "statement_version": STATEMENT_VERSION,
        "tenant": tenant,
        "period": period,
        "timezone": contract.billing.timezone,
        "period_start": _iso(p_start, tz),
        "period_end": _iso(p_end, tz),
        "requests": len(recs),
        "counted": len(counted),
        "slos": slos,
        "tiers": tiers,
        "percentiles": percentiles,
        "breaches": breaches,
        "breach_rule": {
            "percentile": rule.percentile,
            "per": rule.per,
            "severe_above": rule.severe_above,
            "max_breaches": rule.max_breaches,
            "breaches": len(breaches),
            "severe": n_severe,
            "within": len(breaches) <= rule.max_breaches and n_severe == 0,
        },
        "levels": {
            "observed_until": _iso(until_ms * _NS_PER_MS, tz),
            "rule": (
                f"a scope's level counts only in the {TRAFFIC_SLOT_MS // 1000} s slots in "
                "which this tenant had a request of the scope's models in flight"
            ),
            "traffic_slot_ms": TRAFFIC_SLOT_MS,
            "ms_at_level": {str(k): v for k, v in ms_at.items()},
            "ms_at_level_service": {str(k): v for k, v in ms_service.items()},
            "timeline": [
                {
                    "from": _iso(a * _NS_PER_MS, tz),
                    "to": _iso(b * _NS_PER_MS, tz),
                    "from_ms": a,
                    "to_ms": b,
                    "level": lvl,
                    "scopes": scopes,
                    "notify_customer": bool(
                        (t := contract.level_terms(lvl)) is not None and t.notify_customer
                    ),
                }
                for a, b, lvl, scopes in timeline
                if lvl > 0
            ],
        },
        "billing_pauses": [
            {
                "from": _iso(a * _NS_PER_MS, tz),
                "to": _iso(b * _NS_PER_MS, tz),
                "from_ms": a,
                "to_ms": b,
            }
            for a, b in pauses
        ],
        "credit": {
            "period_ms": period_ms,
            "paused_ms": paused_ms,
            "paused_percent": 100.0 * paused_ms / period_ms,
            "levels": credit_terms,
            "formula": (
                "100 * paused_ms / period_ms + sum_L(-fee_change_percent(L) * "
                "ms_at_L_outside_pauses / period_ms)"
            ),
        },
        "credit_percent": credit,
        "cold_starts": cold,
        "exempted": exempted,
        "exempted_by_reason": dict(sorted(by_reason.items())),
        "incidents": incidents,
        "budget_exhausted_not_this_tenant": not_mine,
        "inputs": inputs,
    }
