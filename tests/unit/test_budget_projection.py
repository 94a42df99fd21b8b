"""Allowances honest about how much of the window was seen, and budget events at most
once per SLO, scope and period (pipeline.core.budget: "Allowance", "Budget events")."""

from __future__ import annotations

import datetime as dt

import pytest

from pipeline.core.budget import (
    BUDGET_80PCT_CONSUMED,
    BUDGET_EXHAUSTED,
    EXPECTED,
    OBSERVED,
    PROJECTED,
    BudgetBook,
    BudgetTracker,
    budget_allowance,
    min_observed_ms,
)
from pipeline.spec.burn_rules import load_burn_rules, load_burn_rules_file
from pipeline.spec.loader import SpecError
from pipeline.spec.slo import Window, load_spec

BASE = 10_000
M = 60_000
H = 3_600_000
D = 86_400_000
RULES = load_burn_rules_file()


def _ms(year: int, month: int, day: int, hour: int = 0) -> int:
    return int(dt.datetime(year, month, day, hour, tzinfo=dt.UTC).timestamp()) * 1000


# (case, observed allowance, period, observed span, min span, expected allowance,
#  allowance, basis)
ALLOWANCE_CASES = [
    ("whole window seen", 300.0, 30 * D, 30 * D, H, None, 300.0, OBSERVED),
    ("more than the window seen", 300.0, 30 * D, 31 * D, H, None, 300.0, OBSERVED),
    ("one day of 30: rate x 30", 10.0, 30 * D, D, H, None, 300.0, PROJECTED),
    ("two hours of 30 d: x 360", 1.0, 30 * D, 2 * H, H, None, 360.0, PROJECTED),
    ("one minute counts as an hour", 1.0, 30 * D, M, H, None, 720.0, PROJECTED),
    ("nothing seen yet: no traffic, no allowance", 0.0, 30 * D, 0, H, None, 0.0, PROJECTED),
    ("min span longer than the window", 2.0, 30 * M, 10 * M, H, None, 2.0, PROJECTED),
    ("calendar month, 744 h, one hour seen", 1.0, 31 * D, H, H, None, 744.0, PROJECTED),
    ("expected volume rules before the window is whole", 1.0, 30 * D, D, H, 500.0, 500.0,
     EXPECTED),
    ("more seen than expected: what was seen", 900.0, 30 * D, 29 * D, H, 500.0, 900.0,
     EXPECTED),
    ("whole window seen: the expected volume no longer counts", 300.0, 30 * D, 30 * D, H,
     500.0, 300.0, OBSERVED),
]  # fmt: skip


@pytest.mark.parametrize("row", ALLOWANCE_CASES, ids=[c[0] for c in ALLOWANCE_CASES])
def test_allowance_is_projected_until_the_window_was_seen_whole(
    row: tuple[str, float, int, int, int, float | None, float, str],
) -> None:
    _, seen, period, span, floor, expected, allowed, basis = row
    got = budget_allowance(
        seen, period_ms=period, observed_ms=span, min_observed_ms=floor,
        expected_allowed=expected,
    )  # fmt: skip
    assert got.allowed == pytest.approx(allowed, rel=1e-12)
    assert got.basis == basis


@pytest.mark.parametrize(
    ("period", "floor", "want"),
    [(30 * D, H, H), (31 * D, H, H), (12 * H, H, H), (H, H, 5 * M), (6 * H, H, 30 * M),
     (30 * D, 10 * M, 10 * M)],
)  # fmt: skip
def test_min_observed_is_an_hour_or_a_twelfth_of_a_shorter_window(
    period: int, floor: int, want: int
) -> None:
    assert min_observed_ms(period, floor) == want


def test_allowance_refuses_an_empty_window() -> None:
    with pytest.raises(ValueError, match="period_ms"):
        budget_allowance(1.0, period_ms=0, observed_ms=0, min_observed_ms=H)


def _hour_of_bad(window: Window, start: int, bad_share: float) -> list[tuple[int, list[str]]]:
    """A fresh tracker, one hour of 1000 requests / 10 s with ``bad_share`` bad, evaluated
    every window: (now, events) per evaluation."""
    t = BudgetTracker("api", 0.99, window, RULES)
    out = []
    for i in range(360):
        t.add_window(start + i * BASE, BASE, 1000, 1000 * (1 - bad_share))
        now = start + (i + 1) * BASE
        out.append((now, [e.kind for e in t.evaluate(now).events]))
    return out


@pytest.mark.parametrize(
    ("window", "consumed"),
    [
        # one hour of 100 % bad = 1/720 of 30 d of traffic: 1/720 / 1 % = 13.9 % of the budget
        (Window(rolling="30d"), 100 / 720),
        # of a 31-day month: 100 / 744 = 13.4 % (the "~14 %")
        (Window(calendar="month"), 100 / 744),
        (Window(calendar="week"), 100 / 168),
    ],
    ids=["rolling-30d", "calendar-month", "calendar-week"],
)
def test_a_fresh_store_does_not_exhaust_a_long_budget_in_an_hour_of_errors(
    window: Window, consumed: float
) -> None:
    start = _ms(2024, 3, 4)  # a Monday, the 4th: a week and a month under way
    evaluations = _hour_of_bad(window, start, 1.0)
    assert all(events == [] for _, events in evaluations)
    t = BudgetTracker("api", 0.99, window, RULES)
    for i in range(360):
        t.add_window(start + i * BASE, BASE, 1000, 0)
    status = t.evaluate(start + H)
    assert status.allowance_basis == PROJECTED
    assert status.consumed / status.allowed == pytest.approx(consumed, rel=1e-9)
    assert status.observed_ms == H


