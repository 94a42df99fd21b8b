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
* **Levels and credit.** The service's level at an instant is the highest level of
  the covered control scopes (each scope holds the level of its latest audit row by
  event time; before its first row a scope is at 0). Time is counted over
  [period start, min(period end, observed_until)], ``observed_until`` being the
  latest event time the store holds for the period (requests of any tenant, audit
  rows). Billing pauses (below) take precedence. With T = the period's length::

      credit_percent = 100 * paused_ms / T
                     + sum over levels L of (-fee_change_percent(L)) * ms_at_L_unpaused / T

* **Budget exhaustion.** Each ``budget_exhausted`` event of a bound SLO in the period
  opens a billing pause (``pause_for``: a duration or until the period ends;
  overlapping pauses merge) and, with ``incident_report``, an incident: the SLO, its
  boundary, the tenant's bad records for it in the ``lookback`` before, their queue
  share (sum queue_ms / sum (queue_ms + inference_ms) over those with both) and the
  worst of them by the boundary's value.
"""

from __future__ import annotations

import datetime as dt
import math
import zoneinfo
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import orjson

from pipeline.core.durations import parse_duration_ms
from pipeline.core.record import RequestRecord
from pipeline.core.slo import SLOMatcher
from pipeline.core.timefmt import iso_time
from pipeline.spec.contract import Contract, digest, period_bounds_ns
from pipeline.spec.slo import SLOSpec

_NS_PER_MS: Final = 1_000_000
STATEMENT_VERSION: Final = 1


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


def _level_timeline(
    changes: Sequence[LevelChange], models: list[str] | None, start_ms: int, end_ms: int
) -> list[tuple[int, int, int, list[str]]]:
    """[(from_ms, to_ms, level, scopes at that level)] covering [start_ms, end_ms): one
    sweep over the changes in (event time, seq) order."""
    ordered = sorted(
        (c for c in changes if models is None or c.scope in models or c.scope == "*"),
        key=lambda c: (c.at_ms, c.seq, c.scope),
    )
    current: dict[str, int] = {}
    i = 0
    while i < len(ordered) and ordered[i].at_ms <= start_ms:
        current[ordered[i].scope] = ordered[i].level
        i += 1
    out: list[tuple[int, int, int, list[str]]] = []
    t = start_ms
    while t < end_ms:
        nxt = ordered[i].at_ms if i < len(ordered) and ordered[i].at_ms < end_ms else end_ms
        level = max(current.values(), default=0)
        scopes = sorted(s for s, lv in current.items() if lv == level) if level > 0 else []
        if out and out[-1][2] == level and out[-1][3] == scopes and out[-1][1] == t:
            out[-1] = (out[-1][0], nxt, level, scopes)
        else:
            out.append((t, nxt, level, scopes))
        while i < len(ordered) and ordered[i].at_ms == nxt:
            current[ordered[i].scope] = ordered[i].level
            i += 1
        t = nxt
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

    # -- levels, pauses, credit ------------------------------------------------------------
    p_start_ms, p_end_ms = p_start // _NS_PER_MS, p_end // _NS_PER_MS
    until_ms = p_end_ms
    if observed_until_ns is not None:
        until_ms = max(p_start_ms, min(p_end_ms, observed_until_ns // _NS_PER_MS + 1))
    exhausted = sorted(
        (e for e in budget_events if e.event == "budget_exhausted" and e.slo in contract.slos),
        key=lambda e: (e.at_ms, e.slo),
    )
    exhausted = [e for e in exhausted if p_start_ms <= e.at_ms < p_end_ms]
    terms = contract.budget_exhausted
    pauses: list[tuple[int, int]] = []
    if terms.pause_billing:
        for e in exhausted:
            end = (
                p_end_ms
                if terms.pause_for == "period"
                else min(p_end_ms, e.at_ms + parse_duration_ms(terms.pause_for))
            )
            pauses.append((e.at_ms, end))
    pauses = _merge(pauses)
    timeline = _level_timeline(level_changes, contract.models, p_start_ms, until_ms)
    period_ms = p_end_ms - p_start_ms
    ms_at = dict.fromkeys(range(4), 0)
    ms_unpaused = dict.fromkeys(range(4), 0)
    for a, b, lvl, _scopes in timeline:
        ms_at[lvl] += b - a
        ms_unpaused[lvl] += (b - a) - _overlap_ms(a, b, pauses)
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
        for e in exhausted:
            slo = spec.slo(e.slo)
            verdict_of = SLOMatcher(slo).classify
            look_ms = (
                e.at_ms - p_start_ms  # since the period began
                if terms.lookback == "period"
                else parse_duration_ms(terms.lookback)
            )
            lo_ns = (e.at_ms - look_ms) * _NS_PER_MS
            hi_ns = e.at_ms * _NS_PER_MS
            bad_recs = [
                r for r in counted if lo_ns <= r.end_unix_ns <= hi_ns and verdict_of(r) == "bad"
            ]
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
            "ms_at_level": {str(k): v for k, v in ms_at.items()},
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
        "inputs": inputs,
    }
