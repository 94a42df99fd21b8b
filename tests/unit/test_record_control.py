"""The enforcement's fields on the record (issue 48): gateway.completed's ``control_mode``
and ``control_verdict`` are carried to ``RequestRecord`` like its ``slo_*_ms``, by the
join, from the terminal event the record keeps."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.contract.wire import from_model
from pipeline.core.record import build_record
from tests.factories import completed, finished, joined, received


def _completed(rid: str, mode: str | None, verdict: str | None, **kw: Any) -> Any:
    ev = completed(rid, **kw)
    return ev.model_copy(update={"control_mode": mode, "control_verdict": verdict})


# (events the record is built from, control mode, verdict, outcome, what the record holds)
CASES = [
    ("rcf", None, None, "ok", (None, None)),
    ("rcf", "shadow", None, "ok", ("shadow", None)),
    ("rcf", "shadow", "admission", "ok", ("shadow", "admission")),
    ("rc", "enforce", "shed_priority", "rejected", ("enforce", "shed_priority")),
    ("rc", "enforce", "queue_timeout", "rejected", ("enforce", "queue_timeout")),
    ("c", "enforce", "rate_limit", "rejected", ("enforce", "rate_limit")),
    ("cf", "shadow", "new_session", "ok", ("shadow", "new_session")),
    ("rc", "enforce", None, "ok", ("enforce", None)),
    # no gateway.completed: nothing tells the mode
    ("rf", None, None, "ok", (None, None)),
    ("f", None, None, "ok", (None, None)),
]


def _events(kinds: str, mode: str | None, verdict: str | None, outcome: str) -> dict[str, Any]:
    status = 429 if outcome == "rejected" else 200
    return {
        "r": received("q") if "r" in kinds else None,
        "c": _completed("q", mode, verdict, outcome=outcome, http_status=status)
        if "c" in kinds
        else None,
        "f": finished("q") if "f" in kinds else None,
    }


@pytest.mark.parametrize(("kinds", "mode", "verdict", "outcome", "want"), CASES)
def test_build_record_carries_the_control_fields(
    kinds: str, mode: str | None, verdict: str | None, outcome: str, want: tuple[Any, Any]
) -> None:
    ev = _events(kinds, mode, verdict, outcome)
    for wire in (False, True):  # the reference's events and the fast decoder's
        conv = {k: (from_model(v) if wire and v is not None else v) for k, v in ev.items()}
        r = build_record("q", conv["r"], conv["c"], conv["f"])
        assert (r.control_mode, r.control_verdict) == want
        assert r.outcome == (outcome if "c" in kinds else "ok")


@pytest.mark.parametrize(("kinds", "mode", "verdict", "outcome", "want"), CASES)
def test_the_join_carries_them(
    kinds: str, mode: str | None, verdict: str | None, outcome: str, want: tuple[Any, Any]
) -> None:
    ev = _events(kinds, mode, verdict, outcome)
    events = [e for e in ev.values() if e is not None]
    (rec,) = joined(events)
    assert (rec.control_mode, rec.control_verdict) == want


def test_a_conflicting_completed_brings_its_own_verdict() -> None:
    """Two gateway.completed for one request (shadow ok, then enforce rejected): the record
    keeps the worse one whole, its control fields with it, in either order."""
    ok = _completed("q", "shadow", "admission", eid="c1")
    rejected = _completed("q", "enforce", "admission", eid="c2", outcome="rejected",
                          http_status=429)  # fmt: skip
    for order in ([ok, rejected], [rejected, ok]):
        recs = joined([received("q"), *order, finished("q")])
        last = recs[-1]
        assert (last.outcome, last.control_mode, last.control_verdict) == (
            "rejected", "enforce", "admission",
        )  # fmt: skip
        assert last.conflicts == 1
