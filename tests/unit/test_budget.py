"""Error budgets, burn rates, burn-rate rules and budget events (pipeline.core.budget)."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.budget import (
    BUDGET_80PCT_CONSUMED,
    BUDGET_EXHAUSTED,
    BudgetBook,
    BudgetTracker,
    window_label,
)
from pipeline.core.slo_windows import SLOWindowRow
from pipeline.spec.burn_rules import (
    DEFAULT_BURN_RULES_PATH,
    BudgetFractionRule,
    BurnRateRule,
    BurnRules,
    ComplianceBelowRule,
    load_burn_rules,
    load_burn_rules_file,
)
from pipeline.spec.loader import SpecError
from pipeline.spec.slo import Window, load_spec_file
from tests.paths import REPO

BASE = 10_000
S = 1_000
M = 60_000
H = 3_600_000
D = 86_400_000


def _ms(year: int, month: int, day: int, hour: int = 0) -> int:
    return int(dt.datetime(year, month, day, hour, tzinfo=dt.UTC).timestamp()) * 1000


NOW = _ms(2024, 3, 15)  # a Friday, midnight UTC: hour-aligned
DEFAULT = load_burn_rules_file()
ROLLING_30D = Window(rolling="30d")


def only(*names: str) -> BurnRules:
    """The shipped rules, restricted to ``names``."""
    return DEFAULT.model_copy(update={"rules": [r for r in DEFAULT.rules if r.name in names]})


def rules_yaml(body: str) -> BurnRules:
    return load_burn_rules(f"apiVersion: tailguard/v1\nkind: BurnRules\n{body}")


def feed(
    t: BudgetTracker,
    start: int,
    end: int,
    per_10s: int,
    bad: int = 0,
    *,
    now: int = NOW,
    objective: float | None = None,
) -> None:
    """Windows covering ``[start, end)``, ``per_10s`` requests per 10 s, ``bad`` spread evenly.

    As a backfill would: 1 h windows older than 1 d before ``now``, 1 min
    windows older than 2 h, 10 s windows after that.
    """
    span = end - start
    s = start
    while s < end:
        if s % H == 0 and s + H <= min(end, now - D):
            size = H
        elif s % M == 0 and s + M <= min(end, now - 2 * H):
            size = M
        else:
            size = BASE
        total = per_10s * size // BASE
        b = bad * (s + size - start) // span - bad * (s - start) // span
        t.add_window(s, size, total, total - b, objective)
        s += size


# --------------------------------------------------------------------------- #
# The SRE-workbook relations
# --------------------------------------------------------------------------- #

# (share of a 30-day budget spent, in the last W, burn rate over W, the rule at that factor)
SRE_CASES = [
    (0.02, H, 14.4, "page-fast-burn"),
    (0.05, 6 * H, 6.0, "page-slow-burn"),
    (0.10, D, 3.0, "ticket-fast-burn"),
    (0.10, 3 * D, 1.0, "ticket-slow-burn"),
]


def _spend(share: float, w: int) -> BudgetTracker:
    """30 d at 1000 requests / 10 s, 99.9 %; ``share`` of the budget spent in the last w."""
    t = BudgetTracker("api", 0.999, ROLLING_30D, DEFAULT)
    allowed_30d = 0.001 * 1000 * (30 * D // BASE)  # 259,200 bad requests
    feed(t, NOW - 30 * D, NOW - w, 1000)
    feed(t, NOW - w, NOW, 1000, round(share * allowed_30d))
    return t


@pytest.mark.parametrize(("share", "w", "burn", "rule"), SRE_CASES, ids=str)
def test_spending_a_share_of_a_30_day_budget_in_w_is_the_workbook_burn_rate(
    share: float, w: int, burn: float, rule: str
) -> None:
    status = _spend(share, w).evaluate(NOW)
    assert status.burn_rates[window_label(w)] == pytest.approx(burn, rel=1e-12)
    # every window: share x 30 d / max(W, window) (the spend is uniform inside W)
    for label, ms in [("5m", 5 * M), ("30m", 30 * M), ("1h", H), ("2h", 2 * H),
                      ("6h", 6 * H), ("1d", D), ("3d", 3 * D)]:  # fmt: skip
        assert status.burn_rates[label] == pytest.approx(share * 30 * D / max(w, ms), rel=1e-12)
    assert status.allowed == pytest.approx(259_200, rel=1e-12)
    assert status.consumed == round(share * 259_200)
    assert status.remaining_fraction == pytest.approx(1 - share, rel=1e-12)
    # "exceed": exactly the factor does not fire the rule at that factor, 10 % more does
    assert rule not in {a.rule for a in status.alerts}
    hotter = _spend(share * 1.1, w).evaluate(NOW)
    fired = {a.rule: a for a in hotter.alerts}
    assert rule in fired
    assert fired[rule].figures[f"burn_{window_label(w)}"] == pytest.approx(burn * 1.1, rel=1e-3)


# bad requests in [NOW - a, NOW - b) at 1000 requests / 10 s (360 allowed bad per hour)
FAST_BURN_CASES = [
    ("16x over the whole hour", H, 0, 5760, True),
    ("16x over 1h, last 5m clean", H, 5 * M, 5760, False),
    ("60x over 5m only: 5x over 1h", 5 * M, 0, 1800, False),
    ("exactly 14.4x: does not exceed", H, 0, 5184, False),
]


@pytest.mark.parametrize(
    ("case", "a", "b", "bad", "pages"), FAST_BURN_CASES, ids=[c[0] for c in FAST_BURN_CASES]
)
def test_fast_burn_pages_only_when_long_and_short_windows_both_exceed(
    case: str, a: int, b: int, bad: int, pages: bool
) -> None:
    t = BudgetTracker("api", 0.999, ROLLING_30D, only("page-fast-burn", "page-slow-burn"))
    feed(t, NOW - D, NOW - a, 1000)
    feed(t, NOW - a, NOW - b, 1000, bad)
    if b:
        feed(t, NOW - b, NOW, 1000)
    status = t.evaluate(NOW)
    assert status.paging is pages
    assert [a.rule for a in status.alerts] == (["page-fast-burn"] if pages else [])
    if case.startswith("16x over 1h, last"):
        assert status.burn_rates["1h"] == pytest.approx(16.0)
        assert status.burn_rates["5m"] == 0.0


# --------------------------------------------------------------------------- #
# Budget over the SLO window
# --------------------------------------------------------------------------- #


def test_objective_change_mid_period_budgets_each_window_at_its_own_objective() -> None:
    t = BudgetTracker("gold", 0.999, Window(calendar="month"))
    t.add_window(_ms(2024, 2, 28), BASE, 5000, 4000, 0.99)  # February: another period
    t.add_window(_ms(2024, 3, 2), BASE, 1000, 995, 0.99)  # 5 bad, 1 % of 1000 = 10 allowed
    t.add_window(_ms(2024, 3, 20), BASE, 2000, 1997, 0.999)  # 3 bad, 0.1 % of 2000 = 2 allowed
    status = t.evaluate(_ms(2024, 3, 25))
    assert status.period_start_ms == _ms(2024, 3, 1)
    assert status.period_end_ms == _ms(2024, 4, 1)
    assert status.total == 3000
    assert status.consumed == 8
    assert status.observed_allowed == pytest.approx(12.0)
    # a calendar period under way: the allowance is projected over the month (24 of 31 d seen)
    assert (status.allowance_basis, status.observed_ms, status.period_ms) == (
        "projected", 24 * D, 31 * D,
    )  # fmt: skip
    assert status.allowed == pytest.approx(12.0 * 31 / 24)
    assert status.remaining_fraction == pytest.approx(1 - 8 / 15.5)
    assert status.compliance == pytest.approx(2992 / 3000)
    # neither objective alone gives that: all at 99.9 % -> 3 allowed ; all at 99 % -> 30
    assert status.observed_allowed != pytest.approx(3.0)
    assert status.observed_allowed != pytest.approx(30.0)
    # a burn rate uses the objective its windows carried: 3 bad / 2 allowed
    assert t.evaluate(_ms(2024, 3, 20, 1)).burn_rates["1h"] == pytest.approx(1.5)
    # a window without an objective is budgeted at the tracker's (99.9 %)
    t.add_window(_ms(2024, 3, 21), BASE, 1000, 999)
    assert t.evaluate(_ms(2024, 3, 25)).observed_allowed == pytest.approx(13.0)


@pytest.mark.parametrize(
    ("calendar", "last_of_old", "first_of_new"),
    [
        ("month", _ms(2024, 1, 31, 23), _ms(2024, 2, 1)),
        ("week", _ms(2024, 3, 10, 23), _ms(2024, 3, 11)),  # Sunday -> Monday
    ],
)
def test_calendar_boundary_resets_the_budget_and_rearms_events(
    calendar: str, last_of_old: int, first_of_new: int
) -> None:
    # 1000 requests expected per period: 10 allowed bad (or 1 % of the requests seen, if more)
    w = Window(calendar=calendar)  # type: ignore[arg-type]
    t = BudgetTracker("gold", 0.99, w, expected_requests=1000)
    t.add_window(last_of_old, BASE, 1000, 980)  # 20 bad of 10 allowed
    s1 = t.evaluate(last_of_old + 30 * M)
    assert [e.kind for e in s1.events] == [BUDGET_80PCT_CONSUMED, BUDGET_EXHAUSTED]
    assert s1.remaining_fraction == pytest.approx(-1.0)
    assert t.evaluate(last_of_old + 40 * M).events == ()  # once per period
    s2 = t.evaluate(first_of_new + 10 * S)
    assert s2.period_start_ms == first_of_new
    assert (s2.total, s2.remaining_fraction, s2.events) == (0, None, ())
    t.add_window(first_of_new, BASE, 1000, 995)  # 5 bad of 10
    s3 = t.evaluate(first_of_new + 20 * S)
    assert s3.remaining_fraction == pytest.approx(0.5)
    assert s3.events == ()
    t.add_window(first_of_new + 10 * S, BASE, 1000, 985)  # 20 bad of 20
    s4 = t.evaluate(first_of_new + 30 * S)
    assert [e.kind for e in s4.events] == [BUDGET_80PCT_CONSUMED, BUDGET_EXHAUSTED]
    assert {e.period_start_ms for e in s4.events} == {first_of_new}
    # the old period's overspend is not carried over
    assert s4.consumed == 20
    assert s4.allowed == pytest.approx(20.0)


# one 1000-request window per step, objective 99 % (10 allowed bad each): (bad, events)
# consumed fraction after each step in the comment
EVENT_STEPS: list[tuple[int, list[str], list[str]]] = [
    # bad, events (rolling), events (calendar); consumed fraction after the step
    (5, [], []),  # 5/10 = 0.50
    (11, [BUDGET_80PCT_CONSUMED], [BUDGET_80PCT_CONSUMED]),  # 16/20 = 0.80
    (9, [], []),  # 25/30 = 0.83
    (15, [BUDGET_EXHAUSTED], [BUDGET_EXHAUSTED]),  # 40/40 = 1.00
    (20, [], []),  # 60/50 = 1.20
    (0, [], []),  # 60/60 = 1.00
    (0, [], []),  # 60/70 = 0.86: below 0.95, exhausted re-arms (rolling)
    (20, [BUDGET_EXHAUSTED], []),  # 80/80 = 1.00
    (0, [], []),  # 80/90 = 0.89
    (0, [], []),  # 80/100 = 0.80
    (3, [], []),  # 83/110 = 0.75: under 0.80 but not under 0.75: 80 % stays disarmed
    (10, [], []),  # 93/120 = 0.78
    (20, [], []),  # 113/130 = 0.87: no second 80 % event without re-arming
    (0, [], []),  # 113/140 = 0.81
    (0, [], []),  # 113/150 = 0.75
    (0, [], []),  # 113/160 = 0.71: 80 % re-arms (rolling)
    (20, [], []),  # 133/170 = 0.78
    (20, [BUDGET_80PCT_CONSUMED], []),  # 153/180 = 0.85
]


@pytest.mark.parametrize("window", ["rolling", "calendar"])
def test_budget_events_fire_once_and_rearm_with_hysteresis_on_rolling_windows(
    window: str,
) -> None:
    w = ROLLING_30D if window == "rolling" else Window(calendar="month")
    # the allowance is 1 % of the requests seen: a rolling window seen whole (an empty
    # window 30 d back), a calendar period whose 10 expected requests are always exceeded
    t = BudgetTracker("api", 0.99, w, DEFAULT, expected_requests=10)
    start = NOW + H
    t.add_window(start - 30 * D, BASE, 0, 0)
    for i, (bad, rolling_events, calendar_events) in enumerate(EVENT_STEPS):
        t.add_window(start + i * BASE, BASE, 1000, 1000 - bad)
        now = start + (i + 1) * BASE
        got = [e.kind for e in t.evaluate(now).events]
        assert got == (rolling_events if window == "rolling" else calendar_events), i
        assert t.evaluate(now).events == ()  # evaluating again emits nothing


def test_budget_event_carries_its_figures_and_min_requests_holds_events_back() -> None:
    rules = rules_yaml("budget_events: {min_requests: 5000}\n")
    t = BudgetTracker("api", 0.99, ROLLING_30D, rules, scope="llama")
    t.add_window(NOW - 30 * D + BASE, BASE, 0, 0)  # a whole window seen: no projection
    t.add_window(NOW, BASE, 1000, 900)  # 10x over budget, but only 1000 requests
    assert t.evaluate(NOW + BASE).events == ()
    t.add_window(NOW + BASE, BASE, 4000, 4000)
    (e80, ex) = t.evaluate(NOW + 2 * BASE).events
    assert (e80.kind, e80.slo, e80.scope, e80.at_ms) == (BUDGET_80PCT_CONSUMED, "api", "llama",
                                                          NOW + 2 * BASE)  # fmt: skip
    assert ex.kind == BUDGET_EXHAUSTED
    assert ex.consumed == 100
    assert ex.allowed == pytest.approx(50.0)
    assert ex.consumed_fraction == pytest.approx(2.0)


# --------------------------------------------------------------------------- #
# No traffic, resolution, out of order and split windows
# --------------------------------------------------------------------------- #


def test_no_traffic_gives_none_not_zero() -> None:
    t = BudgetTracker("api", 0.99, ROLLING_30D, DEFAULT)
    status = t.evaluate(NOW)
    assert set(status.burn_rates) == {"5m", "30m", "1h", "2h", "6h", "1d", "3d"}
    assert all(v is None for v in status.burn_rates.values())
    assert (status.total, status.compliance, status.remaining_fraction) == (0, None, None)
    assert (status.alerts, status.events) == ((), ())
    t.add_window(NOW - 2 * D, BASE, 0, 0)  # an empty window is no traffic either
    t.add_window(NOW - 2 * D + BASE, BASE, 100, 98)
    rates = t.evaluate(NOW).burn_rates
    assert [k for k, v in rates.items() if v is not None] == ["3d"]
    assert rates["3d"] == pytest.approx(2.0)


def test_long_ranges_are_whole_buckets_never_longer_than_asked() -> None:
    """At the far end of a rolling 30 d budget the resolution is 1 h (module docstring)."""
    t = BudgetTracker("api", 0.99, ROLLING_30D)
    now = NOW + 30 * M
    edge = now - 30 * D  # half past an hour
    t.add_window(edge - BASE, BASE, 10, 0)  # before the window: never counted
    t.add_window(edge + BASE, BASE, 20, 0)  # inside, but in the partly covered hour
    t.add_window(edge + 30 * M, BASE, 40, 0)  # in the first whole hour
    t.add_window(now - BASE, BASE, 80, 80)
    status = t.evaluate(now)
    assert status.total == 120
    assert t.counts(edge + 30 * M, now).total == 120  # hour-aligned: exact


def test_split_and_out_of_order_windows_add_up() -> None:
    t = BudgetTracker("api", 0.99, ROLLING_30D)
    t.add_window(NOW - 20 * S, BASE, 1000, 990)  # partition 0
    t.add_window(NOW - 10 * S, BASE, 300, 300)
    t.add_window(NOW - 20 * S, BASE, 500, 480)  # partition 1, same window, later
    t.add_window(NOW - 2 * H, BASE, 700, 690)  # an hour-old window arriving last
    c = t.counts(NOW - 5 * M, NOW)
    assert (c.total, c.bad) == (1800, 30)
    assert c.burn_rate == pytest.approx(30 / 18)
    assert t.evaluate(NOW).total == 2500


Window_ = tuple[int, int, int]  # start, total, good


def _windows(max_back: int) -> st.SearchStrategy[list[Window_]]:
    one = st.tuples(
        st.integers(1, max_back // BASE).map(lambda k: NOW - k * BASE),
        st.integers(0, 200),
        st.integers(0, 200),
    ).map(lambda w: (w[0], w[1], min(w[1], w[2])))
    return st.lists(one, max_size=120)


@settings(max_examples=150, deadline=None)
@given(
    wins=_windows(30 * D),
    bounds=st.lists(st.integers(0, 30 * 24), min_size=2, max_size=2),
    seed=st.integers(0, 2**32 - 1),
)
def test_range_sums_equal_brute_force_at_hour_alignment(
    wins: list[Window_], bounds: list[int], seed: int
) -> None:
    rnd = random.Random(seed)
    t = BudgetTracker("api", 0.99, ROLLING_30D)
    # roughly in time order, a few hours of disorder
    for start, total, good in sorted(wins, key=lambda w: w[0] + rnd.randrange(3 * H)):
        t.add_window(start, BASE, total, good)
    a, b = sorted(NOW - h * H for h in bounds)
    inside = [w for w in wins if a <= w[0] < b]
    c = t.counts(a, b)
    assert c.total == sum(w[1] for w in inside)
    assert c.bad == sum(w[1] - w[2] for w in inside)
    assert c.allowed == pytest.approx(0.01 * c.total, abs=1e-6)


@settings(max_examples=150, deadline=None)
@given(
    wins=_windows(2 * H),
    back=st.integers(1, 2 * H // BASE),
    parts=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_partition_parts_in_any_order_equal_whole_windows_in_order(
    wins: list[Window_], back: int, parts: int, seed: int
) -> None:
    rnd = random.Random(seed)
    whole = BudgetTracker("api", 0.99, ROLLING_30D, DEFAULT)
    split = BudgetTracker("api", 0.99, ROLLING_30D, DEFAULT)
    pieces: list[tuple[int, int, int]] = []
    for start, total, good in sorted(wins):
        whole.add_window(start, BASE, total, good)
        bad = total - good
        for p in range(parts):  # split total and bad among the partitions
            pt = total * (p + 1) // parts - total * p // parts
            pb = min(pt, bad)
            bad -= pb
            pieces.append((start, pt, pt - pb))
        assert bad == 0
    rnd.shuffle(pieces)
    for start, total, good in pieces:
        split.add_window(start, BASE, total, good)
    a = NOW - back * BASE
    assert split.counts(a, NOW)[:2] == whole.counts(a, NOW)[:2]
    sw, ss = whole.evaluate(NOW), split.evaluate(NOW)
    assert (ss.total, ss.consumed) == (sw.total, sw.consumed)
    for label, rate in sw.burn_rates.items():
        got = ss.burn_rates[label]
        assert got == rate if rate is None else got == pytest.approx(rate, rel=1e-9)
    assert [x.rule for x in ss.alerts] == [x.rule for x in sw.alerts]


def test_dense_windows_over_every_level_boundary_equal_brute_force() -> None:
    """Every 10 s window for 3 days: each range ending now is exact at its level's alignment."""
    t = BudgetTracker("api", 0.99, ROLLING_30D)
    now = NOW + 7 * BASE  # the levels' edges fall mid-minute and mid-hour
    starts = range(now - 3 * D - 2 * H, now, BASE)
    bad = {s: (s // BASE) % 7 for s in starts}
    for s in starts:
        t.add_window(s, BASE, 10, 10 - bad[s])
    prefix = [0]
    for s in starts:
        prefix.append(prefix[-1] + bad[s])

    def expect(a: int) -> int:  # bad in the windows starting in [a, now)
        first = max(0, (a - starts[0] + BASE - 1) // BASE)
        return prefix[-1] - prefix[first]

    # far ends aligned to the level that holds them (10 s up to 2 h 10 min back, 1 min up
    # to 26 h, then 1 h), so whole buckets are exact
    far = [now - k * BASE for k in range(1, 781)]
    far += [NOW - k * M for k in range(1, 1500, 3)]
    far += [NOW - k * H for k in range(1, 73)]
    for a in far:
        assert t.counts(a, now).bad == expect(a), (now - a) / M


def test_too_old_windows_are_dropped_and_counted() -> None:
    t = BudgetTracker("api", 0.99, Window(rolling="7d"))
    t.add_window(NOW, BASE, 10, 10)
    assert t.add_window(NOW - 7 * D, BASE, 10, 10) is True
    assert t.add_window(NOW - 8 * D, BASE, 10, 10) is False
    assert t.dropped == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((NOW, 0, 10, 5, None), "size_ms"),
        ((NOW, BASE, 10, 11, None), "good <= total"),
        ((NOW, BASE, -1, 0, None), "good <= total"),
        ((NOW, BASE, 10, 5, 1.0), "objective"),
        ((NOW, BASE, 10, 5, 0.0), "objective"),
    ],
)
def test_add_window_rejects_impossible_counts(
    args: tuple[int, int, int, int, float | None], message: str
) -> None:
    t = BudgetTracker("api", 0.99, ROLLING_30D)
    with pytest.raises(ValueError, match=message):
        t.add_window(*args)


def test_memory_is_fixed_per_tracker() -> None:
    t = BudgetTracker("api", 0.99, ROLLING_30D, DEFAULT)
    before = t.nbytes
    assert before < 200_000
    feed(t, NOW - 31 * D, NOW, 10)
    assert t.nbytes == before
    # 10 s for 2 h 10 min, 1 min for 1 d 2 h, 1 h for 30 d + 3 h
    assert t.buckets == 780 + 1560 + 723


# --------------------------------------------------------------------------- #
# The source documents' rules
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("bad_last_hour", "fires"),
    [(1728, True), (1727, False), (0, False), (4000, True)],
)
def test_twenty_percent_of_the_daily_budget_within_an_hour(bad_last_hour: int, fires: bool) -> None:
    # 100 requests / 10 s, 99 %: 864,000 a day, 8,640 allowed bad a day; 20 % = 1,728
    t = BudgetTracker("api", 0.99, ROLLING_30D, only("daily-budget-20pct-in-1h"))
    feed(t, NOW - D, NOW - H, 100)
    feed(t, NOW - H, NOW, 100, bad_last_hour)
    status = t.evaluate(NOW)
    assert [a.rule for a in status.alerts] == (["daily-budget-20pct-in-1h"] if fires else [])
    if fires:
        (alert,) = status.alerts
        assert alert.severity == "page"
        assert alert.figures["allowed_1d"] == pytest.approx(8640)
        assert alert.figures["spent_fraction"] == pytest.approx(bad_last_hour / 8640)
        assert alert.figures["equivalent_burn_rate"] == pytest.approx(4.8)
    # with steady traffic the threshold is a burn rate over 1h of 0.2 x 24 = 4.8
    assert (status.burn_rates["1h"] or 0) >= 4.8 - 1e-9 if fires else True


