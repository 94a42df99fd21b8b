"""The SLO report read back from ClickHouse (the demo prints it).

What the windows answer is read from them (issue 53: a report over 30 days reads the
hourly rollups, not 50 M requests): the SLO counts, and each boundary's count, P50 and
P99 -- quantiles of the merged latency sketches (1 % relative error, as the stream and
the dashboards compute them), not of the sorted values; the counts per source and
outcome, the control modes, the bad requests' queueing time and the clock pairs (their
offsets' median, to 0.1 ms) from the windows' own counts of them
(``sql/0018``, ``requests.range_summary``). ``requests`` is read for what no window
holds: the part of a range the windows do not cover (``pipeline.core.cover``: a cut base
window at either end, what ended after the windows closed so far, windows written before
the counts were kept, and all of traffic selected by more than a model, ``--slo``). The
per-logical-request section reads the retried requests' attempts
(``requests.logical_rows``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pipeline.adapters.queries import budget, control, counts, requests, windows
from pipeline.adapters.queries.filters import ReportFilter
from pipeline.adapters.queries.filters import iso as _iso
from pipeline.adapters.store import Store, record_from_row
from pipeline.app.figures import figure, percent
from pipeline.contract.boundaries import BOUNDARIES, QUEUE_BOUNDARIES
from pipeline.core.budget import period_at, scope_expected_requests, window_budget
from pipeline.core.cover import Cover, cover, cover_from
from pipeline.core.logical import SERVED, logical_requests
from pipeline.core.logical import counts as logical_counts
from pipeline.core.slo import SLOCounts, SLOEvaluator, compliance_report
from pipeline.core.slo_windows import covers_model, minute_rows
from pipeline.spec.slo import SLOSpec

Row = tuple[Any, ...]

QUANTILES = (0.5, 0.99)
# What the boundaries' P50 and P99 are (the report says so, text and --json).
QUANTILE_BASIS = "of the merged latency sketches, within 1 % of the exact value"
# The controller's rule (ControllerConfig.load_share): from this share of the bad
# requests' time spent queued, a burn is load-caused.
LOAD_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class BoundaryStats:
    count: int
    p50: float | None
    p99: float | None


BURN_WINDOWS_MIN = (5, 60)  # burn rates over the last 5 minutes and the last hour of the data


@dataclass(frozen=True, slots=True)
class Report:
    requests: int
    by_source: dict[str, int]
    by_outcome: dict[str, int]
    boundaries: dict[str, BoundaryStats]
    # from the stream's closed windows (slo_1m), worst first: per SLO kind, objective,
    # total, good, compliance, met, budget (bad, allowed, remaining) and burn rates
    slos: dict[str, dict[str, Any]]
    control: list[dict[str, Any]]  # directives issued (not heartbeats), from control_signals
    # per gateway -> engine host pair: joined requests and the engine clock's offset from
    # the gateway's (NTP-style estimate, pipeline/core/skew.py), P50 in ms
    clock_skew: dict[str, dict[str, Any]] = field(default_factory=dict)
    # requests that ended after the last closed window: not in any SLO total yet
    open_windows: dict[str, Any] = field(default_factory=dict)
    budget_events: list[dict[str, Any]] = field(default_factory=list)
    filters: ReportFilter = field(default_factory=ReportFilter)
    # per model and priority, what the gateways' enforcement said (control_verdicts);
    # empty when no request carried a control mode (the section is then left out)
    control_verdicts: list[dict[str, Any]] = field(default_factory=list)
    # per logical request (a request and its retries once: read_logical), exact over the
    # stored rows; beside the per-attempt figures above
    logical: dict[str, Any] = field(default_factory=dict)
    # what each part of the report was read from (report_sources)
    sources: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_source": self.by_source,
            "by_outcome": self.by_outcome,
            "boundaries": {
                k: {"count": v.count, "p50": v.p50, "p99": v.p99}
                for k, v in self.boundaries.items()
            },
            "slos": self.slos,
            "open_windows": self.open_windows,
            "control": self.control,
            "budget_events": self.budget_events,
            "clock_skew": self.clock_skew,
            "filters": self.filters.to_json(),
            "logical": self.logical,
            "sources": self.sources,
        } | ({"control_verdicts": self.control_verdicts} if self.control_verdicts else {})


def exact_quantile(sorted_values: list[float], q: float) -> float:
    """ClickHouse ``quantileExact`` semantics: element ``floor(q * n)`` (clamped)."""
    n = len(sorted_values)
    return sorted_values[min(int(q * n), n - 1)]


def _budget_cell(slo: dict[str, Any]) -> str:
    """``92.5% (30d*)``: left of the SLO window's budget, the window, * when projected."""
    cell = percent(slo.get("budget_remaining"))
    window = slo.get("budget_window")
    if window is None or slo.get("budget_remaining") is None:
        return cell
    mark = "*" if slo.get("budget_basis") == "projected" else ""
    return f"{cell} ({window}{mark})"


