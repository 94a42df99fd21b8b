"""Per-logical-request counting (issue 47, pipeline/core/logical.py) on a table of attempt
chains: a logical request counts once, by its final attempt's outcome and the latency the
client saw from its first attempt when one gateway measured all of them."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.core.logical import counts, logical_key, logical_requests
from pipeline.core.record import RequestRecord, build_record
from pipeline.spec.slo import SLOSpec
from tests.factories import completed, finished, received

SPEC = SLOSpec.model_validate({
    "apiVersion": "tailguard/v1", "kind": "SLOSpec",
    "slos": [
        {"name": "ttfb", "boundary": "gateway_ttfb_ms", "threshold_ms": 1000, "objective": 0.9},
        {"name": "queue", "boundary": "queue_ms", "threshold_ms": 50, "objective": 0.9},
    ],
})  # fmt: skip

# One attempt: (request id, gateway host, start ms, client_attempt, logical id, outcome,
# first byte ms). A refused attempt never reaches the engine (gateway-only record).
Attempt = tuple[str, str, float, int, str | None, str, float]


def _record(a: Attempt) -> RequestRecord:
    rid, host, t_ms, k, lid, outcome, ttfb = a
    rcv = received(rid, t_ms).model_copy(
        update={"host": host, "client_attempt": k, "logical_request_id": lid}
    )
    status = {"ok": 200, "rejected": 429, "error": 502}[outcome]
    cpl = completed(rid, t_ms + ttfb + 10, total_ms=ttfb + 10, ttfb_ms=ttfb, outcome=outcome,
                    http_status=status).model_copy(update={"host": host})  # fmt: skip
    fin = finished(rid, t_ms + ttfb + 5) if outcome == "ok" else None
    return build_record(rid, rcv, cpl, fin)


# (attempts, logical requests, never served, from_first, final_only,
#  ttfb (total, good), first byte the client saw of the first logical request)
CASES: list[tuple[str, list[Attempt], int, int, int, int, tuple[int, int], float | None]] = [
    (
        "served after one retry, one gateway: 2 s of waiting make it late",
        [("a", "gw-0", 0, 0, None, "rejected", 5), ("a~retry1", "gw-0", 2000, 1, "a", "ok", 300)],
        1,
        0,
        1,
        0,
        (1, 0),
        2300.0,
    ),
    (
        "served after one quick retry: good from the first attempt",
        [("a", "gw-0", 0, 0, None, "rejected", 5), ("a~retry1", "gw-0", 400, 1, "a", "ok", 300)],
        1,
        0,
        1,
        0,
        (1, 1),
        700.0,
    ),
    (
        "never served: three refusals",
        [
            ("k1", "gw-0", 0, 0, "K", "rejected", 5),
            ("k2", "gw-0", 1000, 1, "K", "rejected", 5),
            ("k3", "gw-0", 3000, 2, "K", "rejected", 5),
        ],
        1,
        1,
        1,
        0,
        (1, 0),
        None,
    ),
    (
        "different gateways: the final attempt's own latency, counted as such",
        [("b1", "gw-0", 0, 0, "B", "rejected", 5), ("b2", "gw-1", 2000, 1, "B", "ok", 300)],
        1,
        0,
        0,
        1,
        (1, 1),
        300.0,
    ),
    (
        "no logical id: each attempt alone (per attempt = per request)",
        [("c1", "gw-0", 0, 0, None, "rejected", 5), ("c2", "gw-0", 2000, 1, None, "ok", 300)],
        2,
        1,
        0,
        0,
        (2, 1),
        5.0,
    ),
    ("one attempt, served", [("d", "gw-0", 0, 0, None, "ok", 300)], 1, 0, 0, 0, (1, 1), 300.0),
    (
        "failed after a served-looking count: the highest client_attempt is final",
        [("e~retry1", "gw-0", 900, 1, "e", "error", 50), ("e", "gw-0", 0, 0, None, "rejected", 5)],
        1,
        1,
        1,
        0,
        (1, 0),
        None,
    ),
    (
        "an idempotency key without a retry count: attempts ordered by start",
        [("f2", "gw-0", 500, 0, "F", "ok", 100), ("f1", "gw-0", 0, 0, "F", "rejected", 5)],
        1,
        0,
        1,
        0,
        (1, 1),
        600.0,
    ),
]


@pytest.mark.parametrize(
    ("attempts", "n", "never", "from_first", "final_only", "ttfb", "seen"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_logical_counts(  # noqa: PLR0917
    attempts: list[Attempt], n: int, never: int, from_first: int, final_only: int,
    ttfb: tuple[int, int], seen: float | None,
) -> None:  # fmt: skip
    records = [_record(a) for a in attempts]
    out: dict[str, Any] = counts(SPEC, logical_requests(records))
    assert out["attempts"] == len(attempts)
    assert out["requests"] == n
    assert out["never_served"] == never
    assert out["latency"] == {"from_first": from_first, "final_only": final_only}
    assert (out["slos"]["ttfb"]["total"], out["slos"]["ttfb"]["good"]) == ttfb
    first = logical_requests(records)[0]
    if seen is not None:
        assert first.record.gateway_ttfb_ms == pytest.approx(seen)
        # engine boundaries are the final attempt's own
        assert first.record.queue_ms == first.final.queue_ms
    assert first.record.ts_unix_ns == min(r.ts_unix_ns for r in first.attempts)


def test_the_key_is_the_logical_id_else_the_request_id() -> None:
    a = _record(("x", "gw-0", 0, 0, None, "ok", 1))
    b = _record(("x~retry1", "gw-0", 0, 1, "x", "ok", 1))
    assert logical_key(a) == logical_key(b) == "x"