@pytest.mark.parametrize(
    ("burn_1h", "fires"),
    [(4.0, False), (4.8, True), (5.0, True)],
)
def test_daily_budget_rule_extrapolates_a_young_history(burn_1h: float, fires: bool) -> None:
    """One hour of history: the day's budget is 24 x that hour's, not that hour's alone."""
    t = BudgetTracker("api", 0.99, ROLLING_30D, only("daily-budget-20pct-in-1h"))
    feed(t, NOW - H, NOW, 100, round(burn_1h * 360))  # 36,000 requests, 360 allowed bad
    status = t.evaluate(NOW)
    assert bool(status.alerts) is fires


def _steps(t: BudgetTracker, start: int, pattern: str, per: int = 100) -> list[int]:
    """One window per character (L: 97 % good, H: all good, Z: none good, N: no window),
    evaluated at each window's end; returns the steps at which the tracker alerts."""
    firing: list[int] = []
    for i, ch in enumerate(pattern):
        good = {"L": per * 97 // 100, "H": per, "Z": 0}.get(ch)
        if good is not None:
            t.add_window(start + i * BASE, BASE, per, good)
        if t.evaluate(start + (i + 1) * BASE).alerts:
            firing.append(i)
    return firing


STREAK = rules_yaml(
    "rules:\n"
    "  - {name: c, kind: compliance_below, severity: page, window: 10s, below: 0.98, for: 10m}\n"
)


@pytest.mark.parametrize(
    ("pattern", "first"),
    [
        ("L" * 61, 60),  # low at 61 consecutive evaluations = 10 min after the first
        ("L" * 60, None),
        ("L" * 30 + "H" + "L" * 61, 91),  # a good evaluation restarts the clock
        ("L" * 59 + "N" + "L" * 59, None),  # so does one without traffic
        ("H" * 10 + "L" * 70, 70),
    ],
    ids=["61-low", "60-low", "reset-by-good", "reset-by-no-traffic", "late-start"],
)
def test_compliance_below_needs_consecutive_evaluations_for_the_whole_duration(
    pattern: str, first: int | None
) -> None:
    t = BudgetTracker("api", 0.99, ROLLING_30D, STREAK)
    firing = _steps(t, NOW, pattern)
    assert (firing[0] if firing else None) == first
    if first is not None:
        assert firing == list(range(first, len(pattern)))


def test_slo_violation_imminent_over_5m_fires_after_10_min_not_on_one_dip() -> None:
    rules = only("slo-violation-imminent")
    # 10 min all good, then 97 %: the 5-min compliance drops below 98 % once 21 of
    # its 30 windows are at 97 % (63/3000 bad; 20 windows is exactly 98 %) = step 80,
    # and has stayed below for 10 min at step 140
    t = BudgetTracker("api", 0.99, ROLLING_30D, rules)
    firing = _steps(t, NOW, "H" * 60 + "L" * 100)
    assert firing[0] == 140
    (alert,) = t.evaluate(NOW + 160 * BASE).alerts
    assert alert.figures["below_since_ms"] == NOW + 81 * BASE
    assert alert.figures["compliance_5m"] == pytest.approx(0.97)
    # one bad window pulls the 5-min compliance under 98 % for 5 minutes only
    dip = BudgetTracker("api", 0.99, ROLLING_30D, rules)
    assert _steps(dip, NOW, "H" * 30 + "Z" + "H" * 200) == []


# --------------------------------------------------------------------------- #
# Many trackers
# --------------------------------------------------------------------------- #


def _row(
    slo: str, kind: str, objective: float, total: int, good: int, *, sec: int = 0, w: float = 0.0
) -> SLOWindowRow:
    return SLOWindowRow(slo, kind, "", 0.0, objective, total, good, sec, w)


def test_budget_book_runs_one_tracker_per_slo_and_scope() -> None:
    spec = load_spec_file(REPO / "specs" / "slo-example.yaml")
    book = BudgetBook(spec, DEFAULT)
    start = NOW
    book.add_window("gold-ttfb", start, BASE, 50, 50)  # another scope: all traffic
    for i in range(130):  # 97 % for 21 min 40 s, evaluated every window
        rows = [
            _row("gold-ttfb", "slo", 0.99, 100, 97),
            _row("silver-ttfb", "slo", 0.95, 100, 97),
            _row("blended", "blended", 0.99, 100, 90, sec=10, w=0.7),
        ]
        book.add_rows(start + i * BASE, BASE, rows, scope="llama")
        statuses = {(s.slo, s.scope): s for s in book.evaluate(start + (i + 1) * BASE)}
    assert list(statuses) == [
        ("blended", "llama"),
        ("gold-ttfb", "*"),
        ("gold-ttfb", "llama"),
        ("silver-ttfb", "llama"),
    ]
    gold = statuses["gold-ttfb", "llama"]
    assert gold.window == "calendar month"
    assert "slo-violation-imminent" in {a.rule for a in gold.alerts}
    # 97 % meets a 95 % objective: the 98 % rule does not apply to it
    silver = statuses["silver-ttfb", "llama"]
    assert silver.alerts == ()
    # 60 % of the allowance of the requests seen (21 min 40 s), projected over 30 d from
    # (at least) an hour: 0.6 / 720 of it
    assert silver.consumed / silver.observed_allowed == pytest.approx(0.03 / 0.05)
    assert silver.allowance_basis == "projected"
    assert silver.remaining_fraction == pytest.approx(1 - 0.6 / 720)
    # blended: good = 90 + 0.7 x 10 = 97 of 100
    blended = statuses["blended", "llama"]
    assert blended.consumed == pytest.approx(130 * 3.0)
    assert blended.window == "rolling 30d"
    assert statuses["gold-ttfb", "*"].total == 50
    with pytest.raises(KeyError, match="nope"):
        book.tracker("nope")
    alerts = {a["rule"]: a for a in gold.to_json()["alerts"]}
    assert alerts["slo-violation-imminent"]["severity"] == "page"
    assert alerts["ticket-slow-burn"]["figures"]["burn_3d"] == pytest.approx(3.0)  # 3 % / 1 %


# --------------------------------------------------------------------------- #
# The rules file
# --------------------------------------------------------------------------- #


def test_shipped_rules_encode_the_workbook_and_the_documents() -> None:
    assert DEFAULT_BURN_RULES_PATH == REPO / "specs" / "burn-rules.yaml"
    burn = [
        (r.name, r.severity, r.factor, r.long, r.short)
        for r in DEFAULT.rules
        if isinstance(r, BurnRateRule)
    ]
    assert burn == [
        ("page-fast-burn", "page", 14.4, "1h", "5m"),
        ("page-slow-burn", "page", 6, "6h", "30m"),
        ("ticket-fast-burn", "ticket", 3, "1d", "2h"),
        ("ticket-slow-burn", "ticket", 1, "3d", "6h"),
    ]
    frac = DEFAULT.rule("daily-budget-20pct-in-1h")
    assert isinstance(frac, BudgetFractionRule)
    assert (frac.fraction, frac.within, frac.of) == (0.20, "1h", "1d")
    assert frac.equivalent_burn_rate == pytest.approx(4.8)
    comp = DEFAULT.rule("slo-violation-imminent")
    assert isinstance(comp, ComplianceBelowRule)
    assert (comp.window_ms, comp.below, comp.for_ms) == (5 * M, 0.98, 10 * M)
    assert DEFAULT.budget_events.rearm_margin == 0.05
    assert DEFAULT.budget_events.min_observed_ms == H


VALID_RULES = """\
apiVersion: tailguard/v1
kind: BurnRules
rules:
  - name: fast
    kind: burn_rate
    severity: page
    factor: 14.4
    long: 1h
    short: 5m
  - name: daily
    kind: budget_fraction
    severity: page
    fraction: 0.2
    within: 1h
    of: 1d
  - name: imminent
    kind: compliance_below
    severity: page
    window: 5m
    below: 0.98
    for: 10m
"""

# (old text, new text, field path, part of the message)
BAD_RULES = [
    ("factor: 14.4", "factor: -1", "rules[0].factor", "greater than 0"),
    ("factor: 14.4", 'factor: "14.4"', "rules[0].factor", "valid number"),
    ("long: 1h", "long: 60", "rules[0].long", "no unit"),
    ("long: 1h", "long: 1 hour", "rules[0].long", "invalid duration"),
    ("long: 1h", "long: 100d", "rules[0].long", "90d"),
    ("short: 5m", "short: 2h", "rules[0].short", "shorter than long"),
    ("kind: burn_rate", "kind: burn", "rules[0].kind", "unknown kind 'burn'"),
    ("    kind: burn_rate\n", "", "rules[0].kind", "missing kind"),
    ("severity: page\n    factor", "severity: critical\n    factor", "rules[0].severity", "page"),
    ("factor: 14.4", "factor: 14.4\n    threshold: 1", "rules[0].threshold", "unknown field"),
    ("name: daily", "name: fast", "rules[1].name", "duplicate rule name"),
    ("name: fast", "name: Fast_Burn", "rules[0].name", "invalid name"),
    ("within: 1h", "within: 2d", "rules[1].within", "not be longer than of"),
    ("fraction: 0.2", "fraction: 20", "rules[1].fraction", "less than or equal to 1"),
    ("below: 0.98", "below: 98", "rules[2].below", "less than or equal to 1"),
    ("    for: 10m\n", "", "rules[2].for", "Field required"),
    ("apiVersion: tailguard/v1", "apiVersion: v2", "apiVersion", "tailguard/v1"),
    ("kind: BurnRules", "kind: SLOSpec", "kind", "BurnRules"),
    ("rules:", "budget_events: {rearm_margin: 1}\nrules:", "budget_events.rearm_margin",
     "less than 1"),
    ("rules:", "alerts: []\nrules:", "alerts", "unknown field"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "path", "part"), BAD_RULES, ids=[f"{c[2]}-{i}" for i, c in enumerate(BAD_RULES)]
)
def test_rules_file_errors_name_the_field(old: str, new: str, path: str, part: str) -> None:
    assert old in VALID_RULES
    text = VALID_RULES.replace(old, new, 1)
    with pytest.raises(SpecError) as info:
        load_burn_rules(text, "burn.yaml")
    err = info.value
    assert [i.path for i in err.errors] == [path], str(err)
    (line,) = str(err).splitlines()
    assert line.startswith(f"burn.yaml: {path}: ")
    assert part in line
    assert err.errors[0].line is not None


def test_valid_rules_load_and_other_file_problems_are_reported(tmp_path: Path) -> None:
    rules = load_burn_rules(VALID_RULES)
    assert [r.kind for r in rules.rules] == ["burn_rate", "budget_fraction", "compliance_below"]
    for text, part in [
        ("rules: [", "YAML error"),
        ("- a\n- b\n", "must be a YAML mapping"),
        ("", "got empty"),
        ("apiVersion: tailguard/v1\napiVersion: tailguard/v1\nkind: BurnRules\n", "duplicate key"),
    ]:
        with pytest.raises(SpecError, match=part):
            load_burn_rules(text)
    with pytest.raises(SpecError, match="cannot read rules"):
        load_burn_rules_file(tmp_path / "missing.yaml")
    good = tmp_path / "rules.yaml"
    good.write_text(VALID_RULES)
    assert load_burn_rules_file(good) == rules
    # constructing the models in Python runs the same cross-field checks
    with pytest.raises(ValueError, match="shorter than long"):
        BurnRules.model_validate(
            {
                "apiVersion": "tailguard/v1",
                "kind": "BurnRules",
                "rules": [
                    {
                        "name": "x",
                        "kind": "burn_rate",
                        "severity": "page",
                        "factor": 2.0,
                        "long": "5m",
                        "short": "1h",
                    }
                ],
            }
        )


@pytest.mark.parametrize(
    ("ms", "label"), [(5 * M, "5m"), (H, "1h"), (60 * M, "1h"), (3 * D, "3d"), (90 * S, "90s")]
)
def test_window_labels(ms: int, label: str) -> None:
    assert window_label(ms) == label