def _badness(slo: dict[str, Any]) -> tuple[Any, ...]:
    """Worst first: not met, then least budget left, then lowest compliance vs objective."""
    remaining = slo.get("budget_remaining")
    comp = slo["compliance"]
    return (
        0 if slo["met"] is False else (1 if slo["met"] is True else 2),
        remaining if remaining is not None else float("inf"),
        (comp - slo["objective"]) if comp is not None else float("inf"),
    )


def with_selection(f: ReportFilter, spec: SLOSpec | None) -> ReportFilter:
    """The filter with the named SLOs' definitions (a blended tier: its primary's), so
    that the request tables keep the traffic they select and the control directives the
    scopes of their models. Unchanged without a spec, or when a name is not in it (its
    windows may be from an older spec: the request tables stay whole)."""
    if spec is None or not f.slos or f.selects:
        return f
    known = {s.name for s in spec.slos}
    names = [spec.tiers[n].primary if n in spec.tiers else n for n in f.slos]
    if not all(n in known for n in names):
        return f
    return dataclasses.replace(f, selects=tuple(spec.slo(n) for n in dict.fromkeys(names)))


def slo_minute_rows(
    store: Store, f: ReportFilter, spec: SLOSpec | None, *, fold: bool = False
) -> list[Row]:
    """``(slo, kind, start s, objective, secondary_weight, total, good,
    good_secondary_only)`` per SLO, kind and minute of the filter, as ``slo_1m`` holds
    them (``fold``: the minutes before the last hour of them folded into one row per SLO
    and kind, :func:`~pipeline.adapters.queries.budget.folded_counts`: what sums and
    burn rates need). SLO windows are per SLO, not per model: with a model (and the
    ``spec`` the windows were counted with) they are recounted exactly over that model's
    stored requests in the closed windows, by the stream's own evaluator, and SLOs that
    do not select the model are left out."""
    if f.model is None or spec is None:
        if fold:
            return budget.folded_counts(store, f, max(BURN_WINDOWS_MIN) * 60)
        return budget.minute_counts(store, f)
    last_ms = budget.last_window_end_ms(store)
    records = [record_from_row(r) for r in requests.filter_rows(store, f, last_ms)]
    out: list[Row] = []
    for t_ms, row in minute_rows(records, spec):
        if f.slos and row.slo not in f.slos:
            continue
        if not covers_model(spec, row.slo, f.model):
            continue
        out.append(
            (row.slo, row.kind, t_ms // 1000, row.objective, row.secondary_weight,
             row.total, row.good, row.good_secondary_only)
        )  # fmt: skip
    out.sort(key=lambda r: (r[0], r[1], r[2]))
    return out


def slo_events(store: Store, f: ReportFilter, spec: SLOSpec | None, order: str) -> list[Row]:
    """``(event_time, slo, event)`` of the filter's budget events; with a model (and the
    spec), only those of SLOs that select it."""
    rows = budget.events_in(store, f, order=order)
    if f.model is None or spec is None:
        return rows
    return [r for r in rows if covers_model(spec, str(r[1]), f.model)]


