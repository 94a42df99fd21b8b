"""Error budgets, burn rates and multiwindow burn-rate alerts over closed SLO windows.

Pure: plain values in (no files, no Kafka, Faust or ClickHouse); time comes in as
integer milliseconds since the Unix epoch. The rules file is
:mod:`pipeline.spec.burn_rules`; the tracker evaluates the parsed rules.

Input
-----
Per SLO (and per scope: all traffic, one model, ...), a stream of *closed*
windows ``(start_ms, size_ms, total, good, objective)``: the per-window SLO
rows of :mod:`pipeline.core.slo_windows` (10 s base windows by default). They
arrive roughly in time order, a few out of order, and the rows of several
partitions for one window arrive separately: everything is **added** (a window
given twice counts twice; the worker writes each window once). A window is
attributed wholly to the time of its ``start_ms``.

Storage and resolution
----------------------
:class:`BudgetTracker` keeps three rings of buckets, each a Fenwick tree
(range sums in O(log n), point updates in O(log n), out-of-order windows are
point updates), each bucket holding ``total``, ``bad`` and ``allowed`` (below):

========  =========================  =============================================
level     bucket width               retention (behind the newest window)
========  =========================  =============================================
0         the base window (10 s)     2 h 10 min  (5m, 30m, 1h, 2h windows exact)
1         1 min                      1 d 2 h     (6h, 1d windows to the minute)
2         1 h                        the SLO window (30 d, a month = 31 d, a week),
                                     at least 3 d, or the longest rule window; + 3 h
========  =========================  =============================================

A range ``[a, b)`` is summed from the finest level that still holds each part:
level 0 from its retention up to ``b`` (every window *starting* before ``b``),
coarser levels for the older part in whole buckets, joined at bucket edges.
A coarser bucket counts only when it starts at or after ``a``: a long window
(3 d burn rate, rolling 30 d budget) is at most one bucket (1 min or 1 h)
*shorter* than asked at its far end, never longer; hour-aligned ranges (e.g.
calendar months, whose start is midnight UTC) are exact. A window older than
the coarsest retention is dropped (:attr:`BudgetTracker.dropped`). Memory is
fixed per tracker: ~3,060 buckets for a 30 d SLO, 48 bytes each, ~150 KB.

Windows coarser than 10 s (e.g. 1 min / 1 h rollups, to backfill after a
restart) may be added too, but each lands in the bucket of its start at every
level: feed 1 h rows only for times older than 1 d, 1 min rows only for times
older than 2 h 10 min, and base windows after that.

Burn rate
---------
Over a window ``W`` ending at ``now``, using the windows that start in
``[now - W, now)``::

    burn = bad / allowed,   allowed = Σ_w (1 - objective_w) × total_w

which is ``(bad / total) / (1 - objective)`` when one objective is in force;
with several, each window weighs in with the objective it carried. ``None``
when ``total == 0`` (no traffic is not a burn rate of 0). ``now`` should be the
end of the newest closed window (the worker's watermark): windows that have
not closed are simply absent, which shortens the most recent window.

Error budget (objective changes mid-period)
-------------------------------------------
Over the SLO's own window: rolling ``[now - N days, now)``, or the calendar
period (UTC month, or ISO week starting Monday) containing ``now``::

    observed_allowed   = Σ_w (1 - objective_w) × total_w     (windows seen in the period)
    consumed           = Σ_w bad_w
    allowed_bad        = budget_allowance(...)                (below)
    remaining_fraction = 1 - consumed / allowed_bad    (< 0 when overspent;
                                                        None without traffic)

**Each window is budgeted at the objective in force when it was measured**:
tightening 99 % to 99.9 % on the 15th does not retroactively overspend the
first half of the month, and loosening it does not refund it. The objective
given to :class:`BudgetTracker` is the default for windows that carry none.

Allowance: projected until the window has been seen whole
---------------------------------------------------------
The budget of a window is ``(1 - objective) ×`` the requests of the *whole*
window. Until the tracker has seen a whole window (a fresh store, a calendar
period under way) that count is not known, and ``(1 - objective) ×`` the
requests seen so far is a budget a few minutes long: one slow minute would
"exhaust" a 30-day budget. So (:func:`budget_allowance`)::

    period_ms   = the window's length (rolling: N days; calendar: this month / week)
    seen_from   = max(period start, the first window the tracker was given)
    observed_ms = now - seen_from
    full window seen (observed_ms >= period_ms):
        allowed_bad = observed_allowed                                  ("observed")
    else, with expected_requests in the SLO spec (scope "*" only):
        allowed_bad = max((1 - objective) × expected_requests,
                          observed_allowed)                             ("expected")
    else:
        allowed_bad = observed_allowed × period_ms
                      / max(observed_ms, min_observed_ms)               ("projected")
    min_observed_ms = min(budget_events.min_observed (default 1 h), period_ms / 12)

i.e. the observed traffic *rate* over the whole window. The floor on the
observed span keeps the first minutes from being extrapolated 43,200-fold (a
30-day window from one minute): before an hour has been seen, the traffic seen
counts as one hour's worth (a smaller, safer allowance); a window shorter than
12 h uses a twelfth of it (the SRE workbook's short-window ratio: 5 min for
1 h). A calendar period is never whole before it ends, so its allowance is
always the projection over the period's length (the same once it ends); a
rolling window is whole once the tracker is older than the window. Empty
windows count as seen: an idle service is observed to have no traffic.
``docs/budgets.md`` compares this with Sloth and the SRE workbook.

Rules (``specs/burn-rules.yaml``, ``apiVersion: tailguard/v1``, ``kind: BurnRules``)
-------------------------------------------------------------------------------
* ``burn_rate``: fires when the burn rate over ``long`` **and** over ``short``
  both exceed ``factor`` (strictly). A burn of B spends B/30 of a 30-day
  budget per day: 14.4× over 1 h = 2 % of it in an hour.
* ``budget_fraction``: fires when ``bad`` over the last ``within`` is at least
  ``fraction`` × the allowed bad over the last ``of`` (e.g. 20 % of the daily
  budget within an hour; with steady traffic that is a burn rate of
  ``fraction × of / within`` = 4.8× over 1 h). Until ``of`` of history has been
  seen (e.g. just after a restart without backfill), the allowed bad over
  ``of`` is extrapolated from the history seen,
  ``allowed × of / max(history, within)``, so a young tracker does not page on
  a tiny first-hour budget.
* ``compliance_below``: fires once the compliance over ``window`` has been
  below ``below`` (strictly) at every evaluation for ``for`` (the first low
  evaluation starts the clock; an evaluation at or above ``below``, or with no
  traffic, resets it). Evaluate at least every few windows for this to mean
  "consecutive". Skipped for an SLO whose objective is below ``below`` (it
  would fire while the SLO is met).

Every rule may name ``slos: [...]`` to apply to those SLOs only (default: all).

Low traffic (``min_requests``): a rule fires only when its *short* window holds at
least ``min_requests`` requests (``burn_rate``: ``short``; ``budget_fraction``:
``within``; ``compliance_below``: ``window``); the long window, which holds at
least as many, needs no separate check. The workbook's windows stay as they are;
this is the evidence rule: one slow request among the first dozen is a burn
rate of 8x, not a burn. The shipped burn-rate rules ask for 200 requests.

Budget events
-------------
Edge-triggered: ``budget_80pct_consumed`` (``consumed ≥ 0.8 × allowed_bad``)
and ``budget_exhausted`` (``consumed ≥ allowed_bad``), against the allowance
above; at most once per SLO, scope and period. Both are emitted by the same
evaluation when it crosses both. Re-arming (the only resets): a calendar
window re-arms both when a new period starts; a rolling window (whose budget
recovers as bad windows age out) re-arms an event once the consumed fraction
drops below its threshold minus ``budget_events.rearm_margin`` (default 0.05:
the 80 % event re-arms below 75 % consumed, i.e. remaining above 25 %;
exhausted below 95 % consumed), so a budget hovering at the threshold does
not flap. No event while fewer than ``budget_events.min_requests`` requests
were counted in the period. The arming state is in memory: a restarted tracker
may emit an event again (consumers can dedupe on ``(slo, scope, kind,
period_start_ms)`` for calendar windows).
"""

