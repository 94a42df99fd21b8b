"""Burn-rate alerts need evidence: ``min_requests`` on a rule."""

from __future__ import annotations

import pytest

from pipeline.core.budget import BudgetBook
from pipeline.spec.burn_rules import load_burn_rules, load_burn_rules_file
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


def test_shipped_page_rules_wait_for_200_requests() -> None:
    rules = load_burn_rules_file()
    pages = {r.name: r.min_requests for r in rules.rules if r.severity == "page"}
    assert pages["page-fast-burn"] == pages["page-slow-burn"] == 200