def read_slos(
    store: Store, f: ReportFilter, spec: SLOSpec | None = None
) -> dict[str, dict[str, Any]]:
    """Per SLO over the filter's windows: compliance, budget and burn rates, worst first."""
    rows = slo_minute_rows(store, f, spec, fold=True)
    end_s = max((float(r[2]) + 60 for r in rows), default=0.0)
    acc: dict[tuple[str, str], dict[str, Any]] = {}
    for name, kind, t, objective, weight, total, good, secondary in rows:
        a = acc.setdefault(
            (str(name), str(kind)),
            {"objective": float(objective), "total": 0, "good": 0, "good_w": 0.0,
             "burn": {m: [0.0, 0.0] for m in BURN_WINDOWS_MIN}},
        )  # fmt: skip
        good_w = float(good) + float(weight) * float(secondary) if kind == "blended" else good
        a["total"] += int(total)
        a["good"] += int(good)
        a["good_w"] += float(good_w)
        for m in BURN_WINDOWS_MIN:
            if float(t) >= end_s - m * 60:
                a["burn"][m][0] += float(total) - float(good_w)
                a["burn"][m][1] += float(total)
    slos: dict[str, dict[str, Any]] = {}
    for (name, kind), a in sorted(acc.items(), key=lambda kv: (kv[0][1] != "slo", kv[0][0])):
        total, objective = a["total"], a["objective"]
        compliance = a["good_w"] / total if total else None
        bad = total - a["good_w"]
        allowed = (1.0 - objective) * total
        burn = {
            f"{m}m" if m < 60 else f"{m // 60}h": (
                (b / n) / (1.0 - objective) if n and objective < 1 else None
            )
            for m, (b, n) in a["burn"].items()
        }
        slos[name] = {
            "kind": kind,
            "objective": objective,
            "total": int(total),
            "good": int(a["good"]),
            "compliance": compliance,
            "met": None if compliance is None else compliance >= objective,
            "budget_bad": bad,
            "budget_allowed": allowed,
            "budget_remaining": (1.0 - bad / allowed) if allowed > 0 else None,
            "budget_basis": "range",  # without the spec: over the range shown
            "budget_window": None,
            "burn_rate": burn,
        }
    if spec is not None and rows:
        _window_budgets(store, f, spec, slos, end_s)
    return dict(sorted(slos.items(), key=lambda kv: _badness(kv[1])))


def _window_budgets(
    store: Store, f: ReportFilter, spec: SLOSpec, slos: dict[str, dict[str, Any]], end_s: float
) -> None:
    """Each SLO's budget over its own window (30 days, the calendar month, ...) at the end
    of the last minute the report shows, not over the report's range: the counts of that
    window so far, and the allowance the controller uses (projected over the whole window
    until a whole window is seen: ``pipeline.core.budget.window_budget``, docs/budgets.md).
    Without this, one
    hour of a fresh store against a 30-day objective read "-5,426 % left"."""
    end_ms = int(1000 * end_s)  # the end of the last minute shown (as the charts)
    windows = {}
    for name in slos:
        slo_name = spec.tiers[name].primary if name in spec.tiers else name
        if slo_name in {x.name for x in spec.slos}:
            windows[name] = spec.slo(slo_name)
    if not windows:
        return
    # per start of a window (rolling 30 d, the calendar month, ...): its SLOs' minutes
    # from there, folded (slo_minute_rows); a model's, recounted once from the first
    starts = sorted({period_at(w.window, end_ms)[0] for w in windows.values()})
    if f.model is not None:
        starts = starts[:1]
    per: dict[tuple[int, str, str], list[tuple[int, float, float]]] = {}
    for start_ms in starts:
        period = dataclasses.replace(f, since_unix_s=start_ms / 1000, until_unix_s=end_ms / 1000)
        for name, kind, t, _o, weight, total, good, secondary in slo_minute_rows(
            store, period, spec, fold=True
        ):
            good_w = float(good) + float(weight) * float(secondary) if kind == "blended" else good
            per.setdefault((start_ms, str(name), str(kind)), []).append(
                (int(t) * 1000, float(total), float(total) - float(good_w))
            )
    for name, slo in windows.items():
        row = slos[name]
        p_start, _ = period_at(slo.window, end_ms)
        read_from = max(start for start in starts if start <= p_start)
        mine = [m for m in per.get((read_from, name, row["kind"]), []) if m[0] >= p_start]
        total = int(sum(m[1] for m in mine))
        bad = sum(m[2] for m in mine)
        first = min((m[0] for m in mine), default=end_ms)
        left, allowance = window_budget(
            row["objective"], slo.window, total=total, bad=bad, first_ms=first, now_ms=end_ms,
            expected_requests=scope_expected_requests(slo.expected_requests, f.model or "*")
            if name == slo.name
            else None,
        )  # fmt: skip
        row["budget_bad"] = bad
        row["budget_allowed"] = None if allowance is None else allowance.allowed
        row["budget_remaining"] = left
        row["budget_basis"] = None if allowance is None else allowance.basis
        row["budget_window"] = slo.window.rolling or slo.window.calendar


