"""The controller's first-token prediction (issue 52): pipeline/core/admission.py's
ttft_prediction and when a directive is re-issued for it (pipeline/core/control.py)."""

from __future__ import annotations

import pytest

from pipeline.core.admission import ModelLoad, ttft_prediction
from pipeline.core.control import _ttft_moved


def _load(waiting: int, served_rps: float = 4.0) -> ModelLoad:
    return ModelLoad(served_rps=served_rps, waiting=waiting, batch=8, demand_rps=10.0)


@pytest.mark.parametrize(
    ("load", "capacity", "medians", "want"),
    [
        # 20 waiting at a capacity of 10/s: 2 s queued; 30 + 5 ms unqueued
        (_load(20), 10.0, {"prefill_ms": 30.0, "gateway_overhead_ms": 5.0},
         {"ttft_queue_ms": 2000.0, "ttft_service_ms": 35.0}),
        # no capacity measured yet: what the engines served
        (_load(8, 4.0), None, {"prefill_ms": 30.0},
         {"ttft_queue_ms": 2000.0, "ttft_service_ms": 30.0}),
        (_load(0), 10.0, {"prefill_ms": 12.5}, {"ttft_queue_ms": 0.0, "ttft_service_ms": 12.5}),
        # unknown: no prefill measured, or nothing served and no capacity
        (_load(5), 10.0, {"gateway_overhead_ms": 5.0}, {}),
        (_load(5, 0.0), None, {"prefill_ms": 30.0}, {}),
    ],
)  # fmt: skip
def test_ttft_prediction(
    load: ModelLoad, capacity: float | None, medians: dict[str, float], want: dict[str, float]
) -> None:
    assert ttft_prediction(load, capacity, medians) == want


@pytest.mark.parametrize(
    ("before", "now", "moved"),
    [
        (None, None, False),
        (None, 100.0, True),
        (100.0, None, True),
        (1000.0, 1200.0, False),  # 20 %
        (1000.0, 1260.0, True),  # 26 %
        (100.0, 190.0, False),  # under 100 ms
        (100.0, 201.0, True),
    ],
)
def test_a_directive_is_reissued_when_the_prediction_moves(
    before: float | None, now: float | None, moved: bool
) -> None:
    assert _ttft_moved(before, now) is moved
