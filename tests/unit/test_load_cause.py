"""Load attribution as pure functions (``pipeline.core.load_cause``): which SLOs cover a
model, the queue cut-offs they give, and when a fast burn is load-caused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pipeline.core.load_cause import SLOCoverage, attribute_burn, not_load_caused
from pipeline.spec.slo import SLO, Filter, SLOSpec

# Priority 0's TTFT, queue-inclusive, 1 s at 99 %; decode speed (not queue-inclusive);
# a priority-1 whole-response SLO for one model only.
TTFT = SLO(
    name="ttft", boundary="gateway_ttfb_ms", threshold_ms=1_000.0, objective=0.99,
    filter=Filter(priority=[0]),
)  # fmt: skip
TPOT = SLO(name="tpot", boundary="tpot_ms", threshold_ms=50.0, objective=0.99)
P1_LLAMA = SLO(
    name="p1-llama", boundary="gateway_total_ms", threshold_ms=4_000.0, objective=0.95,
    filter=Filter(model=["llama"], priority=[1]),
)  # fmt: skip
SPEC = SLOSpec.model_validate(
    {"apiVersion": "tailguard/v1", "kind": "SLOSpec", "slos": [TTFT, TPOT, P1_LLAMA]}
)


@pytest.mark.parametrize(
    ("model", "covered", "cutoffs"),
    [
        ("llama", ["ttft", "tpot", "p1-llama"], [None, 750.0, 750.0, 750.0]),
        ("qwen", ["ttft", "tpot"], [None, 750.0, 750.0, 750.0]),
    ],
)
def test_coverage_and_queue_cutoffs(
    model: str, covered: list[str], cutoffs: list[float | None]
) -> None:
    cov = SLOCoverage(SPEC)
    assert [s.name for s in cov.covering(model)] == covered
    assert cov.queue_cutoff_ms(model, 0) == 1_000.0
    assert cov.queue_cutoffs_ms(model) == cutoffs
    assert cov.covers("a-blended-tier", model)  # a name no SLO has: a tier, covers all
    assert SLOCoverage(None).queue_cutoffs_ms(model) is None
    assert SLOCoverage(None).covering(model) == []


@dataclass(frozen=True)
class Case:
    name: str
    counts: dict[str, list[float]]  # SLO -> [total, bad, bad queue ms, bad boundary ms]
    p99_queue_ms: float | None = 800.0
    depth_ratio: float | None = None
    wait_ms: float | None = None
    fast: bool = True
    caused: bool = False
    worst: str | None = None  # the SLO of a notice


CASES = [
    # 10 % bad on a 1 % budget: a 10x burn is not fast (14.4x)
    Case("slow-burn", {"ttft": [100, 10, 900, 1_000]}, fast=False),
    # under fast_burn_min_requests: not judged
    Case("too-few", {"ttft": [10, 10, 9_000, 10_000]}, fast=False),
    # 50 % bad, 90 % of their time queued, P99 queue 800 ms >= half of 1 s: load
    Case("queue-heavy", {"ttft": [100, 50, 9_000, 10_000]}, caused=True),
    # the same, but the model's own queue is short now: neither caused nor a notice
    Case("queue-gone", {"ttft": [100, 50, 9_000, 10_000]}, p99_queue_ms=100.0),
    # 50 % bad, 10 % of their time queued: compute, a notice
    Case("compute-heavy", {"ttft": [100, 50, 1_000, 10_000]}, worst="ttft"),
    # a decode-speed SLO burning fast: no queue share measured, so neither caused nor a
    # notice
    Case("decode", {"tpot": [100, 50, 0, 5_000]}),
    # no burn yet, but a whole batch queued and a 2 s wait over the 1 s threshold: load
    Case("queue-full", {}, depth_ratio=1.5, wait_ms=2_000.0, fast=False, caused=True),
    Case("queue-full-short-wait", {}, depth_ratio=1.5, wait_ms=500.0, fast=False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_attribute_burn(case: Case) -> None:
    got = attribute_burn(
        SLOCoverage(SPEC).covering("qwen"), case.counts,
        p99_queue_ms=case.p99_queue_ms, depth_ratio=case.depth_ratio, wait_ms=case.wait_ms,
        fast_burn=14.4, min_requests=20, load_share=0.5,
    )  # fmt: skip
    assert (got.fast, got.caused) == (case.fast, case.caused)
    assert (got.worst[1] if got.worst is not None else None) == case.worst
    ttft: Any = case.counts.get("ttft")
    assert got.queue_share == (ttft[2] / ttft[3] if ttft else None)


def test_the_notice_says_what_the_time_was() -> None:
    text = not_load_caused("qwen", "ttft", 50.0, 0.1)
    assert text == (
        "ttft burning 50x on qwen, not load-caused: 90 % of the bad requests' time was "
        "compute (prefill + decode), 10 % queueing; nothing shed"
    )