def open_windows(last_ms: int, requests_after: int) -> dict[str, Any]:
    """Requests that ended after the end of the last closed window (``last_ms``): their
    windows are still open (within the grace period), so no SLO total counts them yet."""
    return {
        "last_closed_window_end": _iso(last_ms / 1000) if last_ms else None,
        "requests_after": requests_after,
    }


def control_verdicts(rows: list[Row]) -> list[dict[str, Any]]:
    """Per model and priority, from ``(model, priority, mode, verdict, count)`` rows of the
    requests that carried a control mode (:func:`pipeline.adapters.queries.requests.
    control_counts`): the requests per mode; those the enforcement refused (enforce, by
    reason), those it would have refused (shadow, by reason: they were served); and how
    many were served (every request with a mode but those refused)."""
    acc: dict[tuple[str, int | None], dict[str, Any]] = {}
    for model, priority, mode, verdict, n in rows:
        key = (str(model), None if priority is None else int(priority))
        a = acc.setdefault(key, {
            "model": key[0], "priority": key[1], "modes": {}, "requests": 0, "served": 0,
            "would_refuse": {}, "refused": {},
        })  # fmt: skip
        a["modes"][mode] = a["modes"].get(mode, 0) + int(n)
        a["requests"] += int(n)
        if verdict is None or mode == "shadow":
            a["served"] += int(n)
        if verdict is not None:
            by = a["refused" if mode == "enforce" else "would_refuse"]
            by[verdict] = by.get(verdict, 0) + int(n)
    return [acc[k] for k in sorted(acc, key=lambda k: (k[0], k[1] is None, k[1] or 0))]


def _in_spans(t_ns: int, spans: tuple[tuple[int, int], ...]) -> bool:
    return any(a <= t_ns < b for a, b in spans)


def read_logical(
    store: Store,
    f: ReportFilter,
    spec: SLOSpec | None,
    summary: requests.RangeSummary | None = None,
    slo_cover: Cover | None = None,
) -> dict[str, Any]:
    """Per logical request (:mod:`pipeline.core.logical`, the backtest's rule): the logical
    requests whose final attempt ended in the filter's range (and is of its model), each
    once, by its final attempt's outcome and the latency the client saw; the requests
    never served; each SLO of the spec recounted over them. Exact: every attempt of each
    logical request that may have several is read, wherever it ended, and grouped by the
    core's rule. The others (one attempt: the attempt is the logical request, its SLO
    verdicts the attempt's) are the range's requests (``summary``) less those attempts;
    their SLO counts are the windows' over ``slo_cover``'s window parts less those
    attempts' (the core's evaluator, as the stream counted them), plus, over its
    ``rest``, those the engine counts by the core's rules as SQL
    (``single_attempt_counts``). ``summary`` and ``slo_cover``: as ``read_report`` read
    them (None: read here)."""
    if summary is None:
        summary = requests.range_summary(
            store, f, split_slos=(), ended_from_ms=0, cover=counts_cover(store, f, 0)
        )
    if slo_cover is None:
        slo_cover = covers(store, f)[1]
    records = [record_from_row(r) for r in requests.logical_rows(store, f)]
    lo = None if f.since_unix_s is None else int(f.since_unix_s * 1e9)
    hi = None if f.until_unix_s is None else int(f.until_unix_s * 1e9)
    kept = [
        lr
        for lr in logical_requests(records)
        if (lo is None or lr.record.end_unix_ns >= lo)
        and (hi is None or lr.record.end_unix_ns < hi)
        and (f.model is None or lr.record.model == f.model)
    ]
    out = logical_counts(None, kept)
    slos = spec.slos if spec is not None else ()
    rest_all, rest_failed, n, never, *verdicts = requests.single_attempt_counts(
        store, f, slos, slo_cover.rest
    )
    if slo_cover.windowed:  # (no model, no selection: the attempts in the window parts)
        parts = (*slo_cover.hours, *slo_cover.minutes, *slo_cover.windows)
        chained = [r for r in records if _in_spans(r.end_unix_ns, parts)]
        failed = sum(v for k, v in summary.by_outcome.items() if k not in SERVED)
        n += summary.requests - int(rest_all) - len(chained)
        never += failed - int(rest_failed) - sum(r.outcome not in SERVED for r in chained)
        if spec is not None:
            ev = SLOEvaluator(spec)
            ev.add_many(chained)
            theirs = ev.counts()
            counted = budget.cover_counts(store, slo_cover)
            for i, s in enumerate(slos):
                total, good = counted.get(s.name, (0, 0))
                verdicts[2 * i] += total - theirs[s.name].total
                verdicts[2 * i + 1] += good - theirs[s.name].good
    out["attempts"] += int(n)
    out["requests"] += int(n)
    out["never_served"] += int(never)
    if spec is not None:
        ev = SLOEvaluator(spec)
        ev.add_many(lr.record for lr in kept)
        counts = ev.counts()
        for i, s in enumerate(spec.slos):
            one = SLOCounts(int(verdicts[2 * i]), int(verdicts[2 * i + 1]))
            counts[s.name] = counts[s.name].merge(one)
        out["slos"] = compliance_report(spec, counts, ev.blended_counts())["slos"]
    if f.slos:
        out["slos"] = {k: v for k, v in out["slos"].items() if k in f.slos}
    return out


