"""Issue 52's own-SLO figures (``pipeline.app.backtest._own_slo``): each attempt that
carries its own first-token SLO is judged against it by the SLO spec's one rule
(:class:`pipeline.core.slo.SLOMatcher`), as ``ttft-stream`` judges it against 2 s: a
client that stopped the stream after a first byte in time was served in time; a queue
cut-off is admitted and late; a refusal at the gateway is not admitted."""

from __future__ import annotations

import pytest

from pipeline.app.backtest import _own_slo
from pipeline.core.record import RequestRecord, build_record
from tests.factories import completed, finished, received

# (case, outcome, http status, control verdict, first byte ms (None: none), total ms,
#  own SLO ms) -> (admitted, good, late)
Row = tuple[str, str, int, str | None, float | None, float, float]
CASES: list[tuple[Row, tuple[int, int, int]]] = [
    (("served in time", "ok", 200, None, 250.0, 900.0, 300.0), (1, 1, 0)),
    (("served at the SLO exactly", "ok", 200, None, 300.0, 900.0, 300.0), (1, 1, 0)),
    (("served late", "ok", 200, None, 301.0, 900.0, 300.0), (1, 0, 1)),
    (
        (
            "stopped by its client after a first byte in time",
            "client_abort",
            0,
            None,
            250.0,
            600.0,
            300.0,
        ),
        (1, 1, 0),
    ),
    (
        (
            "stopped by its client after a late first byte",
            "client_abort",
            0,
            None,
            800.0,
            900.0,
            300.0,
        ),
        (1, 0, 1),
    ),
    (
        ("gave up before any byte, past its SLO", "client_abort", 0, None, None, 1200.0, 1000.0),
        (1, 0, 1),
    ),
    (
        (
            "gave up before any byte, within its SLO: unknown",
            "client_abort",
            0,
            None,
            None,
            500.0,
            1000.0,
        ),
        (1, 0, 0),
    ),
    (("cut off in the queue", "rejected", 503, "queue_timeout", 2.0, 752.0, 5000.0), (1, 0, 1)),
    (("refused as late", "rejected", 429, "deadline", 2.0, 2.0, 300.0), (0, 0, 0)),
    (("refused by admission", "rejected", 429, "admission", 2.0, 2.0, 300.0), (0, 0, 0)),
]


def _record(row: Row) -> RequestRecord:
    _case, outcome, status, verdict, ttfb, total, slo = row
    rcv = received("r", 0.0)
    cpl = completed(
        "r", total, total_ms=total, ttfb_ms=ttfb, outcome=outcome, http_status=status,
        control_mode="enforce" if verdict else None, control_verdict=verdict,
    ).model_copy(update={"slo_ttft_ms": slo})  # fmt: skip
    fin = finished("r", total - 5.0) if outcome == "ok" else None
    return build_record("r", rcv, cpl, fin)


@pytest.mark.parametrize(("row", "want"), CASES, ids=[c[0][0] for c in CASES])
def test_each_attempt_is_judged_against_its_own_slo_by_the_spec_rule(
    row: Row, want: tuple[int, int, int]
) -> None:
    got = _own_slo([_record(row)], 600.0)
    assert (got["admitted"], got["good"], got["late_admitted"]) == want
    assert got["requests"] == 1
    assert got["refused_as_late"] == (1 if row[3] == "deadline" else 0)


def test_the_totals_add_up_over_a_mix() -> None:
    got = _own_slo([_record(row) for row, _ in CASES], 10.0)
    admitted = sum(w[0] for _, w in CASES)
    late = sum(w[2] for _, w in CASES)
    assert got["admitted"] == admitted
    assert got["good"] == sum(w[1] for _, w in CASES)
    assert got["late_share"] == pytest.approx(late / admitted)
    assert got["goodput_rps"] == pytest.approx(got["good"] / 10.0)
