"""Strict tiers through the one enforcement (issue 47): a retry over the retry budget is
admitted only in place of a lower priority, so no rule of producers/enforcement.py turns a
priority away while a lower one is admitted at the same gateway and scope."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pipeline.contract.control_signal import Actions
from producers.control_client import Directive
from producers.enforcement import Enforcement, Modes, RequestFacts


def _d(**actions: Any) -> Directive:
    return Directive(level=1, phase="degraded", actions=Actions(**actions), scope="m")  # type: ignore[arg-type]


def _r(priority: int, attempt: int = 0, key: str = "k") -> RequestFacts:
    return RequestFacts(model="m", priority=priority, request_key=key, attempt=attempt)


def _firsts(e: Enforcement, d: Directive, demand: dict[int, float], until_ms: float) -> None:
    """First attempts at ``demand`` (requests/s per priority), evenly spaced."""
    events = []
    for p, rps in demand.items():
        step = 1000.0 / rps
        events += [(i * step + p, p) for i in range(int(until_ms / step))]
    for i, (t, p) in enumerate(sorted(events)):
        e.decide(d, _r(p, key=f"f{i}"), t)


NO_BUDGET = Modes(retry_budget_ratio=0.0, retry_budget_min_retries=0)  # every retry is over it

OVER_BUDGET = [
    # (id, directive actions, first attempts per priority (req/s) for 20 s, the retry's
    #  priority, want: its reason)
    ("p1-retry-takes-the-place-of-p3", {"admit_rps": 10.0}, {3: 2.0}, 1, None),
    ("p2-retry-takes-the-place-of-p3", {"admit_rps": 10.0}, {1: 2.0, 3: 2.0}, 2, None),
    ("p3-retry-has-no-lower-priority", {"admit_rps": 10.0}, {3: 2.0}, 3, "retry_budget"),
    ("p1-retry-refused-when-every-lower-is", {"admit_rps": 3.0}, {1: 1.0, 2: 6.0, 3: 6.0}, 1,
     "retry_budget"),
    ("no-admission-rate-refused-as-before", {"shed_priorities_at_or_above": 3}, {3: 2.0}, 1,
     "retry_budget"),
    ("shed-priority-still-refused-by-budget", {"admit_rps": 10.0, "shed_priorities_at_or_above": 2},
     {3: 2.0}, 2, "retry_budget"),
    ("priority-0-never", {"admit_rps": 1.0}, {1: 4.0, 2: 4.0, 3: 4.0}, 0, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("actions", "demand", "p", "want"),
    [c[1:] for c in OVER_BUDGET],
    ids=[c[0] for c in OVER_BUDGET],
)
def test_a_retry_over_budget_is_admitted_only_in_place_of_a_lower_priority(
    actions: dict[str, Any], demand: dict[int, float], p: int, want: str | None
) -> None:
    e, d = Enforcement(NO_BUDGET), _d(retry_after_s=20, **actions)
    _firsts(e, d, demand, 20_000.0)
    v = e.decide(d, _r(p, attempt=1, key="retry"), 20_000.0).act
    assert v.reason == want
    if want == "retry_budget":
        assert (v.status, v.should_retry) == (429, False)


def test_no_priority_is_refused_while_a_lower_one_is_admitted() -> None:
    """A mixed overload of first attempts and retries (every third a retry; the budget at
    its default): at every refusal of priority p, a first attempt of any lower priority q
    arriving at the same instant is refused too (probed on a copy)."""
    e, d = Enforcement(), _d(admit_rps=6.0, retry_after_s=20)
    demand = {0: 1.0, 1: 3.0, 2: 4.0, 3: 3.0}
    events = []
    for p, rps in demand.items():
        step = 1000.0 / rps
        events += [(i * step + 7 * p, p, i) for i in range(int(60_000 / step))]
    refused = dict.fromkeys(demand, 0)
    for t, p, i in sorted(events):
        v = e.decide(d, _r(p, attempt=1 if i % 3 == 0 else 0, key=f"{p}:{i}"), t).act
        if v.reason is None:
            continue
        refused[p] += 1
        for q in range(p + 1, 4):
            probe = copy.deepcopy(e)
            assert probe.decide(d, _r(q, key="probe"), t).act.reason is not None, (t, p, q)
    assert refused[0] == 0
    assert refused[1] > 0  # the overload reaches priority 1: the check had something to do
