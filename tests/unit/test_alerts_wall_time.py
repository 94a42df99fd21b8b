"""Alerts Alertmanager accepts: wall-time ``startsAt``/``endsAt`` (event time in the
annotations), ``endsAt`` after ``startsAt``, and a refused batch delivered alert by alert
(pipeline.core.alerts, pipeline.adapters.alerting)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from pipeline.adapters.alerting import AlertDelivery
from pipeline.core.alerts import AlertMessage, AlertTracker, rfc3339
from pipeline.core.budget import Alert, BudgetStatus

WALL = 1_764_000_000_000  # the wall clock of the evaluations below


def _status(now_ms: int, *rules: str) -> BudgetStatus:
    return BudgetStatus(
        slo="ttft", scope="*", now_ms=now_ms, objective=0.99, window="rolling 30d",
        period_start_ms=0, period_end_ms=now_ms, total=100, good=50.0, compliance=0.5,
        allowed=1.0, consumed=50.0, remaining_fraction=-49.0, burn_rates={},
        alerts=tuple(Alert(r, "page", {"factor": 14.4, "burn_1h": 50.0}) for r in rules),
    )  # fmt: skip


# (case, event time of the firing evaluation, of the resolving one; wall time of each)
CYCLES = [
    ("live: event time is wall time", WALL, WALL + 10_000, WALL, WALL + 10_000),
    ("replay of last year", WALL - 365 * 86_400_000, WALL - 365 * 86_400_000 + 10_000,
     WALL, WALL + 3),
    ("events ahead of the clock", WALL + 3_600_000, WALL + 3_610_000, WALL, WALL + 5),
    ("fired and resolved within one ms", WALL, WALL + 10_000, WALL, WALL),
    ("wall clock stepped back", WALL, WALL + 10_000, WALL, WALL - 1_000),
]  # fmt: skip


@pytest.mark.parametrize("cycle", CYCLES, ids=[c[0] for c in CYCLES])
def test_alert_times_are_wall_time_and_end_after_they_start(
    cycle: tuple[str, int, int, int, int],
) -> None:
    _, fire_ev, resolve_ev, fire_wall, resolve_wall = cycle
    tracker = AlertTracker()
    (firing,) = tracker.step([_status(fire_ev, "page-fast-burn")], fire_ev, wall_ms=fire_wall)
    assert firing.starts_at_ms == fire_wall
    assert dict(firing.annotations)["event_time"] == rfc3339(fire_ev)
    doc = firing.to_json()
    assert doc["startsAt"] == rfc3339(fire_wall)
    assert "endsAt" not in doc
    # re-sent while firing: same start, same event time
    (again,) = tracker.step(
        [_status(fire_ev + 1, "page-fast-burn")], fire_ev + 1, wall_ms=fire_wall + 1
    )
    assert (again.starts_at_ms, again.annotations) == (firing.starts_at_ms, firing.annotations)
    (resolved,) = tracker.step([_status(resolve_ev)], resolve_ev, wall_ms=resolve_wall)
    assert resolved.resolved
    assert resolved.ends_at_ms == max(resolve_wall, fire_wall + 1)
    notes = dict(resolved.annotations)
    assert notes["event_time"] == rfc3339(fire_ev)
    assert notes["resolved_event_time"] == rfc3339(resolve_ev)
    doc = resolved.to_json()
    assert doc["endsAt"] > doc["startsAt"]  # same format and zone: text order is time order


def test_an_alert_cannot_end_before_it_starts() -> None:
    with pytest.raises(ValueError, match="end after it starts"):
        AlertMessage((("alertname", "x"),), (), 1_000, 1_000)


def _message(name: str) -> AlertMessage:
    return AlertMessage((("alertname", name),) if name else (), (), WALL, None)


class _Refuses:
    """A fake Alertmanager: 400 for a request holding any alert without labels."""

    def __init__(self) -> None:
        self.requests: list[list[dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        alerts = orjson.loads(request.content)
        self.requests.append(alerts)
        if any(not a["labels"] for a in alerts):
            return httpx.Response(400, text="at least one label pair required")
        return httpx.Response(200)


@pytest.mark.parametrize(
    ("names", "requests", "rejected"),
    [
        (["a", "b", "c"], 1, 0),  # accepted whole
        (["a", "", "c"], 4, 1),  # refused: then a, "", c one by one
        (["", ""], 3, 2),
    ],
)
def test_a_refused_batch_is_delivered_alert_by_alert(
    names: list[str], requests: int, rejected: int
) -> None:
    fake = _Refuses()
    delivery = AlertDelivery("http://alertmanager.invalid", backoff_s=0.0)
    delivery._client.close()
    delivery._client = httpx.Client(transport=httpx.MockTransport(fake))
    try:
        delivery.send([_message(n) for n in names])
        assert delivery.flush(5.0)
    finally:
        delivery.close()
    assert len(fake.requests) == requests
    delivered = [a["labels"]["alertname"] for req in fake.requests[1:] for a in req if a["labels"]]
    if requests > 1:
        assert delivered == [n for n in names if n]
    assert delivery.counters["rejected"] == rejected
    assert delivery.counters["failed"] == 0