from __future__ import annotations

import datetime as dt
import math
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, Protocol

from pipeline.spec.burn_rules import (
    BudgetFractionRule,
    BurnRateRule,
    BurnRules,
    ComplianceBelowRule,
    Severity,
)
from pipeline.spec.slo import SLOSpec, Window

BUDGET_80PCT_CONSUMED: Final = "budget_80pct_consumed"
BUDGET_EXHAUSTED: Final = "budget_exhausted"
# (event, consumed fraction at which it fires)
BUDGET_EVENTS: Final = ((BUDGET_80PCT_CONSUMED, 0.8), (BUDGET_EXHAUSTED, 1.0))

MINUTE_MS: Final = 60_000
HOUR_MS: Final = 3_600_000
DAY_MS: Final = 86_400_000
DEFAULT_BASE_MS: Final = 10_000
# The burn-rate windows always reported (labels as in the SRE workbook).
STANDARD_BURN_WINDOWS_MS: Final = (
    5 * MINUTE_MS,
    30 * MINUTE_MS,
    HOUR_MS,
    2 * HOUR_MS,
    6 * HOUR_MS,
    DAY_MS,
    3 * DAY_MS,
)
# Retention of the three levels (see the module docstring).
_LEVEL0_SPAN_MS: Final = 2 * HOUR_MS + 10 * MINUTE_MS
_LEVEL1_SPAN_MS: Final = DAY_MS + 2 * HOUR_MS
_LEVEL2_MARGIN_MS: Final = 3 * HOUR_MS
_EPS: Final = 1e-9  # float slack when comparing a consumed fraction with its threshold
# Allowance bases (BudgetStatus.allowance_basis; see "Allowance" in the module docstring)
OBSERVED: Final = "observed"
PROJECTED: Final = "projected"
EXPECTED: Final = "expected"
DEFAULT_MIN_OBSERVED_MS: Final = HOUR_MS


