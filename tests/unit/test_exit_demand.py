"""Issue 47 item 4, "exits on demand before admission": the demand ratio a level's exit
reads is arrivals before admission over what the engines have *shown* they serve, and
nothing the level's own admission does raises that denominator.

Before: ``proven_rps`` was the admission rate whenever it grew with the queue short, and
the capacity's floor the most served in any 10 s window with nothing queued; admission
keeps the queue short, so both rose while arrivals stayed x4 (on the shared trace at
x4, rate-scale 0.5, no retries, the 70b's demand ratio fell to 0.83 mid-episode).
"""

from __future__ import annotations

import pytest

from pipeline.core.admission import AdmissionControl, ModelLoad

DEMAND_RPS = 12.0  # x1.5 the engines' capacity (8/s), still arriving


def _load(served: float, waiting: int, minute: float | None = None) -> ModelLoad:
    return ModelLoad(
        served_rps=served, waiting=waiting, batch=16, demand_rps=DEMAND_RPS,
        served_minute_rps=minute,
    )  # fmt: skip


SATURATED = _load(8.0, 16, 8.0)  # a whole batch queued: capacity 8/s
SHORT = _load(8.0, 0, 8.0)  # admission keeps the queue empty; 8/s served

# (steps: (load, admission active)) -> the demand ratio the exit reads after them
TABLE = [
    pytest.param([(SATURATED, True)], 1.5, id="entry: demand over capacity"),
    pytest.param(
        [(SATURATED, True)] + [(SHORT, True)] * 20,
        1.5,  # before: the rate grew to 15.2/s -> 0.79, under the exit's 0.9
        id="admission rate grows with the queue short: not proven",
    ),
    pytest.param(
        [(SATURATED, True), (_load(13.0, 0, 8.0), True)],
        1.5,  # before: 13/s in one window raised the floor -> 0.92
        id="one noisy 10 s window with nothing queued proves nothing",
    ),
    pytest.param(
        [(SATURATED, True), (_load(13.0, 0, 10.0), True)],
        1.2,
        id="served 10/s over a minute with nothing queued: shown, counts",
    ),
    pytest.param(
        [(SATURATED, True), (_load(4.0, 0, 4.0), False)],
        1.5,
        id="less traffic after the level says nothing about capacity",
    ),
]


@pytest.mark.parametrize(("steps", "ratio"), TABLE)
def test_exit_demand_ratio(steps: list[tuple[ModelLoad, bool]], ratio: float) -> None:
    ac = AdmissionControl()
    for load, active in steps:
        ac.observe("m", load)
        ac.step("m", load, active=active)
    proven = ac.proven_rps("m")
    assert proven is not None
    assert DEMAND_RPS / proven == pytest.approx(ratio)


# --- retries count once (the demand's numerator); answers counted beside --------------

RETRY_CASES = [
    # (client_attempt, outcome) of each record of one model's window
    #   -> (records, retries, answered, demand)
    pytest.param(((0, "ok"), (0, "ok"), (0, "ok")), (3, 0, 3, 3), id="first tries only"),
    pytest.param(
        ((0, "rejected"), (1, "rejected"), (2, "ok")),
        (3, 2, 1, 1),
        id="a request and its two retries: once, answered once",
    ),
    pytest.param(
        ((1, "ok"), (1, "error"), (0, "client_abort"), (0, "timeout")),
        (4, 2, 1, 2),
        id="retries of requests first tried earlier; only ok is answered",
    ),
]


@pytest.mark.parametrize(("attempts", "want"), RETRY_CASES)
def test_demand_counts_a_request_once_whatever_its_retries(
    attempts: tuple[tuple[int, str], ...], want: tuple[int, int, int, int]
) -> None:
    """The windows count the clients' retries and the answered records beside the
    records; the summary carries them over the wire (v2, "retries" and "answered",
    omitted when 0); the demand leaves the retries out."""
    import msgspec

    from pipeline.contract.summary import decode_summary, encode_summary
    from pipeline.core.control import demand_count
    from pipeline.core.record import build_record
    from pipeline.core.summary import summarize
    from pipeline.core.windows import WindowAggregator, WindowConfig
    from tests.factories import completed, finished, received

    agg = WindowAggregator(0, WindowConfig(size_ms=10_000, grace_ms=0))
    for i, (k, outcome) in enumerate(attempts):
        rid = f"r{i}"
        r = build_record(rid, received(rid), completed(rid), finished(rid))
        r = msgspec.structs.replace(
            r, end_unix_ns=(1_000 + i) * 1_000_000, model="m", client_attempt=k, outcome=outcome
        )
        agg.add(r, i)
    (closed,) = agg.close(20_000)
    got = decode_summary(encode_summary(summarize(closed))).models["m"]
    assert (got.records, got.retries, got.answered, demand_count(got)) == want
