"""Deadline-aware admission and tenants in the one enforcement (issue 52):
producers/enforcement.py, as tables."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.contract.control_signal import Actions
from producers.control_client import Directive
from producers.enforcement import (
    DEADLINE_MARGIN,
    STATUS,
    Enforcement,
    Modes,
    RequestFacts,
    late_by_ms,
    predicted_ttft_ms,
)
from producers.gateway_queue import error_percentiles


def _d(level: int = 1, **actions: Any) -> Directive:
    return Directive(level=level, phase="degraded", actions=Actions(**actions), scope="m")  # type: ignore[arg-type]


def _r(priority: int = 2, slo: float | None = None, tenant: str | None = None) -> RequestFacts:
    return RequestFacts(model="m", priority=priority, request_key="k", slo_ttft_ms=slo,
                        tenant=tenant)  # fmt: skip


# 1,000 ms predicted in all; refused beyond 25 % over the request's own SLO
PREDICTED = {"ttft_queue_ms": 900.0, "ttft_service_ms": 100.0, "deadline_margin": 0.25}

DEADLINE = [
    # (id, directive, request, reason, retry-after before the spread)
    ("late-refused", _d(**PREDICTED), _r(2, slo=300.0), "deadline"),
    ("late-p1-refused", _d(**PREDICTED), _r(1, slo=500.0), "deadline"),
    ("p0-never", _d(**PREDICTED), _r(0, slo=100.0), None),
    ("in-time-admitted", _d(**PREDICTED), _r(3, slo=2000.0), None),
    # within the margin: 1,000 ms against 800 ms x (1 + 0.25) = 1,000 ms
    ("within-margin", _d(**PREDICTED), _r(2, slo=800.0), None),
    ("no-slo-admitted", _d(**PREDICTED), _r(2), None),
    ("no-prediction-admitted", _d(deadline_margin=0.25), _r(2, slo=1.0), None),
    ("no-margin-never-late", _d(ttft_queue_ms=900.0, ttft_service_ms=100.0), _r(2, slo=1.0), None),
    ("level-0-admits", _d(0, **PREDICTED), _r(3, slo=1.0), None),
]


@pytest.mark.parametrize(("directive", "request_", "reason"), [c[1:] for c in DEADLINE],
                         ids=[c[0] for c in DEADLINE])  # fmt: skip
def test_deadline_rule(directive: Directive, request_: RequestFacts, reason: str | None) -> None:
    e = Enforcement()
    d = e.decide(directive, request_, 0.0)
    assert d.verdict.reason == reason
    if reason is not None:
        assert d.verdict.status == STATUS["deadline"] == 429
        assert 1 <= d.verdict.retry_after_s <= directive.actions.retry_after_s
        assert e.refusals[("enforce", "m", request_.priority, "deadline")] == 1
    elif directive.level > 0 and directive.actions.ttft_queue_ms is not None:
        assert d.verdict.predicted_ttft_ms == pytest.approx(1000.0)


@pytest.mark.parametrize(
    ("predicted", "slo", "margin", "late"),
    [
        (None, 100.0, 0.25, None),
        (500.0, None, 0.25, None),
        (5000.0, 300.0, None, None),  # no margin: never late
        (1000.0, 1000.0, 0.25, None),
        (1250.0, 1000.0, 0.25, None),  # exactly at the margin
        (1251.0, 1000.0, 0.25, 251.0),
        (5000.0, 300.0, 0.25, 4700.0),
        (1100.0, 1000.0, 0.0, 100.0),
    ],
)
def test_late_by(
    predicted: float | None, slo: float | None, margin: float | None, late: float | None
) -> None:
    assert late_by_ms(predicted, slo, margin) == late


@pytest.mark.parametrize(
    ("queue", "cutoff", "margin", "late"),
    [
        (1_000.0, 750.0, 0.25, 250.0),  # past 750 ms x 1.25: it would be cut off
        (937.5, 750.0, 0.25, None),  # exactly at the margin
        (900.0, 750.0, 0.0, 150.0),
        (5_000.0, None, 0.25, None),  # no cut-off for its priority
        (None, 750.0, 0.25, None),  # no queue figure
        (5_000.0, 750.0, None, None),  # no margin: never late
    ],
)
def test_late_by_its_queue_cutoff_whatever_its_slo(
    queue: float | None, cutoff: float | None, margin: float | None, late: float | None
) -> None:
    """A 5 s SLO is met by a 1.1 s prediction, but a wait past the cut-off is cut (503)."""
    assert late_by_ms(1_100.0, 5_000.0, margin, queue_ms=queue, cutoff_ms=cutoff) == late


@pytest.mark.parametrize(
    ("actions", "want"),
    [
        ({}, None),
        ({"ttft_queue_ms": 0.0}, 0.0),
        ({"ttft_queue_ms": 250.0, "ttft_service_ms": 40.0}, 290.0),
        ({"ttft_service_ms": 40.0}, None),  # no queue figure: no prediction
    ],
)
def test_predicted_ttft(actions: dict[str, float], want: float | None) -> None:
    assert predicted_ttft_ms(Actions(**actions)) == want


def test_late_retry_after_is_the_predicted_excess() -> None:
    """5.3 s late -> 6 s before the spread (at most retry_after_s)."""
    d = Enforcement().decide(
        _d(ttft_queue_ms=5_500.0, ttft_service_ms=100.0, deadline_margin=0.25, retry_after_s=30),
        _r(2, slo=300.0),
        0.0,
    )
    assert d.verdict.reason == "deadline"
    assert 3 <= d.verdict.retry_after_s <= 6
    capped = Enforcement().decide(
        _d(ttft_queue_ms=90_000.0, deadline_margin=DEADLINE_MARGIN, retry_after_s=4),
        _r(2, slo=300.0),
        0.0,
    )
    assert 2 <= capped.verdict.retry_after_s <= 4


def test_shadow_counts_would_have_refused_as_late_and_admits() -> None:
    e = Enforcement(Modes("shadow"))
    d = e.decide(_d(**PREDICTED), _r(2, slo=300.0), 0.0)
    assert d.would_refuse == "deadline"
    assert d.act.reason is None
    assert e.refusals[("shadow", "m", 2, "deadline")] == 1


def test_prediction_error_of_admitted_requests() -> None:
    e = Enforcement()
    for actual in (400.0, 900.0, 1000.0, 1100.0, 3000.0):
        d = e.decide(_d(**PREDICTED), _r(2, slo=5000.0), 0.0)
        e.queue.observe_ttft(d.verdict.predicted_ttft_ms, actual)
    e.queue.observe_ttft(
        e.decide(_d(**PREDICTED), _r(2), 0.0).verdict.predicted_ttft_ms, None
    )  # no first byte
    assert e.queue.prediction_error() == {"n": 5, "p50_ms": 0.0, "p90_ms": 600.0}
    assert error_percentiles([]) == {"n": 0, "p50_ms": None, "p90_ms": None}


def test_the_heavy_tenant_is_refused_first_under_admission() -> None:
    """Under a fair directive the enforcement tells the admission the tenant: a tenant
    sending six times the other absorbs the refusals; blind, both are refused."""
    refused = {}
    for fair in (True, False):
        e = Enforcement()
        d = _d(admit_rps=40.0, admit_gateways=1, retry_after_s=10, fair_share=fair)
        for i in range(6_000):  # 60 s at 100/s: heavy ~86/s, light ~14/s, priority 1
            tenant = "light" if i % 7 == 3 else "heavy"
            if e.decide(d, _r(1, tenant=tenant), i * 10.0).refused and i >= 2_000:
                refused[fair, tenant] = refused.get((fair, tenant), 0) + 1
    assert refused.get((True, "light"), 0) == 0
    assert refused[True, "heavy"] > 2_000
    assert refused[False, "light"] > 100  # blind (fair_share false): the light one too