def window_label(ms: int) -> str:
    """``3_600_000`` -> ``"1h"``; the largest unit that divides exactly (d, h, m, s, ms)."""
    for unit, size in (("d", DAY_MS), ("h", HOUR_MS), ("m", MINUTE_MS), ("s", 1_000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


# --------------------------------------------------------------------------- #
# Bucketed storage: rings of Fenwick trees
# --------------------------------------------------------------------------- #


class WindowCounts(NamedTuple):
    """Counts over a time range; ``allowed`` = Σ (1 - objective_w) × total_w."""

    total: int
    bad: float
    allowed: float

    @property
    def good(self) -> float:
        return self.total - self.bad

    @property
    def compliance(self) -> float | None:
        return None if self.total == 0 else (self.total - self.bad) / self.total

    @property
    def burn_rate(self) -> float | None:
        """``bad / allowed`` (= ``(bad/total) / (1 - objective)``); None without traffic."""
        if self.total == 0 or self.allowed <= 0:
            return None
        return self.bad / self.allowed


_ZERO: Final = WindowCounts(0, 0.0, 0.0)


class _Level:
    """A ring of ``n`` buckets of ``width`` ms, summed with Fenwick trees.

    Invariant: only epochs (bucket start // width) in ``(head - n, head]`` are
    held; advancing ``head`` clears the buckets it passes. Raw bucket values
    are kept beside the trees so a bucket can be cleared exactly, and the trees
    are rebuilt from them once per ring revolution (no float drift).
    """

    __slots__ = (
        "_clears",
        "alw",
        "bad",
        "head",
        "n",
        "raw_alw",
        "raw_bad",
        "raw_tot",
        "tot",
        "width",
    )

    def __init__(self, width: int, span: int) -> None:
        self.width = width
        self.n = n = -(-span // width)
        self.head: int | None = None
        self._clears = 0
        self.tot = array("q", bytes(8 * (n + 1)))  # Fenwick, 1-based
        self.bad = array("d", bytes(8 * (n + 1)))
        self.alw = array("d", bytes(8 * (n + 1)))
        self.raw_tot = array("q", bytes(8 * n))  # ring, 0-based
        self.raw_bad = array("d", bytes(8 * n))
        self.raw_alw = array("d", bytes(8 * n))

    @property
    def nbytes(self) -> int:
        arrays = (self.tot, self.bad, self.alw, self.raw_tot, self.raw_bad, self.raw_alw)
        return sum(a.buffer_info()[1] * a.itemsize for a in arrays)

    @property
    def first_epoch(self) -> int | None:
        return None if self.head is None else self.head - self.n + 1

    def _fen_add(self, i: int, t: int, b: float, a: float) -> None:
        n, tot, bad, alw = self.n, self.tot, self.bad, self.alw
        i += 1
        while i <= n:
            tot[i] += t
            bad[i] += b
            alw[i] += a
            i += i & -i

    def _prefix(self, i: int) -> tuple[int, float, float]:
        """Sum of ring slots ``[0, i)``."""
        tot, bad, alw = self.tot, self.bad, self.alw
        t, b, a = 0, 0.0, 0.0
        while i > 0:
            t += tot[i]
            b += bad[i]
            a += alw[i]
            i -= i & -i
        return t, b, a

    def _rebuild(self) -> None:
        n = self.n
        self.tot[1:] = self.raw_tot[:]
        self.bad[1:] = self.raw_bad[:]
        self.alw[1:] = self.raw_alw[:]
        tot, bad, alw = self.tot, self.bad, self.alw
        for i in range(1, n + 1):
            j = i + (i & -i)
            if j <= n:
                tot[j] += tot[i]
                bad[j] += bad[i]
                alw[j] += alw[i]
        self._clears = 0

    def _advance(self, epoch: int) -> None:
        head = self.head
        if head is None:
            self.head = epoch
            return
        n = self.n
        if epoch - head >= n:
            for arr in (self.tot, self.bad, self.alw, self.raw_tot, self.raw_bad, self.raw_alw):
                arr[:] = array(arr.typecode, bytes(8 * len(arr)))
            self._clears = 0
        else:
            raw_tot, raw_bad, raw_alw = self.raw_tot, self.raw_bad, self.raw_alw
            for e in range(head + 1, epoch + 1):
                i = e % n
                t = raw_tot[i]
                if t or raw_bad[i] or raw_alw[i]:
                    self._fen_add(i, -t, -raw_bad[i], -raw_alw[i])
                    raw_tot[i] = 0
                    raw_bad[i] = 0.0
                    raw_alw[i] = 0.0
            self._clears += epoch - head
            if self._clears >= n:
                self._rebuild()
        self.head = epoch

    def add(self, start_ms: int, total: int, bad: float, allowed: float) -> bool:
        epoch = start_ms // self.width
        if self.head is None or epoch > self.head:
            self._advance(epoch)
        elif epoch <= self.head - self.n:
            return False  # older than this level holds
        i = epoch % self.n
        self.raw_tot[i] += total
        self.raw_bad[i] += bad
        self.raw_alw[i] += allowed
        self._fen_add(i, total, bad, allowed)
        return True

    def sum_epochs(self, e0: int, e1: int) -> WindowCounts:
        """Sum of the held buckets with epoch in ``[e0, e1)``."""
        head = self.head
        if head is None:
            return _ZERO
        n = self.n
        e0 = max(e0, head - n + 1)
        e1 = min(e1, head + 1)
        if e0 >= e1:
            return _ZERO
        i0 = e0 % n
        i1 = i0 + (e1 - e0)
        t0, b0, a0 = self._prefix(i0)
        if i1 <= n:
            t1, b1, a1 = self._prefix(i1)
            return WindowCounts(t1 - t0, b1 - b0, a1 - a0)
        tn, bn, an = self._prefix(n)
        t1, b1, a1 = self._prefix(i1 - n)
        return WindowCounts(tn - t0 + t1, bn - b0 + b1, an - a0 + a1)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Buckets:
    """The three levels and range sums across them (see the module docstring)."""

    __slots__ = ("levels",)

    def __init__(self, base_ms: int, long_span_ms: int) -> None:
        if base_ms <= 0 or MINUTE_MS % base_ms:
            raise ValueError(f"base window size must divide 60000 ms, got {base_ms}")
        self.levels = (
            _Level(base_ms, _LEVEL0_SPAN_MS),
            _Level(MINUTE_MS, _LEVEL1_SPAN_MS),
            _Level(HOUR_MS, long_span_ms + _LEVEL2_MARGIN_MS),
        )

    def add(self, start_ms: int, total: int, bad: float, allowed: float) -> bool:
        kept = False
        for lv in self.levels:
            kept = lv.add(start_ms, total, bad, allowed) or kept
        return kept

    def range(self, a: int, b: int) -> WindowCounts:
        """Counts of ``[a, b)`` (ms): finest level first, older parts from coarser ones."""
        t, bd, al = 0, 0.0, 0.0
        hi = b
        levels = self.levels
        last = len(levels) - 1
        for k, lv in enumerate(levels):
            if hi <= a:
                break
            first = lv.first_epoch
            if first is None:
                break
            w = lv.width
            # the finest level counts windows starting before b; coarser ones whole buckets
            e_hi = _ceil_div(hi, w) if k == 0 else hi // w
            e_lo = _ceil_div(a, w)
            if e_lo >= first or k == last:
                c = lv.sum_epochs(e_lo, e_hi)
                t, bd, al = t + c.total, bd + c.bad, al + c.allowed
                break
            next_w = levels[k + 1].width
            boundary = _ceil_div(first * w, next_w) * next_w
            if boundary < hi:
                c = lv.sum_epochs(boundary // w, e_hi)
                t, bd, al = t + c.total, bd + c.bad, al + c.allowed
                hi = boundary
        return WindowCounts(t, bd, al)

    @property
    def nbytes(self) -> int:
        return sum(lv.nbytes for lv in self.levels)

    @property
    def buckets(self) -> int:
        return sum(lv.n for lv in self.levels)


# --------------------------------------------------------------------------- #
# Evaluation results
# --------------------------------------------------------------------------- #


class Alert(NamedTuple):
    """A firing rule: ``(rule, severity, figures)``; figures name the windows (``burn_1h``)."""

    rule: str
    severity: Severity
    figures: dict[str, float]


@dataclass(frozen=True, slots=True)
class BudgetEvent:
    """``budget_80pct_consumed`` or ``budget_exhausted``, emitted once when crossed."""

    kind: str
    slo: str
    scope: str
    at_ms: int
    period_start_ms: int
    consumed_fraction: float
    allowed: float
    consumed: float

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "slo": self.slo,
            "scope": self.scope,
            "at_ms": self.at_ms,
            "period_start_ms": self.period_start_ms,
            "consumed_fraction": self.consumed_fraction,
            "allowed": self.allowed,
            "consumed": self.consumed,
        }


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """One evaluation of one tracker at ``now_ms``.

    ``period_*``: the SLO window evaluated, ``[period_start_ms, now_ms)``
    (``period_end_ms`` is the calendar period's end, ``now_ms`` for a rolling
    window). ``burn_rates``: label (``5m`` ... ``3d``, plus any rule window) ->
    burn rate or None. ``alerts``: the rules firing now, in file order.
    ``events``: budget events emitted by *this* evaluation.
    """

    slo: str
    scope: str
    now_ms: int
    objective: float
    window: str
    period_start_ms: int
    period_end_ms: int
    total: int
    good: float
    compliance: float | None
    allowed: float
    consumed: float
    remaining_fraction: float | None
    burn_rates: Mapping[str, float | None]
    alerts: tuple[Alert, ...] = ()
    events: tuple[BudgetEvent, ...] = ()
    # How ``allowed`` was obtained (see "Allowance" in the module docstring): the
    # allowance of the traffic seen, the span of the window seen, the window's length,
    # and the basis (observed | projected | expected).
    observed_allowed: float = 0.0
    observed_ms: int = 0
    period_ms: int = 0
    allowance_basis: str = OBSERVED

    @property
    def paging(self) -> bool:
        return any(a.severity == "page" for a in self.alerts)

    def to_json(self) -> dict[str, Any]:
        return {
            "slo": self.slo,
            "scope": self.scope,
            "now_ms": self.now_ms,
            "objective": self.objective,
            "window": self.window,
            "period_start_ms": self.period_start_ms,
            "period_end_ms": self.period_end_ms,
            "total": self.total,
            "good": self.good,
            "compliance": self.compliance,
            "allowed": self.allowed,
            "consumed": self.consumed,
            "remaining_fraction": self.remaining_fraction,
            "observed_allowed": self.observed_allowed,
            "observed_ms": self.observed_ms,
            "period_ms": self.period_ms,
            "allowance_basis": self.allowance_basis,
            "burn_rates": dict(self.burn_rates),
            "alerts": [
                {"rule": a.rule, "severity": a.severity, "figures": dict(a.figures)}
                for a in self.alerts
            ],
            "events": [e.to_json() for e in self.events],
        }


# --------------------------------------------------------------------------- #
# The tracker
# --------------------------------------------------------------------------- #


def _check_objective(objective: float) -> float:
    if not (0.0 < objective < 1.0) or math.isnan(objective):
        raise ValueError(f"objective must be strictly between 0 and 1, got {objective}")
    return objective


def _budget_share(objective: float) -> float:
    """``1 - objective``, as the decimal the spec wrote (0.99 -> 0.01, not 0.010000000000000009)."""
    return round(1.0 - objective, 12)


def _compliance_span_ms(window: Window) -> int:
    rolling = window.rolling_ms
    if rolling is not None:
        return rolling
    return 31 * DAY_MS if window.calendar == "month" else 7 * DAY_MS


def _period_ms(window: Window, now_ms: int) -> tuple[int, int]:
    """``(start, end)`` of the SLO window at ``now_ms``; end = now for a rolling window."""
    rolling = window.rolling_ms
    if rolling is not None:
        return now_ms - rolling, now_ms
    start_ms = window.start_unix_ns(now_ms * 1_000_000) // 1_000_000
    start = dt.datetime.fromtimestamp(start_ms // 1000, tz=dt.UTC)
    if window.calendar == "month":
        end = (start + dt.timedelta(days=32)).replace(day=1)
    else:
        end = start + dt.timedelta(days=7)
    return start_ms, int(end.timestamp()) * 1000


def window_span_ms(window: Window) -> int:
    """The length of an SLO window (a calendar month counts 31 days)."""
    return _compliance_span_ms(window)


def period_at(window: Window, now_ms: int) -> tuple[int, int]:
    """``(start, end)`` of the SLO window at ``now_ms`` (rolling: ``end = now``)."""
    return _period_ms(window, now_ms)


def scope_expected_requests(expected_requests: int | None, scope: str) -> int | None:
    """An SLO's ``expected_requests`` is the volume of all its traffic (scope ``"*"``): a
    narrower scope (one model) has no expected volume and its budget is projected
    (specs/README.md). The one rule for the controller's trackers and the report."""
    return expected_requests if scope == "*" else None


def window_budget(
    objective: float,
    window: Window,
    *,
    total: int,
    bad: float,
    first_ms: int,
    now_ms: int,
    expected_requests: int | None = None,
    floor_ms: int = DEFAULT_MIN_OBSERVED_MS,
) -> tuple[float | None, Allowance | None]:
    """The share of an SLO window's budget left at ``now_ms`` (1 = untouched, < 0 =
    overspent) from the counts of the window so far (``total``, ``bad``; data from
    ``first_ms``), with the allowance the controller uses: projected over the whole
    window until a whole window is seen (:func:`budget_allowance`). ``(None, None)``
    without traffic."""
    if total <= 0:
        return None, None
    start_ms, _ = period_at(window, now_ms)
    span = window_span_ms(window)
    observed = now_ms - max(start_ms, first_ms)
    expected = None if expected_requests is None else (1 - objective) * expected_requests
    allowance = budget_allowance(
        (1 - objective) * total,
        period_ms=span,
        observed_ms=max(observed, 0),
        min_observed_ms=min_observed_ms(span, floor_ms),
        expected_allowed=expected,
    )
    if allowance.allowed <= 0:
        return None, allowance
    return 1.0 - bad / allowance.allowed, allowance


def min_observed_ms(period_ms: int, floor_ms: int = DEFAULT_MIN_OBSERVED_MS) -> int:
    """The least observed span a projection divides by: ``floor_ms`` (1 h), or a twelfth
    of the window when that is shorter (5 min for a 1 h window)."""
    return max(1, min(floor_ms, period_ms // 12))


@dataclass(frozen=True, slots=True)
class Allowance:
    """The allowed bad requests of a window, and how they were obtained."""

    allowed: float
    basis: str  # OBSERVED | PROJECTED | EXPECTED


def budget_allowance(
    observed_allowed: float,
    *,
    period_ms: int,
    observed_ms: int,
    min_observed_ms: int,
    expected_allowed: float | None = None,
) -> Allowance:
    """The allowance of a window of ``period_ms`` of which ``observed_ms`` were seen.

    Whole window seen: ``observed_allowed``. Else ``max(expected_allowed,
    observed_allowed)`` when an expected volume is given, else the observed rate over
    the whole window, ``observed_allowed × period_ms / max(observed_ms,
    min_observed_ms)`` (see "Allowance" in the module docstring).
    """
    if period_ms <= 0 or min_observed_ms <= 0:
        raise ValueError(f"need period_ms > 0 and min_observed_ms > 0, got {period_ms}, "
                         f"{min_observed_ms}")  # fmt: skip
    if observed_ms >= period_ms:
        return Allowance(observed_allowed, OBSERVED)
    if expected_allowed is not None:
        return Allowance(max(expected_allowed, observed_allowed), EXPECTED)
    span = max(observed_ms, min(min_observed_ms, period_ms))
    return Allowance(observed_allowed * period_ms / span, PROJECTED)


class BudgetTracker:
    """Burn rates, error budget, alerts and budget events of one SLO (in one scope).

    Feed it closed windows with :meth:`add_window`; call :meth:`evaluate`
    every base window. Not thread-safe; one tracker per SLO x scope
    (:class:`BudgetBook` keeps many).
    """

    __slots__ = (
        "_armed",
        "_below_since",
        "_buckets",
        "_expected_allowed",
        "_first_start",
        "_period_start",
        "_rules",
        "_windows",
        "dropped",
        "expected_requests",
        "objective",
        "rules",
        "scope",
        "slo",
        "window",
    )

    def __init__(
        self,
        slo_name: str,
        objective: float,
        window: Window,
        rules: BurnRules | None = None,
        *,
        scope: str = "*",
        base_ms: int = DEFAULT_BASE_MS,
        expected_requests: int | None = None,
    ) -> None:
        self.slo = slo_name
        self.scope = scope
        self.objective = _check_objective(objective)
        if expected_requests is not None and expected_requests <= 0:
            raise ValueError(f"expected_requests must be > 0, got {expected_requests}")
        self.expected_requests = expected_requests
        self._expected_allowed = (
            None if expected_requests is None else _budget_share(objective) * expected_requests
        )
        self.window = window
        self.rules = rules if rules is not None else BurnRules.empty()
        self._rules = tuple(r for r in self.rules.rules if r.applies_to(slo_name, objective))
        windows = set(STANDARD_BURN_WINDOWS_MS)
        for r in self._rules:
            windows.update(r.windows_ms())
        self._windows = tuple(sorted(windows))
        long_span = max(_compliance_span_ms(window), *self._windows)
        self._buckets = _Buckets(base_ms, long_span)
        self._first_start: int | None = None
        self._below_since: dict[str, int] = {}
        self._armed = {name: True for name, _ in BUDGET_EVENTS}
        self._period_start: int | None = None
        self.dropped = 0  # windows older than every level holds

    @property
    def retention_ms(self) -> tuple[int, int, int]:
        """How far behind the newest window each level (base, 1 min, 1 h) holds windows."""
        lv0, lv1, lv2 = self._buckets.levels
        return (lv0.n * lv0.width, lv1.n * lv1.width, lv2.n * lv2.width)

    # -- input ---------------------------------------------------------------

    def add_window(
        self,
        start_ms: int,
        size_ms: int,
        total: int,
        good: float,
        objective: float | None = None,
        *,
        delta: bool = False,
    ) -> bool:
        """Add one closed window (or one partition's part of it); False if too old to keep.

        ``good`` may be fractional (a blended tier's weighted good count). ``delta``: a
        correction of a window added before (late records, or a partial taken back when
        its upgrade landed elsewhere): counts may be negative, they add up.
        """
        if size_ms <= 0:
            raise ValueError(f"size_ms must be > 0, got {size_ms}")
        if not delta and (total < 0 or not (0 <= good <= total)):
            raise ValueError(f"need 0 <= good <= total, got good={good} total={total}")
        obj = self.objective if objective is None else _check_objective(objective)
        if self._first_start is None or start_ms < self._first_start:
            self._first_start = start_ms
        if total == 0 and good == 0:
            return True
        kept = self._buckets.add(start_ms, total, total - good, _budget_share(obj) * total)
        if not kept:
            self.dropped += 1
        return kept

    # -- queries -------------------------------------------------------------

    def counts(self, start_ms: int, end_ms: int) -> WindowCounts:
        """Counts of the windows starting in ``[start_ms, end_ms)`` (see resolution)."""
        return self._buckets.range(start_ms, end_ms)

    def burn_rate(self, window_ms: int, now_ms: int) -> float | None:
        return self._buckets.range(now_ms - window_ms, now_ms).burn_rate

    @property
    def nbytes(self) -> int:
        """Bytes held by the bucket arrays (fixed at construction)."""
        return self._buckets.nbytes

    @property
    def buckets(self) -> int:
        return self._buckets.buckets

    # -- evaluation ----------------------------------------------------------

    def evaluate(self, now_ms: int) -> BudgetStatus:
        rng = self._buckets.range
        by_window = {w: rng(now_ms - w, now_ms) for w in self._windows}
        burn_rates = {window_label(w): c.burn_rate for w, c in by_window.items()}

        start, end = _period_ms(self.window, now_ms)
        budget = rng(start, now_ms)
        period_ms = (end - start) if self.window.rolling is None else now_ms - start
        seen_from = start if self._first_start is None else max(start, self._first_start)
        observed_ms = max(0, now_ms - seen_from)
        allowance = budget_allowance(
            budget.allowed,
            period_ms=period_ms,
            observed_ms=observed_ms,
            min_observed_ms=min_observed_ms(period_ms, self.rules.budget_events.min_observed_ms),
            expected_allowed=self._expected_allowed,
        )
        allowed = allowance.allowed
        remaining = None if budget.total == 0 or allowed <= 0 else 1.0 - budget.bad / allowed

        alerts: list[Alert] = []
        for rule in self._rules:
            alert = self._check(rule, now_ms, by_window)
            if alert is not None:
                alerts.append(alert)

        events = self._events(now_ms, start, budget, allowed)
        return BudgetStatus(
            slo=self.slo,
            scope=self.scope,
            now_ms=now_ms,
            objective=self.objective,
            window=self.window.describe(),
            period_start_ms=start,
            period_end_ms=end,
            total=budget.total,
            good=budget.good,
            compliance=budget.compliance,
            allowed=allowed,
            consumed=budget.bad,
            remaining_fraction=remaining,
            burn_rates=burn_rates,
            alerts=tuple(alerts),
            events=events,
            observed_allowed=budget.allowed,
            observed_ms=min(observed_ms, period_ms),
            period_ms=period_ms,
            allowance_basis=allowance.basis,
        )

    def _check(
        self,
        rule: BurnRateRule | BudgetFractionRule | ComplianceBelowRule,
        now_ms: int,
        by_window: Mapping[int, WindowCounts],
    ) -> Alert | None:
        if isinstance(rule, BurnRateRule):
            long = by_window[rule.long_ms].burn_rate
            short = by_window[rule.short_ms].burn_rate
            if by_window[rule.short_ms].total < rule.min_requests:
                return None  # too little evidence in the short window (low-traffic rule)
            if long is None or short is None or long <= rule.factor or short <= rule.factor:
                return None
            return Alert(
                rule.name,
                rule.severity,
                {
                    "factor": rule.factor,
                    f"burn_{window_label(rule.long_ms)}": long,
                    f"burn_{window_label(rule.short_ms)}": short,
                },
            )
        if isinstance(rule, BudgetFractionRule):
            within = by_window[rule.within_ms]
            of = by_window[rule.of_ms]
            if within.total == 0 or of.allowed <= 0 or within.total < rule.min_requests:
                return None
            assert self._first_start is not None  # there is traffic
            history = now_ms - self._first_start
            allowed_of = of.allowed
            if history < rule.of_ms:
                allowed_of = of.allowed * rule.of_ms / max(history, rule.within_ms)
            spent = within.bad / allowed_of
            if spent < rule.fraction:
                return None
            return Alert(
                rule.name,
                rule.severity,
                {
                    "fraction": rule.fraction,
                    "spent_fraction": spent,
                    "bad": within.bad,
                    f"allowed_{window_label(rule.of_ms)}": allowed_of,
                    f"burn_{window_label(rule.within_ms)}": within.burn_rate or 0.0,
                    "equivalent_burn_rate": rule.equivalent_burn_rate,
                },
            )
        compliance = by_window[rule.window_ms].compliance
        if by_window[rule.window_ms].total < rule.min_requests:
            compliance = None  # too few requests to judge: no evidence, resets the clock
        if compliance is None or compliance >= rule.below:
            self._below_since.pop(rule.name, None)
            return None
        since = self._below_since.setdefault(rule.name, now_ms)
        if now_ms < since:  # evaluated back in time: start over
            since = self._below_since[rule.name] = now_ms
        if now_ms - since < rule.for_ms:
            return None
        return Alert(
            rule.name,
            rule.severity,
            {
                "below": rule.below,
                f"compliance_{window_label(rule.window_ms)}": compliance,
                "below_since_ms": float(since),
                "below_for_ms": float(now_ms - since),
            },
        )

    def _events(
        self, now_ms: int, period_start: int, budget: WindowCounts, allowed: float
    ) -> tuple[BudgetEvent, ...]:
        rolling = self.window.rolling is not None
        if not rolling and period_start != self._period_start:
            for name in self._armed:
                self._armed[name] = True
        self._period_start = period_start
        cfg = self.rules.budget_events
        if budget.total == 0 or allowed <= 0 or budget.total < cfg.min_requests:
            return ()
        consumed = budget.bad / allowed
        out: list[BudgetEvent] = []
        for name, threshold in BUDGET_EVENTS:
            if self._armed[name]:
                if consumed >= threshold - _EPS:
                    self._armed[name] = False
                    out.append(
                        BudgetEvent(
                            name,
                            self.slo,
                            self.scope,
                            now_ms,
                            period_start,
                            consumed,
                            allowed,
                            budget.bad,
                        )
                    )
            elif rolling and consumed < threshold - cfg.rearm_margin:
                self._armed[name] = True
        return tuple(out)


# --------------------------------------------------------------------------- #
# Many trackers
# --------------------------------------------------------------------------- #


class WindowRow(Protocol):
    """What :class:`BudgetBook.add_rows` reads (``pipeline.core.slo_windows.SLOWindowRow``)."""

    @property
    def slo(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def objective(self) -> float: ...
    @property
    def total(self) -> int: ...
    @property
    def good(self) -> int: ...
    @property
    def good_secondary_only(self) -> int: ...
    @property
    def secondary_weight(self) -> float: ...


@dataclass
class BudgetBook:
    """One :class:`BudgetTracker` per SLO (or blended tier) x scope of a spec, made on demand.

    ``scope`` is an opaque label (``"*"`` for all traffic, a model, ...). A
    blended tier is budgeted on its weighted good count with its own objective
    and its primary's window. At most ``max_trackers`` trackers (a fixed
    ~150 KB each); :meth:`tracker` raises beyond that.
    """

    spec: SLOSpec
    rules: BurnRules = field(default_factory=BurnRules.empty)
    base_ms: int = DEFAULT_BASE_MS
    max_trackers: int = 256
    trackers: dict[tuple[str, str], BudgetTracker] = field(default_factory=dict, init=False)

    def tracker(self, slo: str, scope: str = "*") -> BudgetTracker:
        key = (slo, scope)
        t = self.trackers.get(key)
        if t is not None:
            return t
        if len(self.trackers) >= self.max_trackers:
            raise ValueError(f"more than {self.max_trackers} budget trackers (slo x scope)")
        t = self._new_tracker(slo, scope)
        self.trackers[key] = t
        return t

    def retention_ms(self) -> tuple[int, int, int]:
        """How far behind the newest window base windows, 1-minute and 1-hour buckets are
        held (hours: the longest of the spec's SLOs and tiers): what a restart reloads."""
        names = [*(s.name for s in self.spec.slos), *self.spec.tiers]
        spans = [self._new_tracker(n, "*").retention_ms for n in names]
        return (spans[0][0], spans[0][1], max(sp[2] for sp in spans))

    def _new_tracker(self, slo: str, scope: str) -> BudgetTracker:
        if slo in self.spec.tiers:
            tier = self.spec.tiers[slo]
            objective, window = tier.objective, self.spec.slo(tier.primary).window
            expected = None
        else:
            try:
                s = self.spec.slo(slo)
            except KeyError:
                raise KeyError(f"unknown SLO or tier {slo!r}") from None
            objective, window = s.objective, s.window
            expected = scope_expected_requests(s.expected_requests, scope)
        return BudgetTracker(
            slo, objective, window, self.rules, scope=scope, base_ms=self.base_ms,
            expected_requests=expected,
        )  # fmt: skip

    def add_window(
        self,
        slo: str,
        start_ms: int,
        size_ms: int,
        total: int,
        good: float,
        *,
        objective: float | None = None,
        scope: str = "*",
        delta: bool = False,
    ) -> bool:
        return self.tracker(slo, scope).add_window(
            start_ms, size_ms, total, good, objective, delta=delta
        )

    def add_rows(
        self, start_ms: int, size_ms: int, rows: Iterable[WindowRow], *, scope: str = "*"
    ) -> None:
        """Add one window's SLO rows (:meth:`pipeline.core.slo_windows.WindowSLOCounts.rows`)."""
        for r in rows:
            good: float = r.good
            if r.kind == "blended":
                good = r.good + r.secondary_weight * r.good_secondary_only
            self.tracker(r.slo, scope).add_window(start_ms, size_ms, r.total, good, r.objective)

    def evaluate(self, now_ms: int) -> list[BudgetStatus]:
        """Every tracker at ``now_ms``, ordered by (slo, scope)."""
        return [self.trackers[k].evaluate(now_ms) for k in sorted(self.trackers)]