def load_cause(split: tuple[int, float, float], queue_inclusive: bool) -> dict[str, Any]:
    """Why an SLO's bad requests were slow: their queue share and a sentence (the same rule
    as the controller's: >= 50 % of the bad requests' time queued is load-caused)."""
    n, queue_ms, bad_ms = split
    if not queue_inclusive:
        text = "not load-caused: its boundary excludes the queue" if n else None
        return {"bad_measured": n, "bad_queue_share": 0.0 if n else None, "load": text}
    share = queue_ms / bad_ms if bad_ms > 0 else None
    if share is None:
        text = None
    elif share >= LOAD_SHARE:
        text = f"load-caused: {100 * share:.0f} % of the bad requests' time was queueing"
    else:
        text = (
            f"not load-caused: {100 * (1 - share):.0f} % of the bad requests' time was "
            "compute (prefill + decode): shedding would not help"
        )
    return {"bad_measured": n, "bad_queue_share": share, "load": text}


def covers(store: Store, f: ReportFilter) -> tuple[Cover, Cover]:
    """The filter's range split by what answers each part (``pipeline.core.cover``): for
    the latency figures (the windows' keys hold a model, not the traffic ``--slo``
    selects) and for the SLO counts (the SLO windows are of all traffic)."""
    closed_ns, window_ms = windows.closed_through(store)
    since = None if f.since_unix_s is None else int(f.since_unix_s * 1e9)
    until = None if f.until_unix_s is None else int(f.until_unix_s * 1e9)

    def of(windowed: bool) -> Cover:
        return cover(
            since, until, closed_ns=closed_ns, window_ns=max(window_ms, 1) * 1_000_000,
            windowed=windowed and window_ms > 0,
        )  # fmt: skip

    return of(not f.selects), of(not f.selects and f.model is None)


def counts_cover(store: Store, f: ReportFilter, last_ms: int) -> Cover:
    """The filter's range split for ``requests.range_summary``: the windows' counts
    (per model: not for traffic ``--slo`` selects) from where the windows kept them
    (``counts.counted_from_ns``) up to the end of the last closed SLO window
    (``last_ms``, when there is one: none of their requests ended after it, the
    ``open_windows`` count), the rest from ``requests``."""
    closed_ns, window_ms = windows.closed_through(store)
    if last_ms > 0:
        closed_ns = min(closed_ns, last_ms * 1_000_000)
    return cover_from(
        None if f.since_unix_s is None else int(f.since_unix_s * 1e9),
        None if f.until_unix_s is None else int(f.until_unix_s * 1e9),
        from_ns=counts.counted_from_ns(store) if window_ms > 0 else 0,
        closed_ns=closed_ns, window_ns=max(window_ms, 1) * 1_000_000,
        windowed=not f.selects and window_ms > 0,
    )  # fmt: skip


