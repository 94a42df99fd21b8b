"""Contradictory events are flagged on the record (issue 12 item 11), and counted."""

from __future__ import annotations

import pytest

from pipeline.contract.codec import encode_event
from pipeline.core.processor import StreamProcessor
from pipeline.core.record import FLAGS, build_record, record_flags
from tests.factories import completed, finished, received


@pytest.mark.parametrize(
    ("durations", "want"),
    [
        # (gateway total, gateway ttfb, engine e2e, inference, queue)
        ((100.0, 20.0, 88.0, 78.0, 10.0), ()),
        ((100.0, 100.0, 100.0, 100.0, 0.0), ()),  # equality is no contradiction
        ((100.0, 120.0, 88.0, 78.0, 10.0), ("ttfb_gt_total",)),
        ((100.0, 20.0, 70.0, 78.0, 10.0), ("e2e_lt_inference",)),
        ((100.0, 20.0, 8.0, 5.0, 10.0), ("e2e_lt_queue",)),
        ((80.0, 20.0, 88.0, 78.0, 10.0), ("negative_gateway_overhead",)),
        ((None, None, 70.0, 78.0, None), ("e2e_lt_inference",)),  # engine side alone
        ((100.0, None, None, None, None), ()),  # no first byte: nothing to compare
    ],
)
def test_flags(durations: tuple[float | None, ...], want: tuple[str, ...]) -> None:
    got = record_flags(*durations)
    assert got == want
    assert set(got) <= set(FLAGS)


def test_a_record_is_flagged_kept_and_counted() -> None:
    bad_total = completed("r1", total_ms=50.0, ttfb_ms=60.0)  # ttfb > total, total < e2e
    rec = build_record("r1", received("r1"), bad_total, finished("r1"))
    assert rec.flags == ("ttfb_gt_total", "negative_gateway_overhead")
    assert rec.gateway_total_ms == 50.0  # kept as reported
    proc = StreamProcessor("t")
    fin = finished("r2")
    events = [received("r1"), bad_total, finished("r1"), received("r2"), completed("r2"),
              fin.model_copy(update={"e2e_ms": fin.inference_ms - 1})]  # fmt: skip
    out = proc.process([(0, i, encode_event(e)) for i, e in enumerate(events)], wall_ms=None)
    recs = out.records + proc.drain().records
    assert {r.request_id: r.flags for r in recs} == {
        "r1": ("ttfb_gt_total", "negative_gateway_overhead"),
        "r2": ("e2e_lt_inference",),
    }
    assert proc.counters.flagged == 2
    assert proc.counters.by_flag == {
        "ttfb_gt_total": 1, "negative_gateway_overhead": 1, "e2e_lt_inference": 1,
    }  # fmt: skip