def test_the_old_allowance_would_have_exhausted_it_in_the_first_window() -> None:
    """What the projection fixes: the allowance of the traffic seen (one 10 s window)."""
    t = BudgetTracker("api", 0.99, Window(rolling="30d"), RULES)
    t.add_window(_ms(2024, 3, 4), BASE, 1000, 980)  # 2 % bad: 2x the objective's share
    status = t.evaluate(_ms(2024, 3, 4) + BASE)
    assert status.consumed / status.observed_allowed == pytest.approx(2.0)
    assert status.consumed / status.allowed == pytest.approx(2.0 / 720)  # 10 s as 1 h of 30 d
    assert status.events == ()


def test_rolling_hour_exhausts_once_at_the_window_the_projection_says() -> None:
    """1 h rolling, fresh: 1 % bad for 20 min, then 10 % bad. Consumed / allowance at
    each 10 s step is bad / (allowed seen x 1 h / max(seen, 5 min)); the first crossings
    are found by brute force here and the tracker must emit each event there, once."""
    start = _ms(2024, 3, 4, 9)
    window = Window(rolling="1h")
    t = BudgetTracker("api", 0.99, window, RULES)
    bad_total = allowed_total = 0.0
    want: dict[str, int] = {}
    got: dict[str, list[int]] = {BUDGET_80PCT_CONSUMED: [], BUDGET_EXHAUSTED: []}
    for i in range(360):
        bad = 10 if i < 120 else 100
        t.add_window(start + i * BASE, BASE, 1000, 1000 - bad)
        now = start + (i + 1) * BASE
        bad_total += bad
        allowed_total += 10
        fraction = bad_total / (allowed_total * H / max((i + 1) * BASE, 5 * M))
        for kind, threshold in ((BUDGET_80PCT_CONSUMED, 0.8), (BUDGET_EXHAUSTED, 1.0)):
            if fraction >= threshold and kind not in want:
                want[kind] = now
        for e in t.evaluate(now).events:
            got[e.kind].append(e.at_ms)
    assert set(want) == {BUDGET_80PCT_CONSUMED, BUDGET_EXHAUSTED}
    assert got == {k: [v] for k, v in want.items()}
    # 80 % at 0.8 x 6000 allowed over the hour... reached during the 10 % part
    assert start + 20 * M < want[BUDGET_80PCT_CONSUMED] < want[BUDGET_EXHAUSTED] < start + H


def test_calendar_events_fire_once_per_period_and_rearm_when_the_next_starts() -> None:
    """A week at 5 % bad against 99 %: exhausted once the bad requests reach the projected
    week's allowance; then never again that week; again in the next week."""
    week = Window(calendar="week")
    t = BudgetTracker("api", 0.99, week, RULES)
    monday = _ms(2024, 3, 4)
    kinds: list[tuple[str, int]] = []
    step = 10 * M  # one 10-minute window of 6000 requests, 300 bad
    for i in range(2 * 7 * 24 * 6):
        s = monday + i * step
        t.add_window(s, step, 6000, 5700)
        kinds.extend((e.kind, e.period_start_ms) for e in t.evaluate(s + step).events)
    assert kinds == [
        (BUDGET_80PCT_CONSUMED, monday), (BUDGET_EXHAUSTED, monday),
        (BUDGET_80PCT_CONSUMED, monday + 7 * D), (BUDGET_EXHAUSTED, monday + 7 * D),
    ]  # fmt: skip


def test_expected_requests_sets_the_budget_of_all_traffic_only() -> None:
    spec = load_spec(
        """
apiVersion: tailguard/v1
kind: SLOSpec
slos:
  - {name: ttft, boundary: gateway_ttfb_ms, threshold_ms: 1000, objective: 0.99,
     window: {calendar: month}, expected_requests: 1000000}
"""
    )
    book = BudgetBook(spec, RULES)
    start = _ms(2024, 3, 4)
    for scope in ("*", "llama"):
        book.add_window("ttft", start, BASE, 1000, 900, scope=scope)
    statuses = {s.scope: s for s in book.evaluate(start + BASE)}
    assert statuses["*"].allowance_basis == EXPECTED
    assert statuses["*"].allowed == pytest.approx(10_000)  # 1 % of a million
    assert statuses["llama"].allowance_basis == PROJECTED  # a model's share is not known
    assert statuses["llama"].allowed == pytest.approx(10 * 744)


@pytest.mark.parametrize("bad", ["0", "-5", "1.5", '"many"'])
def test_expected_requests_must_be_a_positive_integer(bad: str) -> None:
    with pytest.raises(SpecError, match=r"slos\[0\]\.expected_requests"):
        load_spec(
            "apiVersion: tailguard/v1\nkind: SLOSpec\nslos:\n"
            "  - {name: a, boundary: gateway_ttfb_ms, threshold_ms: 1, objective: 0.9, "
            f"expected_requests: {bad}}}\n"
        )


@pytest.mark.parametrize(("value", "ok"), [("30m", True), ("0s", False), ("1", False)])
def test_min_observed_is_a_duration(value: str, ok: bool) -> None:
    doc = f"apiVersion: tailguard/v1\nkind: BurnRules\nbudget_events: {{min_observed: {value}}}\n"
    if ok:
        assert load_burn_rules(doc).budget_events.min_observed_ms == 30 * M
    else:
        with pytest.raises(SpecError, match="min_observed"):
            load_burn_rules(doc)