def read_boundaries(
    store: Store, f: ReportFilter, latency: Cover
) -> tuple[dict[str, BoundaryStats], int]:
    """Per boundary: the count, P50 and P99 of the filter's requests, from the windows'
    sketches over the cover's window parts merged with a sketch of the values in its
    rest (the stream's own sketch: :data:`QUANTILE_BASIS`); and how many requests that
    counts (the windows' and the rest's: the range's requests, unless the store's windows
    fall short of its requests)."""
    sketches, counted = windows.cover_sketches(store, latency, BOUNDARIES, f.model)
    if latency.rest:
        rows = requests.boundary_values(store, f, latency.rest, BOUNDARIES)
        counted += len(rows)
        for i, b in enumerate(BOUNDARIES):
            values = [float(r[i]) for r in rows if r[i] is not None]
            if values:
                sketches[b].add_many(values)
    out = {}
    for b in BOUNDARIES:
        sk = sketches[b]
        p50, p99 = (sk.quantile(q) for q in QUANTILES)
        out[b] = BoundaryStats(sk.count, p50, p99)
    return out, counted


def windows_short_hint(report: Report) -> str | None:
    """A line when the windows counted fewer (or more) of the range's requests than
    ``requests`` holds (a store whose windows are not all written, or drifted:
    ``tools/store-check``): the boundaries then are of what the windows counted."""
    counted = report.sources.get("boundaries_counted")
    if counted is None or counted == report.requests:
        return None
    return (
        f"the windows and the rest read from requests count {counted:,} of the "
        f"{report.requests:,} requests in range: the boundaries' counts and P50 / P99 are "
        "of those (windows not written for part of the range, or drifted: run "
        "store-check)"
    )


def report_sources(
    latency: Cover, slo_cover: Cover, counted: int, counts_part: Cover, skew_basis: str
) -> dict[str, Any]:
    """What the report's figures were read from, for ``--json`` (and the text's note)."""

    def spans(c: Cover) -> dict[str, Any]:
        return {
            "windows": [[_iso(a / 1e9), _iso(b / 1e9)]
                        for a, b in (*c.hours, *c.minutes, *c.windows)],
            "requests": [[None if a is None else _iso(a / 1e9),
                          None if b is None else _iso(b / 1e9)] for a, b in c.rest],
        }  # fmt: skip

    return {
        "quantiles": QUANTILE_BASIS,
        "boundaries_counted": counted,  # requests the boundaries' figures are of
        "latency": spans(latency),
        "logical_slo_counts": spans(slo_cover),
        # requests, by_source, by_outcome, clock_skew, control_verdicts, load cause and
        # open_windows: the windows' counts, and requests over the rest
        "counts": spans(counts_part),
        "clock_skew": skew_basis,
    }  # fmt: skip


def read_report(store: Store, f: ReportFilter | None = None, spec: SLOSpec | None = None) -> Report:
    """The report of the store under the filter; with the SLO ``spec`` the stored windows
    were counted with, each SLO also says how much of its bad requests' time was queueing
    (exact over ``requests``: is its burn load-caused?)."""
    f = with_selection(f or ReportFilter(), spec)
    slos = read_slos(store, f, spec)
    shown = [slo for slo in spec.slos if slo.name in slos] if spec is not None else []
    last_ms = budget.last_window_end_ms(store)
    latency, slo_cover = covers(store, f)
    counts_part = counts_cover(store, f, last_ms)
    summary = requests.range_summary(
        store, f, split_slos=shown, ended_from_ms=last_ms, cover=counts_part
    )
    for slo, split in zip(shown, summary.bad_splits, strict=True):
        slos[slo.name].update(load_cause(split, slo.boundary in QUEUE_BOUNDARIES))
    control_rows = [
        {"scope": scope, "seq": int(seq), "level": int(level), "phase": phase,
         "event_time": str(t), "reason": reason}
        for scope, seq, level, phase, t, reason in control.directives(store, f)
    ]  # fmt: skip
    budget_events = [
        {"event_time": str(t), "slo": str(slo), "event": str(ev)}
        for t, slo, ev in slo_events(store, f, spec, "event_time, slo")
    ]
    # The skew estimate of pipeline.core.skew over the stored joined requests (reported,
    # never used to correct a measurement).
    clock_skew = {
        f"{g}->{e}": {"samples": int(n), "offset_p50_ms": float(p50)}
        for g, e, n, p50 in summary.clock_skew
    }
    boundaries, counted = read_boundaries(store, f, latency)
    return Report(
        summary.requests, summary.by_source, summary.by_outcome, boundaries, slos,
        control_rows, clock_skew, open_windows(last_ms, summary.ended_from), budget_events, f,
        control_verdicts(list(summary.control)),
        read_logical(store, f, spec, summary, slo_cover),
        report_sources(latency, slo_cover, counted, counts_part, summary.skew_basis),
    )  # fmt: skip


