"""Burn-rate alerts need evidence: ``min_requests`` on a rule."""

from __future__ import annotations

import pytest

from pipeline.core.budget import BudgetBook
from pipeline.spec.burn_rules import BurnRateRule, load_burn_rules, load_burn_rules_file
from pipeline.spec.slo import load_spec

SPEC = load_spec(
    """
apiVersion: tailguard/v1
kind: SLOSpec
slos:
  - {name: ttft, boundary: gateway_ttfb_ms, threshold_ms: 1000, objective: 0.99}
"""
)


def _rules(min_requests: int) -> object:
    return load_burn_rules(
        f"""
apiVersion: tailguard/v1
kind: BurnRules
rules:
  - {{name: page-slow-burn, kind: burn_rate, severity: page, factor: 6, long: 6h, short: 30m,
     min_requests: {min_requests}}}
  - {{name: daily, kind: budget_fraction, severity: page, fraction: 0.2, within: 1h, of: 1d,
     min_requests: {min_requests}}}
"""
    )


@pytest.mark.parametrize(("min_requests", "pages"), [(0, True), (200, False)])
def test_one_bad_request_among_the_first_dozen_pages_only_without_min_requests(
    min_requests: int, pages: bool
) -> None:
    book = BudgetBook(SPEC, _rules(min_requests))  # type: ignore[arg-type]
    book.add_window("ttft", 0, 10_000, 14, 13)  # 1 of 14 bad: a "burn rate" of 7x
    alerts = [a.rule for st in book.evaluate(10_000) for a in st.alerts]
    assert bool(alerts) is pages


def test_with_enough_requests_the_rule_fires() -> None:
    book = BudgetBook(SPEC, _rules(200))  # type: ignore[arg-type]
    book.add_window("ttft", 0, 10_000, 400, 360)  # 10 % bad over 400 requests
    alerts = {a.rule for st in book.evaluate(10_000) for a in st.alerts}
    assert alerts == {"page-slow-burn", "daily"}


def test_shipped_burn_rate_rules_wait_for_200_requests() -> None:
    rules = load_burn_rules_file()
    burn = {r.name: r.min_requests for r in rules.rules if isinstance(r, BurnRateRule)}
    assert burn == dict.fromkeys(
        ("page-fast-burn", "page-slow-burn", "ticket-fast-burn", "ticket-slow-burn"), 200
    )
    assert rules.rule("daily-budget-20pct-in-1h").min_requests == 200


# The low-traffic rule reads the SHORT window: a burn over 1h and 5m both at 20x, with
# plenty of requests over the hour but (case 2) too few in its last 5 minutes.
SHORT_WINDOW_CASES = [
    # (requests per 10 s in the first 55 min, in the last 5 min, pages)
    (100, 100, True),  # 3000 requests in the last 5 min
    (100, 6, False),  # 180 < 200 in the last 5 min (5,680 over the hour)
    (100, 7, True),  # 210 >= 200
]


@pytest.mark.parametrize(("early", "late", "pages"), SHORT_WINDOW_CASES)
def test_burn_rate_rules_need_min_requests_in_their_short_window(
    early: int, late: int, pages: bool
) -> None:
    rules = load_burn_rules(
        """
apiVersion: tailguard/v1
kind: BurnRules
rules:
  - {name: page-fast-burn, kind: burn_rate, severity: page, factor: 14.4, long: 1h,
     short: 5m, min_requests: 200}
"""
    )
    book = BudgetBook(SPEC, rules)
    t0 = 10 * 3_600_000
    for i in range(360):  # one hour of 10 s windows, 20 % bad (20x a 1 % budget)
        n = early if i < 330 else late
        book.add_window("ttft", t0 + i * 10_000, 10_000, n, n * 0.8)
    (status,) = book.evaluate(t0 + 360 * 10_000)
    assert status.burn_rates["5m"] == pytest.approx(20.0)
    assert status.burn_rates["1h"] == pytest.approx(20.0)
    assert status.paging is pages