_burn = partial(figure, spec=".2f", unit="x")


def describe_filter(f: ReportFilter) -> str | None:
    """``since ...; model ...`` for a report's title, or None when unfiltered."""
    parts = [
        x
        for x in (
            f.since_unix_s is not None and f"since {_iso(f.since_unix_s)}",
            f.until_unix_s is not None and f"until {_iso(f.until_unix_s)}",
            f.model is not None and f"model {f.model}",
            bool(f.slos)
            and f"SLOs {', '.join(f.slos)}"
            + (" (the requests and control scopes they select)" if f.selects else ""),
        )
        if x
    ]
    return "; ".join(str(x) for x in parts) or None


def open_windows_hint(report: Report) -> str | None:
    ow = report.open_windows
    if not ow.get("requests_after"):
        return None
    last = ow.get("last_closed_window_end") or "none yet"
    return (
        f"{ow['requests_after']} of {report.requests} requests ended after the last closed "
        f"window (ending {last}): their windows are still open, so the SLO totals do not "
        "count them yet (they close once event time passes their end plus the grace "
        "period, TAILGUARD_WINDOW_GRACE_MS); run the report again later for them."
    )


def render(report: Report) -> Any:
    """A rich renderable. Names and figures never wrap nor are cut (print it with
    :func:`print_wide`); only the directives' reasons fold onto more lines."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def table(
        title: str,
        head: list[str],
        rows: list[list[str]],
        *,
        fold_last: bool = False,
        styles: list[str | None] | None = None,
        text_cols: int = 1,
    ) -> Table:
        """Every column as wide as its widest cell (min_width), so that neither a name
        nor a figure is ever cut; only a last ``fold_last`` column wraps."""
        t = Table(title=title)
        for i, h in enumerate(head):
            if fold_last and i == len(head) - 1:
                t.add_column(h, overflow="fold", min_width=12)
                continue
            width = max([len(h), *(len(r[i]) for r in rows)])
            if i < text_cols:
                t.add_column(h, justify="left", no_wrap=True, min_width=width)
            else:
                t.add_column(h, justify="right", no_wrap=True, min_width=width)
        for j, r in enumerate(rows):
            t.add_row(*r, style=styles[j] if styles else None)
        return t

    title = f"tailguard SLO report — {report.requests} requests"
    scope = describe_filter(report.filters)
    t = table(
        title, ["boundary", "count", "P50 ms", "P99 ms"],
        [
            [name, str(b.count), "-" if b.p50 is None else f"{b.p50:.1f}",
             "-" if b.p99 is None else f"{b.p99:.1f}"]
            for name, b in report.boundaries.items()
        ],
    )  # fmt: skip
    slo_rows, styles = [], []
    for name, slo in report.slos.items():
        burn = slo.get("burn_rate", {})
        slo_rows.append([
            name, f"{slo['objective']:g}", str(slo["total"]), str(slo["good"]),
            "-" if slo["compliance"] is None else f"{slo['compliance']:.4f}",
            "-" if slo["met"] is None else ("yes" if slo["met"] else "NO"),
            _budget_cell(slo), _burn(burn.get("5m")), _burn(burn.get("1h")),
        ])  # fmt: skip
        styles.append("bold red" if slo["met"] is False else None)
    c = table(
        "SLO compliance and error budget (closed stream windows; worst first)"
        if report.filters.model is None
        else f"SLO compliance and error budget (model {report.filters.model}: exact over its "
        "requests in the closed windows; worst first)",
        ["slo", "objective", "total", "good", "compliance", "met", "budget left", "burn 5m",
         "burn 1h"],
        slo_rows, styles=styles,
    )  # fmt: skip
    parts: list[Any] = [Text(f"showing {scope}", style="bold")] if scope else []
    parts += [t, Text(f"  P50 / P99: {QUANTILE_BASIS} (as the dashboards)", style="dim"), c]
    if any(x.get("budget_basis") not in (None, "range") for x in report.slos.values()):
        parts.append(
            Text(
                "  budget left: over each SLO's own window at the report's end (the window "
                "in brackets); * projected over the whole window from the traffic seen, "
                "until a whole window is (docs/budgets.md)",
                style="dim",
            )
        )
    for name, slo in report.slos.items():
        if slo.get("met") is False and slo.get("load"):
            parts.append(Text(f"  {name} — {slo['load']}", style="yellow"))
    for hint in (open_windows_hint(report), windows_short_hint(report)):
        if hint:
            parts.append(Text(hint, style="yellow"))
    ctl = table(
        "control directives (event time)",
        ["event time", "scope", "level", "phase", "reason"],
        [[d["event_time"], d["scope"], f"L{d['level']}", d["phase"], d["reason"]]
         for d in report.control],
        fold_last=True, text_cols=4,
    )  # fmt: skip
    parts.append(ctl)
    if report.logical:
        parts.append(table(
            "what users saw: per logical request (a request and its retries once, by its "
            "final attempt)", ["", "per attempt", "per logical request"],
            logical_cells(report), text_cols=1,
        ))  # fmt: skip
    if report.control_verdicts:
        parts.append(table(
            "gateway control: refused (enforce), would have refused (shadow; served), by reason",
            ["model", "priority", "modes", "requests", "served", "refused (enforce)",
             "would have refused (shadow)"],
            [list(verdict_cells(v)) for v in report.control_verdicts],
            text_cols=3,
        ))  # fmt: skip
    s = table("records", ["by source", "n"], [[k, str(v)] for k, v in report.by_source.items()])
    o = table("outcomes", ["outcome", "n"], [[k, str(v)] for k, v in report.by_outcome.items()])
    skew = table(
        "clock skew, engine vs gateway (reported, never corrected)",
        ["gateway -> engine", "joined", "offset P50 ms"],
        [[pair, str(est["samples"]), f"{est['offset_p50_ms']:+.1f}"]
         for pair, est in report.clock_skew.items()],
    )  # fmt: skip
    parts += [s, o, skew]
    if report.clock_skew and report.sources.get("clock_skew"):
        parts.append(Text(f"  offset P50: {report.sources['clock_skew']}", style="dim"))
    return Group(*parts)


def logical_cells(report: Report) -> list[list[str]]:
    """The per-attempt and per-logical-request rows (text and HTML): requests, never
    served, latency basis, each SLO's compliance (per attempt: the stream windows')."""
    lg = report.logical
    lat = lg["latency"]
    failed = sum(v for k, v in report.by_outcome.items() if k not in ("ok", "client_abort"))
    rows = [
        ["requests", f"{report.requests:,}", f"{lg['requests']:,}"],
        ["refused or failed (never served)", f"{failed:,}", f"{lg['never_served']:,}"],
        ["retried: latency from the first attempt", "-", f"{lat['from_first']:,}"],
        ["retried: final attempt's own (gateways differ)", "-", f"{lat['final_only']:,}"],
    ]
    for name, v in lg["slos"].items():
        per = report.slos.get(name, {}).get("compliance")
        rows.append([
            name, "-" if per is None else f"{per:.4f}",
            "-" if v["compliance"] is None else f"{v['compliance']:.4f}",
        ])  # fmt: skip
    return rows


def reasons_cell(by_reason: dict[str, int]) -> str:
    """``admission 3, rate_limit 1`` (most first), or ``-``."""
    items = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{k} {n}" for k, n in items) or "-"


def verdict_cells(v: dict[str, Any]) -> tuple[str, ...]:
    """One row of the gateway control table (text and HTML)."""
    return (
        v["model"], "-" if v["priority"] is None else str(v["priority"]),
        ", ".join(f"{m} {n}" for m, n in sorted(v["modes"].items())), str(v["requests"]),
        str(v["served"]), reasons_cell(v["refused"]), reasons_cell(v["would_refuse"]),
    )  # fmt: skip


def print_wide(renderable: Any) -> None:
    """Print at the terminal's width (piped: ``COLUMNS``, else 200), or wider when the
    tables' unbreakable cells need more: a line may wrap on screen, a name is never cut."""
    import os
    import sys

    from rich.console import Console
    from rich.measure import Measurement

    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or 200)
    console = Console(width=width)
    need = Measurement.get(console, console.options.update_width(10_000), renderable).minimum
    if need > console.width:
        console = Console(width=need)
    console.print(renderable)
